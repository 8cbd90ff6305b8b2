"""Infrastructure failures are masked out of training groups (sdk/train/masking.py), over a
real server on loopback: a void member is resampled or drops its group, never a 0 in it, and
each step's report counts them by kind; an agent's failure is trained on as its 0."""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the `train` extra (torch)")

import uvicorn  # noqa: E402
from conftest import make_settings  # noqa: E402

from palaestra.envs.base import Assessment, EpisodeContext  # noqa: E402
from palaestra.envs.letters import LettersFamily  # noqa: E402
from palaestra.sandbox import AgentFault  # noqa: E402
from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy  # noqa: E402
from palaestra.sdk.train.backends import HFBackend  # noqa: E402
from palaestra.sdk.train.collector import CollectorConfig, RolloutCollector  # noqa: E402
from palaestra.sdk.train.grpo import GRPOConfig  # noqa: E402
from palaestra.sdk.train.letters_demo import LettersFormat, tiny_model  # noqa: E402
from palaestra.sdk.train.trainer import Trainer  # noqa: E402
from palaestra.sdk.train.types import SamplingParams  # noqa: E402
from palaestra.server.app import create_app  # noqa: E402
from palaestra.server.config import REPO_PACKS  # noqa: E402
from palaestra.server.runtime import build_manager  # noqa: E402
from tests.sdk.train.test_train_collector import TASKS, TOK, FaultyLetters  # noqa: E402


class MissingAnswer(LettersFamily):
    """Letters whose verifier always finds the agent's answer missing (its fault: a 0)."""

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        raise AgentFault("no answer file", "missing_file")


@asynccontextmanager
async def loopback(tmp_path: Path, family: LettersFamily) -> AsyncIterator[AsyncHTTPClient]:
    """The letters pack served by uvicorn on 127.0.0.1 with `family` as its family."""
    manager = build_manager(
        make_settings(data_dir=tmp_path / "data", packs_dirs=[REPO_PACKS / "letters"])
    )
    manager.families.add(family)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(manager.settings, manager=manager), log_config=None)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    client: AsyncHTTPClient | None = None
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        token = (manager.settings.data_dir / "admin.token").read_text().strip()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        client = AsyncHTTPClient(url, token=token, retry=RetryPolicy(attempts=1))
        yield client
    finally:
        if client is not None:
            await client.aclose()
        server.should_exit = True
        await task
        sock.close()


def collector(client: Any, backend: HFBackend, **config: Any) -> RolloutCollector:
    config.setdefault("max_turns", 4)
    config.setdefault("sampling", SamplingParams(max_tokens=1))
    return RolloutCollector(client, backend, LettersFormat(TOK), TASKS, CollectorConfig(**config))


@pytest.fixture
def backend() -> HFBackend:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return HFBackend(tiny_model(TOK.vocab_size))


async def test_void_members_are_resampled_never_scored_and_counted(
    tmp_path: Path, backend: HFBackend
) -> None:
    family = FaultyLetters(void_every=3)
    async with loopback(tmp_path, family) as client:
        rollouts = collector(client, backend, group_size=4, max_refills=12)
        groups = await rollouts.collect(3)
        await rollouts.drain()
        counts = rollouts.take_step_counts()
    assert len(groups) == 3 and all(len(g.trajectories) == 4 for g in groups)
    trained = {t.episode_id for g in groups for t in g.trajectories}
    assert family.voided and not trained & family.voided  # never a 0 in a group
    voids = len(family.voided)
    assert counts["infra_failures"] == voids == counts["infra:env_crashed"]
    assert counts["masked"] == voids and "groups_dropped_infra" not in counts
    assert rollouts.stats["refills"] == voids
    assert rollouts.take_step_counts() == {"infra_failures": 0, "masked": 0}  # taken once


async def test_drop_group_drops_the_whole_group_of_a_void_member(
    tmp_path: Path, backend: HFBackend
) -> None:
    family = FaultyLetters(void_every=5)
    async with loopback(tmp_path, family) as client:
        config = {"group_size": 4, "on_infrastructure_failure": "drop_group", "concurrency": 4}
        rollouts = collector(client, backend, **config)
        groups = await rollouts.collect(4)
        await rollouts.drain()
        counts = rollouts.take_step_counts()
    dropped = 4 - len(groups)
    assert dropped >= 1 and counts["groups_dropped_infra"] == dropped
    assert rollouts.stats["refills"] == 0  # dropped, never resampled
    assert counts["infra_failures"] >= dropped and counts["infra:env_crashed"] >= dropped
    assert counts["masked"] >= counts["infra_failures"]
    trained = {t.episode_id for g in groups for t in g.trajectories}
    assert not trained & family.voided
    assert all(len(g.trajectories) == 4 for g in groups)


def test_the_policy_is_checked() -> None:
    with pytest.raises(ValueError, match="drop_group"):
        CollectorConfig(on_infrastructure_failure="zero")  # type: ignore[arg-type]


async def test_agent_failures_are_trained_as_zero_and_steps_report_both(
    tmp_path: Path,
) -> None:
    """A trainer's step reports the failures since the last step: agents' 0s (trained on)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_model(TOK.vocab_size)
    generator = HFBackend(copy.deepcopy(model))
    async with loopback(tmp_path, MissingAnswer()) as client:
        rollouts = collector(client, generator, group_size=2, max_turns=8)
        trainer = Trainer(
            model,
            torch.optim.Adam(model.parameters(), lr=1e-3),
            rollouts,
            generator,
            GRPOConfig(drop_zero_variance=False),
            groups_per_step=2,
        )
        reports = await trainer.train(2)
        await rollouts.drain()
    await generator.aclose()
    assert len(reports) == 2
    for report in reports:
        assert report.trajectories == 4 and report.mean_reward == 0.0  # trained on
        failures = report.failures
        assert failures["infra_failures"] == 0 and failures["masked"] == 0
        # every episode was verified: the agent's no_answer each
        assert failures["agent_failures"] == failures["agent:no_answer"] == 4
