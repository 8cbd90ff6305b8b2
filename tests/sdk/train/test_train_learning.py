"""THE LEARNING TEST: a tiny random transformer learns `palaestra/letters` through a real
server on loopback, with the real collector (batch routes) and GRPO; a control whose
rewards are shuffled across each step's trajectories does not improve.

CPU budget: both runs together take about a minute or two on 2 shared cores (torch on one
thread); the learning run stops as soon as the last 5 steps average ≥ 0.8 (at most 150).
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="the learning test needs the `train` extra (torch)")

from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy  # noqa: E402
from palaestra.sdk.train.letters_demo import DemoConfig, run_demo  # noqa: E402
from palaestra.sdk.train.trainer import StepReport  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402
from tests.servers import server_fixture  # noqa: E402

MAX_STEPS = 150
CONTROL_STEPS = 40


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _run(server: ServerProcess, config: DemoConfig, stop_at: float | None) -> list[float]:
    torch.set_num_threads(1)

    def stop(history: list[StepReport]) -> bool:
        if stop_at is None or len(history) < 10:
            return False
        return mean([r.mean_reward for r in history[-5:]]) >= stop_at

    async def go() -> list[float]:
        client = AsyncHTTPClient(
            server.url,
            token=server.token,
            retry=RetryPolicy(attempts=1),
            max_connections=config.concurrency,
        )
        async with client:
            reports = await run_demo(client, config, stop=stop)
        return [r.mean_reward for r in reports]

    return asyncio.run(go())


letters_server = server_fixture("module", packs=["letters"])  # the one pack it plays


@pytest.mark.timeout(900)
def test_tiny_policy_learns_letters(letters_server: ServerProcess) -> None:
    rewards = _run(letters_server, DemoConfig(steps=MAX_STEPS, seed=0), stop_at=0.8)
    first, last = mean(rewards[:5]), mean(rewards[-5:])
    assert len(rewards) <= MAX_STEPS
    assert last >= 0.7, f"last-5 mean reward {last:.3f} after {len(rewards)} steps: {rewards}"
    assert last - first >= 0.4, f"first-5 {first:.3f} → last-5 {last:.3f}: {rewards}"


@pytest.mark.timeout(900)
def test_shuffled_reward_control_does_not_improve(letters_server: ServerProcess) -> None:
    config = DemoConfig(steps=CONTROL_STEPS, seed=0, shuffle_rewards=True)
    rewards = _run(letters_server, config, stop_at=None)
    first, last = mean(rewards[:5]), mean(rewards[-5:])
    assert len(rewards) == CONTROL_STEPS
    assert last < 0.4 and last - first < 0.15, f"the control improved: {rewards}"
