"""A checkpointed episode survives a SIGKILL of `palaestra serve` (server/checkpoint.py): the
next server on the same data dir finds it `resumable`, and a resume continues it from the
checkpoint under the same id, on bwrap and on docker (where the engine is up)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import ServerProcess, docker_skip_reason

from palaestra.sandbox.docker import BASE_IMAGE
from palaestra.sdk.errors import ConflictError, NotFoundError
from palaestra.sdk.http import HTTPClient
from tests.servers import packs_dir, settings_env

pytestmark = pytest.mark.slow

DOCKER_SKIP = docker_skip_reason(BASE_IMAGE)
HE = "openai/humaneval:HumanEval-1"
SOLUTION = """def separate_paren_groups(paren_string):
    groups, depth, cur = [], 0, ""
    for c in paren_string.replace(" ", ""):
        cur += c
        depth += 1 if c == "(" else -1
        if depth == 0:
            groups.append(cur)
            cur = ""
    return groups
"""
LS = {"tool": "run_python", "arguments": {"code": "import os; print(sorted(os.listdir()))"}}


def server_on(data: Path, sandbox: str) -> ServerProcess:
    packs = packs_dir(data.parent, ["humaneval"])
    return ServerProcess(data, settings_env({"packs_dirs": [packs], "sandbox": sandbox}))


def kill(proc: ServerProcess) -> None:
    """SIGKILL: no shutdown hook, no final flush, nothing parked."""
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait(timeout=10)
    proc.proc = None


def write(path: str, content: str) -> dict[str, object]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


@pytest.mark.parametrize(
    "sandbox",
    [
        "bwrap",
        pytest.param(
            "docker", marks=pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
        ),
    ],
)
def test_a_checkpointed_episode_survives_a_sigkill(tmp_path: Path, sandbox: str) -> None:
    data = tmp_path / "data"
    first = server_on(data, sandbox).start()
    try:
        with first.client() as client:
            eid = client.reset(HE).episode_id
            client.step(eid, write("solution.py", SOLUTION), request_id="s-0")
            client.step(eid, write("notes.txt", "kept\n"), request_id="s-1")
            checkpoint = client.checkpoint(eid)
            assert checkpoint.step_count == 2
            client.step(eid, write("after.txt", "lost"), request_id="s-2")
            plain = client.reset(HE).episode_id  # no checkpoint: void at the restart
            before = client.state(eid)
    finally:
        kill(first)

    second = server_on(data, sandbox).start()
    try:
        with second.client() as client:
            assert client.state(eid).status == "resumable"
            assert client.state(plain).status == "void"
            with pytest.raises(ConflictError):
                client.resume(plain)
            with pytest.raises(NotFoundError):
                client.resume("nobody-has-this-one")
            resumed = client.resume(eid)
            assert resumed.episode_id == eid and resumed.checkpoint_id == checkpoint.checkpoint_id
            assert resumed.resumed_at_step == 2 and resumed.lost_steps == 1
            state = client.state(eid)
            assert state.status == "active" and state.step_count == 2
            # The trajectory up to the checkpoint, as the first server recorded it.
            assert state.trajectory == before.trajectory[:2]
            seen = client.step(eid, LS)
            assert "['notes.txt', 'solution.py']" in seen.observation.text
            with pytest.raises(ConflictError):
                client.resume(eid)  # live now
            done = client.step(eid, {"tool": "submit", "arguments": {}})
            assert done.terminated and done.reward == 1.0
            verdict = client.verify(eid)
            assert verdict.passed and verdict.reward == 1.0
            final = client.state(eid)
            assert final.status == "done" and final.step_count == 4
            assert [r.index for r in final.trajectory] == [0, 1, 2, 3]
    finally:
        second.stop(signal.SIGINT)


def test_the_sdk_client_names_both_calls() -> None:
    """`Client.checkpoint` and `Client.resume` are the HTTP client's (sdk/client.py)."""
    assert callable(HTTPClient.checkpoint) and callable(HTTPClient.resume)
