"""GRPO: group-relative advantages and a clipped-ratio, token-mean policy loss (torch).

- advantage = reward − group mean (optionally ÷ group std); a group whose rewards are all
  equal carries no signal: it is counted, and by default left out of the update.
- loss = −Σ mask · min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) / Σ mask over the whole batch
  (token-mean: the masks are in the numerator and the denominator), where ρ is the ratio
  of the trainer's probability of a sampled token to the generator's.
- optional truncated importance sampling (TIS): with the trainer's logprobs under the
  weights that generated (`old_logprobs`), ρ is taken against those and each token is
  weighted by min(π_old / π_generator, cap): it corrects for a generator whose numerics
  differ from the trainer's (vLLM kernels, quantised weights) without letting rare
  tokens blow up the gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from palaestra.sdk.train.types import Group, Trajectory


@dataclass(frozen=True)
class GRPOConfig:
    clip_low: float = 0.2
    clip_high: float = 0.2
    normalize_std: bool = False
    drop_zero_variance: bool = True
    tis_cap: float | None = None
    temperature: float = 1.0


def group_advantages(
    groups: list[Group], config: GRPOConfig = GRPOConfig()
) -> tuple[list[Trajectory], int]:
    """Set each trajectory's advantage; (trajectories for the update, zero-variance groups)."""
    kept: list[Trajectory] = []
    zero = 0
    for group in groups:
        rewards = group.rewards
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        flat = std < 1e-8
        zero += flat
        for traj in group.trajectories:
            advantage = 0.0 if flat else traj.reward - mean
            if config.normalize_std and not flat:
                advantage /= std + 1e-6
            traj.advantage = advantage
        if not (flat and config.drop_zero_variance):
            kept.extend(group.trajectories)
    return kept, zero


@dataclass
class TrainBatch:
    """Right-padded tensors; index t of the `[B, L-1]` tensors is about token t + 1."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L-1] float: 1 on sampled tokens
    gen_logprobs: torch.Tensor  # [B, L-1]
    advantages: torch.Tensor  # [B]

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            self.gen_logprobs.to(device),
            self.advantages.to(device),
        )


def make_batch(trajectories: list[Trajectory], pad_token_id: int = 0) -> TrainBatch:
    width = max(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories)
    size = len(trajectories)
    ids = torch.full((size, width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((size, width), dtype=torch.long)
    mask = torch.zeros((size, width - 1))
    gen = torch.zeros((size, width - 1))
    for row, t in enumerate(trajectories):
        t.check()
        seq = t.prompt_ids + t.completion_ids
        ids[row, : len(seq)] = torch.tensor(seq)
        attn[row, : len(seq)] = 1
        start = len(t.prompt_ids) - 1  # position that predicts the first completion token
        stop = start + len(t.completion_ids)
        mask[row, start:stop] = torch.tensor(t.loss_mask, dtype=torch.float)
        gen[row, start:stop] = torch.tensor(t.logprobs)
    advantages = torch.tensor([t.advantage for t in trajectories])
    return TrainBatch(ids, attn, mask, gen, advantages)


def token_logprobs(model: Any, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """log π(token t+1 | tokens ≤ t) for every position, `[B, L-1]` (as the generator
    computed them: logits ÷ temperature)."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logits = out.logits[:, :-1, :].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0]


def grpo_loss(
    logprobs: torch.Tensor,
    batch: TrainBatch,
    config: GRPOConfig = GRPOConfig(),
    old_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy loss, token-mean over sampled tokens; and its diagnostics."""
    mask = batch.loss_mask
    behaviour = batch.gen_logprobs
    weight = torch.ones_like(mask)
    if config.tis_cap is not None:
        if old_logprobs is None:
            raise ValueError("tis_cap needs old_logprobs: the trainer's, at generation weights")
        weight = torch.exp(old_logprobs - batch.gen_logprobs).clamp(max=config.tis_cap).detach()
        behaviour = old_logprobs.detach()
    # Environment tokens: masked, and their (meaningless) ratios zeroed before exp.
    log_ratio = (logprobs - behaviour) * mask
    ratio = torch.exp(log_ratio)
    adv = batch.advantages[:, None]
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    tokens = mask.sum()
    loss = -(surrogate * weight * mask).sum() / tokens.clamp(min=1)
    with torch.no_grad():
        was_clipped = ((ratio - clipped).abs() > 1e-9).float() * mask
        stats = {
            "tokens": float(tokens),
            "clip_fraction": float(was_clipped.sum() / tokens.clamp(min=1)),
            "mean_ratio": float((ratio * mask).sum() / tokens.clamp(min=1)),
            "max_abs_logprob_diff": float(((logprobs - batch.gen_logprobs).abs() * mask).max())
            if tokens > 0
            else 0.0,
        }
    return loss, stats
