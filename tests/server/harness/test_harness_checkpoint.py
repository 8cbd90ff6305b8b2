"""Checkpoint and resume of a harness episode by replay (server/harness_resume.py,
server/harness/replay.py): a real bash-agent in bwrap (and docker where the engine is up),
checkpointed mid-run, the server SIGKILLed; the next server resumes it, the harness starts
again from its start workspace, its model calls are answered from the capture (the model
is not asked again), and it goes on live from there. A harness whose calls no longer match
the capture ends void, `resume_failed`, naming the call; one the server checkpointed on
its own (`checkpoint_every_steps`) resumes from that checkpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerProcess
from tests.harness_peers import (
    SOLVE_2,
    TRAIN_TASK,
    call,
    finished,
    harness,
    llm_calls,
    started,
    wait_calls,
)
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.server.test_checkpoint_kill import DOCKER_SKIP, kill
from tests.server.test_sealed import make_token
from tests.servers import packs_dir, scaled, settings_env

pytestmark = pytest.mark.slow


def server_on(data: Path, **settings: Any) -> ServerProcess:
    packs = packs_dir(data.parent, ["humaneval"])
    return ServerProcess(data, settings_env({"packs_dirs": [packs], **settings}))


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    made: list[ServerProcess] = []
    yield made
    for server in made:
        server.stop()


def checkpointed(server: ServerProcess, token: str, episode: str, calls: int) -> dict[str, Any]:
    """The episode checkpointed once `calls` model calls are recorded; its state then."""
    state = wait_calls(server, token, episode, calls)
    reply = call(server, token, "POST", f"/v1/episodes/{episode}/checkpoint")
    assert reply.status_code == 200, reply.text
    assert reply.json()["step_count"] == calls
    return state


def resumed(server: ServerProcess, token: str, episode: str) -> tuple[int, dict[str, Any]]:
    status = call(server, token, "GET", f"/v1/episodes/{episode}").json()["status"]
    assert status == "resumable"
    reply = call(server, token, "POST", f"/v1/episodes/{episode}/resume")
    return reply.status_code, reply.json()


@pytest.mark.parametrize(
    "sandbox",
    [
        "bwrap",
        pytest.param(
            "docker", marks=pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
        ),
    ],
)
def test_a_harness_episode_resumes_by_replay_after_a_sigkill(
    tmp_path: Path, servers: list[ServerProcess], sandbox: str
) -> None:
    solve = bash_call(SOLVE_2 + " && ls")
    replay = FakeModel([solve, bash_call("sleep 4"), bash_call("cat solution.py"), submit_call()])
    drift = FakeModel([bash_call("date +%s%N"), bash_call("sleep 4"), submit_call()])
    auto = FakeModel([bash_call("echo a"), bash_call("echo b"), bash_call("sleep 60")])
    with replay.serve() as url, drift.serve() as drift_url, auto.serve() as auto_url:
        first = server_on(tmp_path / "data", checkpoint_every_steps=2, sandbox=sandbox).start()
        servers.append(first)
        token = make_token(first, "train", "harness")
        episode = started(first, token, TRAIN_TASK, harness(url))
        other = started(first, token, TRAIN_TASK, harness(drift_url))
        unasked = started(first, token, TRAIN_TASK, harness(auto_url))  # checkpointed alone
        wait_calls(first, token, unasked, 3)
        before = checkpointed(first, token, episode, 2)
        checkpointed(first, token, other, 2)
        kill(first)  # SIGKILL: both harnesses die mid `sleep 4`
        assert len(replay.requests) == 2

        second = server_on(tmp_path / "data", sandbox=sandbox).start()
        servers.append(second)
        t0 = time.monotonic()
        status, body = resumed(second, token, episode)
        resume_s = time.monotonic() - t0
        assert status == 200, body
        assert body["resumed_at_step"] == 2 and body["lost_steps"] == 0
        done = finished(second, token, episode)
        assert done["status"] == "done" and done["verdict"]["reward"] == 1.0, done
        calls = llm_calls(done)
        assert [c["index"] for c in calls] == [0, 1, 2, 3]
        # the steps before the checkpoint as recorded then (ids, logprobs and all), then
        # the new ones; the model was asked only for the calls after the capture
        assert done["trajectory"][:2] == before["trajectory"][:2]
        assert calls[2]["completion_token_ids"] == [1, 2, 3] and calls[2]["logprobs"]
        assert len(replay.requests) == 4
        assert done["harness"]["calls"] == 4
        print(f"harness resume: {resume_s * 1000:.0f} ms to answer the resume")

        # `date` printed another time: the second call's request is not the recorded one
        status, body = resumed(second, token, other)
        assert status == 200, body
        deadline = time.monotonic() + scaled(60)
        while (state := call(second, token, "GET", f"/v1/episodes/{other}").json())[
            "status"
        ] == "active":
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        assert state["status"] == "void", state
        failure = state["failure"]
        assert failure["kind"] == "resume_failed" and failure["boundary"] == "server"
        assert "model call 1 of the capture's 2" in failure["reason"]
        assert "messages[3] differs" in failure["reason"], failure
        assert len(drift.requests) == 2  # nothing went on to the model

        # every 2 model calls the server checkpointed the third on its own
        status, body = resumed(second, token, unasked)
        assert status == 200 and body["resumed_at_step"] in (2, 3), body  # 3: raced call 2
        assert call(second, token, "DELETE", f"/v1/episodes/{unasked}").status_code == 204
