"""How steps are kept: every step in SQLite, none in memory; the JSON the store gets is a
StepRecord's; process metrics counted per step."""

from __future__ import annotations

import json
import sqlite3

import httpx

from palaestra.sdk.models import (
    Action,
    BatchStepResponse,
    Observation,
    ResetRequest,
    StepRecord,
    StepRequest,
    step_record_json,
)
from palaestra.server.manager import EpisodeManager
from palaestra.server.tally import StepTally
from tests.conftest import ServerProcess
from tests.hosts import local_host

TASK = "palaestra/echo:say-birch"


def test_step_record_json_is_the_models_json() -> None:
    cases = [
        dict(
            index=0,
            request_id=None,
            action=Action(tool="echo", arguments={"text": "hi"}),
            observation=Observation(text="hi"),
            reward=0.0,
            terminated=False,
            truncated=False,
            info={},
            duration_s=1.5e-05,
            at=1764500000.25,
        ),
        dict(
            index=7,
            request_id="r-7",
            action=Action(tool="bash", arguments={"cmd": "ls\n\u00e9\u4e2d", "n": [1, 2.5, None]}),
            observation=Observation(text="\u00e9 \U0001f600 \x00", images=["iVBOR"], data={"a": 1}),
            reward=1.0,
            terminated=True,
            truncated=False,
            info={"verdict": {"reward": 1.0}, "status": "done", "nested": [{"x": True}]},
            duration_s=0.25,
            at=1.0,
        ),
    ]
    for fields in cases:
        text = step_record_json(**fields)  # type: ignore[arg-type]
        assert text == StepRecord(**fields).model_dump_json()  # type: ignore[arg-type]
        assert StepRecord.model_validate_json(text) == StepRecord(**fields)  # type: ignore[arg-type]


def test_step_tally_counts_as_the_wire_model_says() -> None:
    tally = StepTally()
    assert tally.model().tool_success_rate is None
    tally.add_step(tool_ok=True, timed_out=False, output_bytes=len("héllo".encode()))
    tally.add_step(tool_ok=False, timed_out=True, output_bytes=100)
    tally.add_step(tool_ok=False, timed_out=False, output_bytes=len(b"void"))  # a void step
    tally.add_refused()
    metrics = tally.model()
    assert metrics.steps == 3
    assert metrics.tool_calls == 4
    assert metrics.tool_failures == 3
    assert metrics.invalid_actions == 1
    assert metrics.timed_out == 1
    assert metrics.output_bytes == len("héllo".encode()) + 100 + len(b"void")
    assert metrics.tool_success_rate == 0.25


async def test_live_trajectory_is_in_the_store_not_in_memory(manager: EpisodeManager) -> None:
    reset = await manager.reset(ResetRequest(task=TASK, options={"max_steps": 1000}))
    episode_id = reset.episode_id
    for i in range(40):
        action = Action(tool="echo", arguments={"text": f"t{i}"})
        await manager.step(episode_id, StepRequest(action=action, request_id=f"r{i}"))
    live = local_host(manager)._live[episode_id]
    assert live.state.trajectory == []  # nothing kept per step in memory

    state = await manager.state(episode_id)
    assert state.step_count == 40
    assert [r.observation.text for r in state.trajectory] == [f"t{i}" for i in range(40)]
    assert [r.index for r in state.trajectory] == list(range(40))
    assert state.trajectory[5].request_id == "r5"
    assert state.metrics.steps == 40 and state.metrics.tool_success_rate == 1.0

    submit = Action(tool="submit", arguments={"answer": "hcrib"})
    end = await manager.step(episode_id, StepRequest(action=submit, request_id="end"))
    assert end.terminated and end.info["metrics"]["steps"] == 41
    # Ended and still cached, or loaded back from disk: the same trajectory.
    assert len((await manager.state(episode_id)).trajectory) == 41
    local_host(manager)._ended.clear()
    stored = await manager.state(episode_id)
    assert len(stored.trajectory) == 41 and stored.metrics.steps == 41
    # A retried request id of an ended, evicted episode is answered from the store.
    again = await manager.step(episode_id, StepRequest(action=submit, request_id="r3"))
    assert again.observation.text == "t3"
    db = sqlite3.connect(manager.settings.data_dir / "palaestra.sqlite3")
    indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "steps_request" not in indexes  # every step's insert pays for each index


def test_batch_step_reply_is_a_batch_step_response(server: ServerProcess) -> None:
    """The route writes its JSON without building the models; it must still be theirs."""
    with server.client() as client:
        resets = client.batch_reset([ResetRequest(task=TASK), ResetRequest(task=TASK)])
        ids = [r.result.episode_id for r in resets if r.result is not None]
    items = [
        {"episode_id": ids[0], "action": {"tool": "echo", "arguments": {"text": "é"}}},
        {"episode_id": "nope", "action": {"tool": "echo", "arguments": {}}},
        {"episode_id": ids[1], "action": {"tool": "submit", "arguments": {"answer": "hcrib"}}},
    ]
    reply = httpx.post(
        f"{server.url}/v1/batch/step", json={"items": items}, headers=server.headers, timeout=30
    )
    assert reply.status_code == 200
    parsed = BatchStepResponse.model_validate_json(reply.content)
    assert json.loads(reply.content) == json.loads(parsed.model_dump_json())
    assert parsed.items[0].result is not None and parsed.items[0].result.observation.text == "é"
    assert parsed.items[1].error is not None and parsed.items[1].error.status == 404
    assert parsed.items[2].result is not None and parsed.items[2].result.reward == 1.0


async def test_a_retry_older_than_the_reply_cache_is_answered_from_the_store(
    manager: EpisodeManager,
) -> None:
    """Live episodes keep only their last replies whole; an older request id is still never
    stepped twice."""
    from palaestra.server.episode import REPLAY_CACHE

    reset = await manager.reset(ResetRequest(task=TASK, options={"max_steps": 1000}))
    episode_id = reset.episode_id
    steps = REPLAY_CACHE + 10
    for i in range(steps):
        action = Action(tool="echo", arguments={"text": f"t{i}"})
        await manager.step(episode_id, StepRequest(action=action, request_id=f"r{i}"))
    live = local_host(manager)._live[episode_id]
    assert len(live.replies) == REPLAY_CACHE
    other = Action(tool="echo", arguments={"text": "something else"})
    again = await manager.step(episode_id, StepRequest(action=other, request_id="r0"))
    assert again.observation.text == "t0"
    assert (await manager.state(episode_id)).step_count == steps  # not stepped again
    submit = Action(tool="submit", arguments={"answer": "x"})
    await manager.step(episode_id, StepRequest(action=submit, request_id="end"))
    assert (
        len(local_host(manager)._ended[episode_id].replies) <= 1
    )  # an ended episode keeps ~nothing
    again = await manager.step(episode_id, StepRequest(action=other, request_id="r5"))
    assert again.observation.text == "t5"
