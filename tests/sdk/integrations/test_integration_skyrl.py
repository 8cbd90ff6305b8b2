"""SkyRL: skyrl_gym 0.4.0's own `make` drives palaestra episodes through
sdk/integrations/skyrl.py, in a venv of its own, against a real `palaestra serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.sdk.http import HTTPClient
from tests.conftest import ServerProcess
from tests.peers import peer_python, run_peer
from tests.peers.our_side import sdk_env, train_token

pytestmark = pytest.mark.slow

SKYRL = ("skyrl-gym==0.4.0", "httpx==0.28.1", "pydantic==2.14.4")
TASK = "palaestra/echo:say-birch"
SEALED = "palaestra/echo:say-apple"  # the heldout split of palaestra/echo is sealed


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def test_skyrl_make_runs_palaestra_episodes(server: ServerProcess, tmp_path: Path) -> None:
    python = peer_python("skyrl", *SKYRL)
    token = train_token(server, "skyrl")
    out = run_peer(
        python, "skyrl_episodes.py", server.url, token, TASK, "hcrib", SEALED, env=sdk_env(tmp_path)
    )

    right, wrong = out["episodes"]
    for episode in (right, wrong):
        assert episode["prompt_roles"] == ["system", "user"] and episode["prompt_has_tools"]
        assert episode["dones"] == [False, False, True]
        first, echoed, last = episode["observations"]
        assert "error" in first[0]["content"] and "JSON" in first[0]["content"]
        assert echoed == [{"role": "user", "content": "hello"}]
        assert last == []
    assert right["rewards"] == [0.0, 0.0, 1.0] and wrong["rewards"] == [0.0, 0.0, 0.0]
    assert out["aggregate"]["passed"] == 0.5 and out["aggregate"]["turns"] == 3
    assert "extras needs 'task'" in out["missing_task"]
    # A train token cannot start a sealed task through the env; its answer never shows.
    assert (
        out["sealed"].startswith("PermissionDeniedError")
        and "sealed" in out["sealed"]
        and "elppa" not in out["sealed"]
    )

    # Hermes' <tool_call> (as Qwen models write one) is a tool call; what is none gets an
    # error observation that shows the expected forms, and the episode goes on.
    qwen = out["hermes"]
    assert "<tool_call>" in qwen["instructions"] and '"tool"' in qwen["instructions"]
    said = [o[0]["content"] if o else "" for o in qwen["observations"]]
    assert said[0] == "qwen" and said[3] == "unclosed"
    for error in (said[1], said[2]):
        assert error.startswith("error: ") and '<tool_call>{"name": "TOOL"' in error, error
        assert '{"tool": "TOOL", "arguments"' in error
    assert "2 tool calls in one turn" in said[1] and "tool: Field required" in said[2]
    assert qwen["dones"] == [False, False, False, False, True]
    assert qwen["rewards"][-1] == 1.0

    # On the server: both episodes stored under the train token, ended and verified.
    with HTTPClient(server.url, token=token) as client:
        for episode, reward in ((right, 1.0), (wrong, 0.0)):
            state = client.state(episode["episode_id"])
            assert state.task.endswith(":say-birch") and state.verdict is not None
            assert state.verdict.reward == reward
            assert state.step_count == 2  # the text with no JSON never reached the server
        hermes = client.state(qwen["episode_id"])
        assert hermes.step_count == 3 and hermes.verdict is not None  # the errors took no step
        assert [r.action.tool for r in hermes.trajectory] == ["echo", "echo", "submit"]
