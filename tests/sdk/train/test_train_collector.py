"""The rollout collector under faults: void, slow, lost, 429 — counted, refilled, never
trained on; over-sampled groups do not wait on their slowest member; async training keeps
staleness bounded."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the `train` extra (torch)")

from conftest import make_settings  # noqa: E402

from palaestra.envs.base import EpisodeContext, StepOutcome, Tool, ToolArgs  # noqa: E402
from palaestra.envs.letters import LettersFamily  # noqa: E402
from palaestra.envs.letters.family import LettersState  # noqa: E402
from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy  # noqa: E402
from palaestra.sdk.models import Observation  # noqa: E402
from palaestra.sdk.train.backends import HFBackend  # noqa: E402
from palaestra.sdk.train.collector import CollectorConfig, RolloutCollector  # noqa: E402
from palaestra.sdk.train.grpo import GRPOConfig  # noqa: E402
from palaestra.sdk.train.letters_demo import VOCAB, LettersFormat, tiny_model  # noqa: E402
from palaestra.sdk.train.tokenizers import CharTokenizer  # noqa: E402
from palaestra.sdk.train.trainer import Trainer  # noqa: E402
from palaestra.sdk.train.types import SamplingParams  # noqa: E402
from palaestra.server.inprocess import AsyncInProcessClient  # noqa: E402
from palaestra.server.manager import EpisodeManager  # noqa: E402
from palaestra.server.runtime import build_manager  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

TOK = CharTokenizer(VOCAB)
TASKS = [f"palaestra/letters:next-{c}" for c in "abcdefgh"]


class FaultyState(LettersState):
    fault: str | None = None  # "void" or "slow": what this episode's steps do


class FaultyLetters(LettersFamily):
    """Letters whose n-th episode voids (crashes in step) or hangs, by n modulo a period."""

    state_model = FaultyState

    def __init__(self, void_every: int = 0, slow_every: int = 0, slow_s: float = 60.0) -> None:
        super().__init__()
        self.void_every, self.slow_every, self.slow_s = void_every, slow_every, slow_s
        self.count = 0
        self.voided: set[str] = set()
        self.slowed: set[str] = set()

    async def reset(self, ctx: EpisodeContext) -> Observation:
        self.count += 1
        if self.void_every and self.count % self.void_every == 0:
            ctx.state.fault = "void"
            self.voided.add(ctx.episode_id)
        elif self.slow_every and self.count % self.slow_every == 0:
            ctx.state.fault = "slow"
            self.slowed.add(ctx.episode_id)
        return await super().reset(ctx)

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        fault = ctx.state.fault
        if fault == "void":
            raise RuntimeError("injected environment crash")
        if fault == "slow":
            await asyncio.sleep(self.slow_s)
        return await super().step(ctx, tool, args)


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    built = build_manager(make_settings(data_dir=tmp_path / "data", max_episodes=3))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


@pytest.fixture
def backend() -> Iterator[HFBackend]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield HFBackend(tiny_model(TOK.vocab_size))


def _collector(client: Any, backend: HFBackend, **config: Any) -> RolloutCollector:
    config.setdefault("max_turns", 4)
    config.setdefault("sampling", SamplingParams(max_tokens=1))
    return RolloutCollector(client, backend, LettersFormat(TOK), TASKS, CollectorConfig(**config))


@pytest.mark.parametrize("batch_routes", [True, False])
async def test_void_and_slow_episodes_are_dropped_counted_and_refilled(
    tmp_path: Path, backend: HFBackend, batch_routes: bool
) -> None:
    manager = build_manager(make_settings(data_dir=tmp_path / "data"))
    family = FaultyLetters(void_every=3, slow_every=5, slow_s=2.0)
    manager.families.add(family)
    await manager.start()
    try:
        collector = _collector(
            AsyncInProcessClient(manager),
            backend,
            group_size=4,
            max_refills=12,
            turn_timeout_s=0.5,
            batch_routes=batch_routes,
        )
        groups = await collector.collect(4)
        stats = collector.stats
        assert len(groups) == 4 and stats["groups"] == 4
        assert stats["broken:void"] > 0 and stats["broken:turn_timeout"] > 0
        assert stats["refills"] == stats["broken:void"] + stats["broken:turn_timeout"]
        trained = {t.episode_id for g in groups for t in g.trajectories}
        assert len(trained) == 16
        assert not trained & family.voided and not trained & family.slowed
        for group in groups:
            assert {(t.task, t.seed) for t in group.trajectories} == {(group.task, group.seed)}
            assert len({t.sample_id for t in group.trajectories}) == 4
        # The timed-out episodes were ended (closed in the background), not left running: the
        # close waits for the episode's lock, so a detached step that ends it may land first.
        await collector.drain()
        for episode in family.slowed:
            assert (await manager.state(episode)).status.value in ("closed", "done")
    finally:
        await manager.shutdown()


async def test_oversampled_group_does_not_wait_for_its_slowest(
    tmp_path: Path, backend: HFBackend
) -> None:
    manager = build_manager(make_settings(data_dir=tmp_path / "data"))
    family = FaultyLetters(slow_every=3, slow_s=5.0)  # far slower than the rest
    manager.families.add(family)
    await manager.start()
    try:
        collector = _collector(AsyncInProcessClient(manager), backend, group_size=4, oversample=2)
        groups = await collector.collect(2)
        assert len(groups) == 2
        assert collector.stats["stragglers_cancelled"] >= 2
        trained = {t.episode_id for g in groups for t in g.trajectories}
        assert not trained & family.slowed
        await collector.drain()
        for episode in family.slowed:
            # Ended, never left running: the close waits for the episode's lock, so a
            # straggler's detached step that ends the episode on its own may land first.
            assert (await manager.state(episode)).status.value in ("closed", "done")
    finally:
        await manager.shutdown()


async def test_lost_episodes_are_refilled(manager: EpisodeManager, backend: HFBackend) -> None:
    """Episodes closed behind the collector's back (expired, reaped) answer 409: lost."""
    inner = AsyncInProcessClient(manager)
    lost: list[str] = []

    class Losing:
        """The in-process client, except that every 10th step's episode is closed first."""

        def __init__(self) -> None:
            self.n = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        async def step(self, episode_id: str, action: Any, **kw: Any) -> Any:
            self.n += 1
            if self.n % 10 == 0:
                lost.append(episode_id)
                await inner.close(episode_id)
            return await inner.step(episode_id, action, **kw)

    collector = _collector(
        Losing(), backend, group_size=3, max_refills=12, batch_routes=False, concurrency=3
    )
    groups = await collector.collect(3)
    assert len(groups) == 3, collector.stats
    assert collector.stats["broken:lost"] == len(lost) > 0
    assert not {t.episode_id for g in groups for t in g.trajectories} & set(lost)


async def test_capacity_429_backs_off_in_process(
    manager: EpisodeManager, backend: HFBackend
) -> None:
    collector = _collector(AsyncInProcessClient(manager), backend, group_size=4, concurrency=8)
    groups = await collector.collect(2)
    assert len(groups) == 2 and collector.stats["backoff:capacity"] > 0


def test_capacity_429_backs_off_over_http(tmp_path: Path, backend: HFBackend) -> None:
    server = ServerProcess(tmp_path / "srv", args=["--max-episodes", "3"]).start()
    try:

        async def go() -> tuple[int, Any]:
            client = AsyncHTTPClient(
                server.url, token=server.token, retry=RetryPolicy(attempts=1), max_connections=8
            )
            async with client:
                collector = _collector(client, backend, group_size=4, concurrency=8)
                groups = await collector.collect(3)
                assert collector._steps is not None and collector._steps.calls > 0
                return len(groups), collector.stats

        n, stats = asyncio.run(go())
        assert n == 3 and stats["groups"] == 3
        assert stats["backoff:capacity"] > 0 and stats["episodes_ok"] == 12
    finally:
        server.stop()


def test_backend_that_retokenizes_is_refused(backend: HFBackend) -> None:
    chat = copy.copy(backend)
    chat.token_exact = False
    with pytest.raises(ValueError, match="token_exact"):
        _collector(object(), chat)


async def test_async_training_keeps_staleness_bounded(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    manager = build_manager(make_settings(data_dir=tmp_path / "data"))
    await manager.start()
    model = tiny_model(TOK.vocab_size)
    generator = HFBackend(copy.deepcopy(model))
    try:
        collector = _collector(AsyncInProcessClient(manager), generator, group_size=4)
        trainer = Trainer(
            model,
            torch.optim.Adam(model.parameters(), lr=1e-3),
            collector,
            generator,
            GRPOConfig(drop_zero_variance=False),
            groups_per_step=2,
        )
        reports = await trainer.train_async(4, max_staleness=1)
        assert len(reports) == 4
        assert [r.weight_version for r in reports] == [1, 2, 3, 4]
        assert all(r.max_staleness <= 1 for r in reports)
        assert generator.weight_version == 4
        for name, value in model.state_dict().items():
            assert torch.equal(value, generator.model.state_dict()[name])
        with pytest.raises(ValueError, match="own copy"):
            await Trainer(
                model, trainer.optimizer, collector, HFBackend(model), groups_per_step=1
            ).train_async(1)
    finally:
        await generator.aclose()
        await manager.shutdown()
