"""Batch routes: per-item results and errors, over a real server and in process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from conftest import make_settings

from palaestra.envs.base import EpisodeContext, StepOutcome, Tool, ToolArgs
from palaestra.envs.echo import EchoArgs, EchoFamily
from palaestra.sdk.models import Action, BatchStepItem, ResetRequest
from palaestra.server.inprocess import AsyncInProcessClient, InProcessClient
from palaestra.server.runtime import build_manager
from tests.conftest import ServerProcess

TASK = "palaestra/echo:say-birch"
ECHO = Action(tool="echo", arguments={"text": "hi"})


def test_batch_reset_and_step_over_http(server: ServerProcess) -> None:
    with server.client() as client:
        resets = client.batch_reset(
            [
                ResetRequest(task=TASK),
                ResetRequest(task="palaestra/echo:nope"),
                ResetRequest(task=TASK),
            ]
        )
        assert [r.error is None for r in resets] == [True, False, True]
        assert resets[1].error is not None and resets[1].error.status == 404
        assert resets[1].result is None
        a, b = (r.result.episode_id for r in resets if r.result is not None)
        assert resets[0].result is not None and "birch" in resets[0].result.observation.text

        steps = client.batch_step(
            [
                (a, ECHO),
                (b, {"tool": "submit", "arguments": {"answer": "hcrib"}}),
                ("no-such-episode", ECHO),
                (a, {"tool": "submit", "arguments": {"answer": "wrong"}}),
                (b, {"tool": "nope"}),
            ]
        )
        assert [s.episode_id for s in steps] == [a, b, "no-such-episode", a, b]
        assert steps[0].result is not None and steps[0].result.observation.text == "hi"
        assert steps[1].result is not None and steps[1].result.terminated
        assert steps[1].result.reward == 1.0
        assert steps[2].error is not None and steps[2].error.status == 404
        # a's items ran in their order: the echo, then the (wrong) submit.
        assert steps[3].result is not None and steps[3].result.terminated
        assert steps[3].result.reward == 0.0
        # b had ended by then: 409, and the bad tool never ran.
        assert steps[4].error is not None and steps[4].error.status == 409
        assert client.state(a).step_count == 2


def test_batch_malformed_item_fails_alone(server: ServerProcess) -> None:
    with server.client() as client:
        episode = client.reset(TASK).episode_id
    body = {
        "items": [
            {"episode_id": episode, "action": {"tool": "echo", "arguments": {"text": "x"}}},
            {"episode_id": episode, "action": {"arguments": {}}},
            {"episode_id": episode, "action": {"tool": "echo", "arguments": {"bad": 1}}},
        ]
    }
    reply = httpx.post(f"{server.url}/v1/batch/step", json=body, headers=server.headers)
    assert reply.status_code == 200
    items = reply.json()["items"]
    assert items[0]["result"]["observation"]["text"] == "x"
    assert items[1]["error"]["status"] == 422 and "tool" in items[1]["error"]["message"]
    assert items[2]["error"]["status"] == 422 and "bad" in items[2]["error"]["message"]
    # The envelope itself malformed: one 422 for the call.
    for bad in ({"items": []}, {"things": []}, [1, 2]):
        reply = httpx.post(f"{server.url}/v1/batch/step", json=bad, headers=server.headers)
        assert reply.status_code == 422, reply.text
        assert reply.json()["error"]["code"] == "invalid_request"
    reply = httpx.post(f"{server.url}/v1/batch/reset", json={"items": [{}]})
    assert reply.status_code == 401


def test_batch_step_replays_request_ids(server: ServerProcess) -> None:
    with server.client() as client:
        episode = client.reset(TASK, options={"max_steps": 100}).episode_id
        item = BatchStepItem(episode_id=episode, action=ECHO, request_id="r-1")
        first = client.batch_step([item])
        again = client.batch_step([item, item])
        assert first[0].result == again[0].result == again[1].result
        assert client.state(episode).step_count == 1


def test_batch_reset_capacity_is_per_item(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "data", args=["--max-episodes", "2"]).start()
    try:
        with proc.client() as client:
            items = client.batch_reset([ResetRequest(task=TASK) for _ in range(3)])
            errors = [i.error for i in items if i.error is not None]
            assert len(errors) == 1 and errors[0].status == 429
            assert errors[0].retryable and errors[0].retry_after is not None
            assert sum(i.result is not None for i in items) == 2
    finally:
        proc.stop()


def test_batch_in_process(tmp_path: Path) -> None:
    with InProcessClient(make_settings(data_dir=tmp_path / "data")) as client:
        resets = client.batch_reset([ResetRequest(task=TASK, seed=i) for i in range(4)])
        ids = [r.result.episode_id for r in resets if r.result is not None]
        assert len(ids) == 4
        steps = client.batch_step(
            [(e, {"tool": "submit", "arguments": {"answer": "hcrib"}}) for e in ids]
            + [(ids[0], {"tool": 5})]
        )
        assert [s.result.reward for s in steps[:4] if s.result is not None] == [1.0] * 4
        assert steps[4].error is not None and steps[4].error.status == 422


class SlowEcho(EchoFamily):
    """Echo whose `echo` of the text "slow" takes a while (a slow environment step)."""

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if isinstance(args, EchoArgs) and args.text == "slow":
            await asyncio.sleep(0.5)
        return await super().step(ctx, tool, args)


async def test_batch_wait_s_answers_slow_items_still_running(tmp_path: Path) -> None:
    manager = build_manager(make_settings(data_dir=tmp_path / "data"))
    manager.families.add(SlowEcho())
    await manager.start()
    try:
        client = AsyncInProcessClient(manager)
        a = (await client.reset(TASK, options={"max_steps": 100})).episode_id
        b = (await client.reset(TASK, options={"max_steps": 100})).episode_id
        slow = BatchStepItem(
            episode_id=a, action=Action(tool="echo", arguments={"text": "slow"}), request_id="s"
        )
        fast = BatchStepItem(episode_id=b, action=ECHO, request_id="f")
        first = await client.batch_step([slow, fast], wait_s=0.05)
        assert first[1].result is not None and first[1].result.observation.text == "hi"
        assert first[0].error is not None and first[0].error.code == "still_running"
        assert first[0].error.retryable
        # Resent alone: nothing else finished, so it waits for (joins) the running step.
        again = await client.batch_step([slow], wait_s=0.05)
        assert again[0].result is not None and again[0].result.observation.text == "slow"
        assert (await client.state(a)).step_count == 1  # joined, never stepped twice
    finally:
        await manager.shutdown()


async def test_an_eager_step_that_waits_goes_on_as_a_task_and_can_be_cancelled() -> None:
    """`batch.eager` runs a step until it first waits, then drives it as a task would,
    with no private asyncio state: it resumes when what it awaits is done, and a cancel
    reaches the step."""
    from palaestra.server.batch import eager

    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    seen: list[object] = []

    async def step() -> None:
        seen.append(await gate)
        await asyncio.sleep(0)
        seen.append("done")

    async def never() -> None:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def instant() -> None:
        seen.append("instant")

    assert eager(instant()) is None and seen == ["instant"]
    task = eager(step())
    assert task is not None and not task.done()
    gate.set_result(7)
    await task
    assert seen[1:] == [7, "done"]
    stuck = eager(never())
    assert stuck is not None
    await asyncio.sleep(0)
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)
    assert seen[-1] == "cancelled"
