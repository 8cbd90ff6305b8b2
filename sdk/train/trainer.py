"""The training loop: collect groups → advantages → one optimiser step → publish weights.

Synchronous mode collects a step's groups with the current weights, then updates
(on-policy). Asynchronous mode keeps the collector running while the trainer updates;
every trajectory records the weight versions that sampled it, and a group whose oldest
version is more than `max_staleness` behind the trainer is dropped (counted), so the
policy never trains on data older than that bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from palaestra.sdk.hack_monitor import HackTally
from palaestra.sdk.train.backends import GenerationBackend, MicroBatcher
from palaestra.sdk.train.collector import GroupCollector
from palaestra.sdk.train.grpo import (
    GRPOConfig,
    group_advantages,
    grpo_loss,
    make_batch,
    token_logprobs,
)
from palaestra.sdk.train.types import Group


@dataclass
class StepReport:
    step: int
    mean_reward: float
    groups: int
    trajectories: int
    zero_variance_groups: int
    loss: float
    tokens: int
    weight_version: int
    max_staleness: int
    collect_s: float
    update_s: float
    generation_s: float
    environment_s: float
    extra: dict[str, float] = field(default_factory=dict)
    # The reward-hack monitor over this step's episodes (`hack_metrics`): the flagged share
    # overall and per domain, and episodes flagged per rule.
    hacks: dict[str, float] = field(default_factory=dict)
    # Failures since the last step (sdk/train/masking.py): `infra_failures` and `masked`
    # (left out of group statistics, never a 0), `agent_failures` (trained on as 0), by kind.
    failures: dict[str, int] = field(default_factory=dict)


RewardHook = Callable[[list[Group]], None]


class Trainer:
    """GRPO on a torch model whose generations come from `backend` (see the module doc).

    `backend` is either the same model object (an `HFBackend` over `model`: its version is
    bumped after each update) or a copy with `update_weights` (it gets the new state dict).
    `reward_hook` may rewrite rewards before advantages (the shuffled-reward control)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        collector: GroupCollector,
        backend: GenerationBackend,
        config: GRPOConfig = GRPOConfig(),
        *,
        groups_per_step: int = 8,
        pad_token_id: int = 0,
        max_grad_norm: float | None = 1.0,
        reward_hook: RewardHook | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.collector = collector
        self.backend = backend
        self.config = config
        self.groups_per_step = groups_per_step
        self.pad_token_id = pad_token_id
        self.max_grad_norm = max_grad_norm
        self.reward_hook = reward_hook
        self.version = backend.weight_version
        self.history: list[StepReport] = []
        self.stale_groups_dropped = 0

    async def train(
        self,
        steps: int,
        on_step: Callable[[StepReport], None] | None = None,
        stop: Callable[[list[StepReport]], bool] | None = None,
    ) -> list[StepReport]:
        """Synchronous GRPO: each step collects with the current weights, then updates;
        at most `steps` steps, fewer if `stop(history)` says so."""
        for _ in range(steps):
            if stop is not None and stop(self.history):
                break
            started = time.perf_counter()
            groups = await self.collector.collect(self.groups_per_step)
            collected = time.perf_counter()
            report = await self._update(groups, collected - started)
            if on_step is not None:
                on_step(report)
        return self.history

    async def train_async(
        self,
        steps: int,
        max_staleness: int = 1,
        on_step: Callable[[StepReport], None] | None = None,
    ) -> list[StepReport]:
        """Collection overlaps the update; groups more than `max_staleness` versions old
        are dropped. Needs a backend with its own weights (`update_weights`)."""
        if getattr(self.backend, "model", None) is self.model:
            raise ValueError("async training needs a backend with its own copy of the weights")
        stream = self.collector.stream(self.groups_per_step * (max_staleness + 1))
        pending: list[Group] = []
        started = time.perf_counter()
        try:
            async for group in stream:
                if self.version - group_version(group) > max_staleness:
                    self.stale_groups_dropped += 1
                    continue
                pending.append(group)
                if len(pending) < self.groups_per_step:
                    continue
                batch, pending = pending, []
                report = await self._update(batch, time.perf_counter() - started)
                started = time.perf_counter()
                if on_step is not None:
                    on_step(report)
                if len(self.history) >= steps:
                    break
        finally:
            await stream.aclose()
        return self.history

    async def _update(self, groups: list[Group], collect_s: float) -> StepReport:
        started = time.perf_counter()
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = [t.reward for t in trajectories]
        if self.reward_hook is not None:
            self.reward_hook(groups)
        kept, zero = group_advantages(groups, self.config)
        loss_value, tokens = 0.0, 0
        extra: dict[str, float] = {}
        if kept:
            loss_value, tokens, extra = await asyncio.to_thread(self._optimise, kept)
            self.version += 1
            await self._publish()
        staleness = max((self.version - 1 - group_version(g) for g in groups), default=0)
        report = StepReport(
            step=len(self.history),
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            groups=len(groups),
            trajectories=len(trajectories),
            zero_variance_groups=zero,
            loss=loss_value,
            tokens=tokens,
            weight_version=self.version,
            max_staleness=max(staleness, 0),
            collect_s=collect_s,
            update_s=time.perf_counter() - started,
            generation_s=sum(t.generation_s for t in trajectories),
            environment_s=sum(t.environment_s for t in trajectories),
            extra=extra,
            hacks=hack_metrics(groups),
            failures=self.collector.take_step_counts(),
        )
        self.history.append(report)
        return report

    def _optimise(self, kept: list[Any]) -> tuple[float, int, dict[str, float]]:
        device = next(self.model.parameters()).device
        batch = make_batch(kept, self.pad_token_id).to(device)
        lock = self.backend.lock if isinstance(self.backend, MicroBatcher) else None
        if lock is not None and getattr(self.backend, "model", None) is self.model:
            lock.acquire()  # a shared model: no generation while its weights change
        else:
            lock = None
        try:
            old = None
            if self.config.tis_cap is not None:
                with torch.no_grad():
                    old = token_logprobs(self.model, batch, self.config.temperature)
            self.model.train()
            logp = token_logprobs(self.model, batch, self.config.temperature)
            loss, stats = grpo_loss(logp, batch, self.config, old)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if self.max_grad_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                stats["grad_norm"] = float(norm)
            self.optimizer.step()
        finally:
            if lock is not None:
                lock.release()
        return float(loss.detach()), int(stats["tokens"]), stats

    async def _publish(self) -> None:
        if getattr(self.backend, "model", None) is self.model and isinstance(
            self.backend, MicroBatcher
        ):
            self.backend.set_weight_version(self.version)
            return
        update = getattr(self.backend, "update_weights", None)
        if update is None:
            raise TypeError("the backend neither shares the model nor takes update_weights")
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        await update(state, self.version)


def hack_metrics(groups: list[Group]) -> dict[str, float]:
    """`HackTally.metrics()` over the groups' episodes, each counted once (the samples of
    a harness episode share its flags): `hack_flagged_share`, `hack_flagged_share/<domain>`,
    `hack_rule/<rule>`."""
    tally = HackTally()
    seen: set[object] = set()
    for g in groups:
        for k, t in enumerate(g.trajectories):
            key = t.episode_id or (g.group_id, k)
            if key not in seen:
                seen.add(key)
                tally.add(t.domain, t.hack_flags)
    return tally.metrics()


def group_version(group: Group) -> int:
    """The oldest weight version that sampled any token of the group."""
    return min((t.weight_version for t in group.trajectories), default=0)
