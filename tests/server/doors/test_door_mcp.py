"""MCP per episode (server/doors/mcp.py, server/doors/mcp_http.py).

The core's JSON-RPC handling runs over a real embedded manager (echo episodes). The
streamable HTTP route is driven by the official `mcp` client (its own venv,
tests/peers/mcp_client.py) against a real `palaestra serve`.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conftest import ServerProcess, make_settings
from docblocks import blocks

from palaestra.envs.coding.family import task_solution
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import Action, ResetRequest, StepRequest, StepResponse, ToolSpec
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS
from palaestra.server.doors import mcp
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack
from palaestra.server.runtime import build_manager
from server.test_sealed import WRONG_CODE, make_token, secrets_of
from tests.peers import peer_python, run_peer

pytestmark = pytest.mark.slow

ECHO_TRAIN = "palaestra/echo:say-birch"


class Echo:
    """One echo episode of the embedded manager, as the core sees it."""

    def __init__(self, manager: EpisodeManager, episode_id: str, tools: list[ToolSpec]) -> None:
        self.manager = manager
        self.episode_id = episode_id
        self.episode = mcp.McpEpisode(tools=tools, step=self.step)
        self.session = mcp.McpSession()

    async def step(self, action: Action) -> StepResponse:
        return await self.manager.step(self.episode_id, StepRequest(action=action))

    async def send(self, message: object) -> mcp.Reply:
        return await mcp.handle(message, self.episode, self.session)


# One embedded manager for the core's tests, with the echo pack only.
on_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def embedded(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EpisodeManager]:
    data = tmp_path_factory.mktemp("mcp") / "data"
    built = build_manager(make_settings(data_dir=data, packs_dirs=[REPO_PACKS / "echo"]))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


@pytest_asyncio.fixture(loop_scope="module")
async def echo(embedded: EpisodeManager) -> Echo:
    started = await embedded.reset(ResetRequest(task=ECHO_TRAIN))
    return Echo(embedded, started.episode_id, started.tools)


def request(method: str, params: object = None, message_id: object = 1) -> dict[str, object]:
    message: dict[str, object] = {"jsonrpc": "2.0", "id": message_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


@on_module_loop
async def test_initialize_negotiates_the_version(echo: Echo) -> None:
    for offered, answered in [
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2099-01-01", mcp.LATEST_VERSION),  # unknown: the spec says answer with ours
    ]:
        reply = await echo.send(request("initialize", {"protocolVersion": offered}))
        assert isinstance(reply, dict)
        assert reply["result"]["protocolVersion"] == answered
        assert reply["result"]["capabilities"] == {"tools": {"listChanged": False}}
        assert echo.session.protocol_version == answered
    missing = await echo.send(request("initialize", {"capabilities": {}}))
    assert isinstance(missing, dict) and missing["error"]["code"] == mcp.INVALID_PARAMS
    assert "protocolVersion" in missing["error"]["message"]
    assert await echo.send({"jsonrpc": "2.0", "method": "notifications/initialized"}) is None
    assert echo.session.initialized


MODERN = "2026-07-28"


def envelope(version: object = MODERN, **extra: object) -> dict[str, object]:
    """The 2026-07-28 request envelope (`params._meta`)."""
    return {
        mcp.PROTOCOL_VERSION_META: version,
        mcp.CLIENT_CAPABILITIES_META: {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
        **extra,
    }


@on_module_loop
async def test_the_2026_revision_needs_no_handshake(echo: Echo) -> None:
    """Each request carries its version in _meta; nothing is remembered between them."""
    meta = {"_meta": envelope()}
    found = await echo.send(request("server/discover", meta, "d"))
    assert isinstance(found, dict) and found["id"] == "d", found
    discovered = found["result"]
    assert discovered["supportedVersions"] == [MODERN]
    assert discovered["resultType"] == "complete" and discovered["cacheScope"] == "private"
    assert discovered["capabilities"] == {"tools": {"listChanged": False}}
    assert discovered["_meta"][mcp.SERVER_INFO_META]["name"] == "palaestra"
    listed = await echo.send(request("tools/list", meta))
    assert isinstance(listed, dict)
    assert [t["name"] for t in listed["result"]["tools"]] == ["echo", "submit"]
    assert listed["result"]["resultType"] == "complete"
    call = {"name": "echo", "arguments": {"text": "now"}, **meta}
    called = await echo.send(request("tools/call", call))
    assert isinstance(called, dict)
    assert called["result"]["content"] == [{"type": "text", "text": "now"}]
    assert called["result"]["resultType"] == "complete"
    assert called["result"]["structuredContent"]["terminated"] is False
    refused = await echo.send(request("tools/call", {**call, "arguments": {"text": 5}}))
    assert isinstance(refused, dict) and refused["result"]["isError"] is True
    assert refused["result"]["resultType"] == "complete"
    assert echo.session.protocol_version is None  # no session was negotiated
    # The handshake's methods are not the 2026 revision's.
    for gone in ("ping", "initialize"):
        reply = await echo.send(request(gone, meta))
        assert isinstance(reply, dict) and reply["error"]["code"] == mcp.METHOD_NOT_FOUND
        assert MODERN in reply["error"]["message"]
    # A stateless transport's request without the envelope is told what to carry.
    stateless = await mcp.handle(
        request("tools/list"), echo.episode, mcp.McpSession(stateless=True)
    )
    assert isinstance(stateless, dict) and stateless["error"]["code"] == mcp.INVALID_PARAMS
    assert mcp.CLIENT_CAPABILITIES_META in stateless["error"]["message"]
    # 2026 requests are never batched (the revision has no batches).
    batch = await echo.send([request("tools/list", meta, 1), request("tools/list", {}, 2)])
    assert isinstance(batch, list)
    assert batch[0]["error"]["code"] == mcp.INVALID_REQUEST and "2026-07-28" in str(batch[0])
    assert "result" in batch[1]


@on_module_loop
async def test_a_version_we_do_not_serve_is_refused_by_name(echo: Echo) -> None:
    """An envelope naming a version not served statelessly is -32022 naming the versions
    served (the handshake ones included: those are reached through initialize)."""
    for asked in ("1999-01-01", "2025-11-25"):
        reply = await echo.send(request("tools/list", {"_meta": envelope(asked)}, "v"))
        assert isinstance(reply, dict) and reply["id"] == "v"
        error = reply["error"]
        assert error["code"] == mcp.UNSUPPORTED_VERSION == -32022
        assert error["data"] == {"supported": list(mcp.SUPPORTED_VERSIONS), "requested": asked}
        assert MODERN in error["message"] and "2025-11-25" in error["message"]
    huge = "9" * 100_000
    reply = await echo.send(request("server/discover", {"_meta": envelope(huge)}))
    assert isinstance(reply, dict) and reply["error"]["code"] == -32022
    assert len(json.dumps(reply)) < 2_000  # the version is quoted clipped, never echoed whole
    for bad, says in [
        ({"_meta": envelope(5)}, "must be a string"),
        ({"_meta": {mcp.PROTOCOL_VERSION_META: MODERN}}, mcp.CLIENT_CAPABILITIES_META),
        ({"_meta": "2026-07-28"}, "must be an object"),
        ({}, "must be an object"),  # server/discover is always of the 2026 revision
    ]:
        reply = await echo.send(request("server/discover", bad))
        assert isinstance(reply, dict) and reply["error"]["code"] == mcp.INVALID_PARAMS, bad
        assert says in reply["error"]["message"]
    # initialize never negotiates the stateless revision: it answers its newest handshake one.
    reply = await echo.send(request("initialize", {"protocolVersion": MODERN}))
    assert isinstance(reply, dict) and reply["result"]["protocolVersion"] == "2025-11-25"


@on_module_loop
async def test_tools_list_and_call(echo: Echo) -> None:
    listed = await echo.send(request("tools/list"))
    assert isinstance(listed, dict)
    tools = {t["name"]: t for t in listed["result"]["tools"]}
    assert set(tools) == {"echo", "submit"}
    assert tools["echo"]["inputSchema"]["properties"]["text"]["type"] == "string"
    called = await echo.send(request("tools/call", {"name": "echo", "arguments": {"text": "hi"}}))
    assert isinstance(called, dict)
    result = called["result"]
    assert result["content"] == [{"type": "text", "text": "hi"}] and not result["isError"]
    assert result["structuredContent"]["terminated"] is False
    # A refused action is a tool error (the episode goes on), not a protocol error.
    bad = await echo.send(request("tools/call", {"name": "echo", "arguments": {"text": 5}}))
    assert isinstance(bad, dict) and bad["result"]["isError"] is True
    assert "text" in bad["result"]["content"][0]["text"]
    unknown = await echo.send(request("tools/call", {"name": "rm", "arguments": {}}))
    assert isinstance(unknown, dict) and unknown["error"]["code"] == mcp.INVALID_PARAMS
    assert "'rm'" in unknown["error"]["message"] and "echo, submit" in unknown["error"]["message"]
    done = await echo.send(
        request("tools/call", {"name": "submit", "arguments": {"answer": "hcrib"}})
    )
    assert isinstance(done, dict)
    step = done["result"]["structuredContent"]
    assert step["terminated"] and step["reward"] == 1.0 and step["verdict"]["passed"]
    ended = await echo.send(request("tools/call", {"name": "echo", "arguments": {}}))
    assert isinstance(ended, dict) and ended["error"]["code"] == -32009
    assert ended["error"]["data"]["status"] == 409 and "ended" in ended["error"]["message"]


@on_module_loop
async def test_old_sessions_get_the_step_in_meta(echo: Echo) -> None:
    await echo.send(request("initialize", {"protocolVersion": "2025-03-26"}))
    called = await echo.send(request("tools/call", {"name": "echo", "arguments": {"text": "x"}}))
    assert isinstance(called, dict)
    assert "structuredContent" not in called["result"]
    assert called["result"]["_meta"][mcp.STEP_META]["reward"] == 0.0


@on_module_loop
async def test_protocol_errors(echo: Echo) -> None:
    parse = await mcp.handle_bytes(b'{"jsonrpc": "2.0", "id": 1,', echo.episode, echo.session)
    assert isinstance(parse, dict) and parse["error"]["code"] == mcp.PARSE_ERROR
    assert parse["id"] is None
    unknown = await echo.send(request("resources/list", {}, 7))
    assert isinstance(unknown, dict) and unknown["id"] == 7
    assert unknown["error"]["code"] == mcp.METHOD_NOT_FOUND
    assert "resources/list" in unknown["error"]["message"]
    for bad in [
        5,
        {"id": 1, "method": "ping"},  # no "jsonrpc"
        {"jsonrpc": "2.0", "id": 1, "method": 3},
        {"jsonrpc": "2.0", "id": 1.5, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
    ]:
        reply = await echo.send(bad)
        assert isinstance(reply, dict) and reply["error"]["code"] == mcp.INVALID_REQUEST, bad
    params = await echo.send(request("tools/call", [1, 2]))
    assert isinstance(params, dict) and params["error"]["code"] == mcp.INVALID_PARAMS
    assert await echo.send({"jsonrpc": "2.0", "method": "notifications/cancelled"}) is None
    assert await echo.send({"jsonrpc": "2.0", "id": 9, "result": {}}) is None


@on_module_loop
async def test_batches(echo: Echo) -> None:
    replies = await echo.send(
        [
            request("ping", message_id=1),
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            request("tools/call", {"name": "echo", "arguments": {"text": "a"}}, 2),
            request("nope", message_id=3),
            request("initialize", {"protocolVersion": "2025-06-18"}, 4),
            "not a message",
        ]
    )
    assert isinstance(replies, list)
    by_id = {r["id"]: r for r in replies}
    assert by_id[1]["result"] == {}
    assert by_id[2]["result"]["content"][0]["text"] == "a"
    assert by_id[3]["error"]["code"] == mcp.METHOD_NOT_FOUND
    assert by_id[4]["error"]["code"] == mcp.INVALID_REQUEST  # initialize is never batched
    assert by_id[None]["error"]["code"] == mcp.INVALID_REQUEST
    assert len(replies) == 5  # the notification got none
    empty = await echo.send([])
    assert isinstance(empty, dict) and empty["error"]["code"] == mcp.INVALID_REQUEST
    only = await echo.send([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert only is None


@on_module_loop
async def test_images_become_image_blocks() -> None:
    from palaestra.sdk.models import Observation

    reply = StepResponse(observation=Observation(text="a view", images=["iVBORw0KGgo="]))
    result = mcp.tool_result(reply)
    assert result["content"][1] == {
        "type": "image",
        "data": "iVBORw0KGgo=",
        "mimeType": "image/png",
    }
    json.dumps(result)


# -- the streamable HTTP route, driven by the official client -----------------------------

MCP_PIN = "mcp==2.3.0"
HE_TRAIN = "openai/humaneval:HumanEval-2"
HE_SEALED = "openai/humaneval:HumanEval-0"


@pytest.fixture(scope="module")
def served(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def task_of(ref: str) -> Task:
    pack, task_id = ref.split(":")
    return load_pack(REPO_PACKS / pack.split("/")[1]).tasks[task_id]


def start(url: str, token: str, task: str) -> str:
    with HTTPClient(url, token=token) as client:
        return client.reset(task).episode_id


def mcp_url(server: ServerProcess, episode_id: str) -> str:
    return f"{server.url}/v1/episodes/{episode_id}/mcp"


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result["content"])


def test_the_official_client_drives_episodes(served: ServerProcess, tmp_path: Path) -> None:
    python = peer_python("mcp", MCP_PIN)
    a, b = make_token(served, "train"), make_token(served, "train")
    evaluator = make_token(served, "eval")
    episodes = {
        "echo": start(served.url, a, ECHO_TRAIN),
        "humaneval": start(served.url, a, HE_TRAIN),
        "auto": start(served.url, a, ECHO_TRAIN),
        "sealed": start(served.url, evaluator, HE_SEALED),
        "stateless": start(served.url, a, ECHO_TRAIN),
        "stateless_humaneval": start(served.url, a, HE_TRAIN),
    }
    plan = {
        "url": served.url,
        "tokens": {"a": a, "b": b, "eval": evaluator},
        "episodes": episodes,
        "unknown": uuid.uuid4().hex,
        "echo_answer": "hcrib",
        "solution": task_solution(task_of(HE_TRAIN)),
        "wrong_solution": WRONG_CODE,
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    seen = run_peer(python, "mcp_client.py", str(tmp_path / "plan.json"), timeout=180)

    echo = seen["echo"]
    assert echo["initialize"]["protocolVersion"] == seen["client_offers"] == "2025-11-25"
    assert echo["initialize"]["serverInfo"]["name"] == "palaestra"
    assert {t["name"] for t in echo["tools"]} == {"echo", "submit"}
    hello, bad, unknown, submit, after = echo["calls"]
    assert text_of(hello) == "hello" and hello["isError"] is False
    assert hello["structuredContent"]["terminated"] is False
    assert bad["isError"] is True and "text" in text_of(bad)
    assert unknown["error"]["code"] == mcp.INVALID_PARAMS and "no_such_tool" in str(unknown)
    step = submit["structuredContent"]
    assert step["terminated"] and step["reward"] == 1.0 and step["verdict"]["passed"]
    assert after["error"]["code"] == -32009 and after["error"]["data"]["status"] == 409

    written, verdict = seen["humaneval"]["calls"]
    assert written["isError"] is False
    step = verdict["structuredContent"]
    assert step["terminated"] and step["reward"] == 1.0 and step["verdict"]["passed"] is True
    with HTTPClient(served.url, token=a) as client:
        stored = client.state(episodes["humaneval"])
    assert stored.status.value == "done" and stored.verdict is not None
    assert stored.verdict.reward == 1.0 and len(stored.trajectory) == 2
    assert stored.trajectory[0].action.tool == "write_file"

    # The SDK's Client as it comes: its server/discover probe succeeds, and it stays on the
    # stateless revision: no session id either way, the version and method on every POST.
    auto = seen["auto"]
    assert auto["version"] == "2026-07-28" and auto["server"] == "palaestra"
    assert set(auto["tools"]) == {"echo", "submit"} and text_of(auto["echo"]) == "auto"
    assert [w["sent"]["mcp-method"] for w in auto["wire"]] == [
        "server/discover",
        "tools/list",
        "tools/call",
    ]
    stateless = seen["stateless"]
    for exchange in auto["wire"] + stateless["wire"]:
        assert exchange["sent"]["mcp-protocol-version"] == "2026-07-28"
        assert "mcp-session-id" not in exchange["sent"] and "mcp-session-id" not in exchange["got"]

    # A whole episode over 2026-07-28 (a Client pinned to it: no probe, no handshake).
    assert stateless["version"] == "2026-07-28" and stateless["tools"] == ["echo", "submit"]
    hello, bad, unknown, submit, after = stateless["calls"]
    assert text_of(hello) == "hello" and hello["structuredContent"]["terminated"] is False
    assert bad["isError"] is True and "text" in text_of(bad)
    assert unknown["error"]["code"] == mcp.INVALID_PARAMS and "no_such_tool" in str(unknown)
    step = submit["structuredContent"]
    assert step["terminated"] and step["reward"] == 1.0 and step["verdict"]["passed"]
    assert after["error"]["code"] == -32009 and after["error"]["data"]["status"] == 409
    calls = [w for w in stateless["wire"] if w["sent"]["mcp-method"] == "tools/call"]
    assert [w["sent"]["mcp-name"] for w in calls] == [
        "echo",
        "echo",
        "no_such_tool",
        "submit",
        "echo",
    ]
    assert [w["status"] for w in calls] == [200, 200, 400, 200, 409]
    written, verdict = seen["stateless_humaneval"]["calls"]
    assert written["isError"] is False and verdict["structuredContent"]["reward"] == 1.0
    with HTTPClient(served.url, token=a) as client:
        stored = client.state(episodes["stateless_humaneval"])
    assert stored.status.value == "done" and len(stored.trajectory) == 2

    # A version no server speaks: -32022, its data what the SDK's own model reads.
    unserved = seen["unserved_version"]
    assert unserved["code"] == mcp.UNSUPPORTED_VERSION
    assert unserved["parsed"] == {
        "supported": list(mcp.SUPPORTED_VERSIONS),
        "requested": "1999-01-01",
    }

    # Tenancy holds in both eras: a bad token is 401; another token's episode reads
    # exactly as an id that does not exist.
    for era in ("", "stateless_"):
        wrong = seen[f"{era}wrong_token"]
        assert wrong["code"] == mcp.ERROR_CODES[401] and "bearer" in wrong["message"].lower()
        other, nowhere = (
            seen[f"{era}other_token"],
            seen[f"{era}unknown" + ("" if era else "_episode")],
        )
        assert other["code"] == nowhere["code"] == mcp.ERROR_CODES[404], era
        assert other["message"].replace(episodes["auto"], "ID") == nowhere["message"].replace(
            plan["unknown"], "ID"
        )

    # A sealed task stays sealed through MCP: pass/fail and scores only.
    sealed = seen["sealed"]
    *_, final = sealed["calls"]
    assert final["structuredContent"]["terminated"]
    assert final["structuredContent"]["verdict"]["passed"] is False
    everything = json.dumps(sealed)
    for secret in secrets_of(task_of(HE_SEALED)):
        assert secret not in everything, secret
    assert "Traceback" not in final["structuredContent"]["verdict"]["feedback"]

    # The examples of docs/integrations.md run as written, one per era.
    for name, printed in [
        ("mcp_example.py", ["['echo', 'submit']", "hi", "1.0 True"]),
        ("mcp_stateless_example.py", ["2026-07-28", "['echo', 'submit']", "1.0"]),
    ]:
        example = [b for b in blocks("integrations.md") if b.arg == name]
        assert len(example) == 1, f"docs/integrations.md: the MCP example {name} is gone"
        (tmp_path / name).write_text(example[0].body)
        ran = subprocess.run(
            [str(python), str(tmp_path / name), served.url, a],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert ran.stdout.splitlines() == printed, ran.stdout


def rpc(method: str, params: dict[str, Any] | None = None, message_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": message_id, "method": method, "params": params or {}}


INIT = rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
BOTH = {"accept": "application/json, text/event-stream"}


def test_the_transport_speaks_streamable_http(served: ServerProcess) -> None:
    """Status codes, headers and bodies of the transport itself, over raw HTTP."""
    token, other = make_token(served, "train"), make_token(served, "train")
    episode = start(served.url, token, ECHO_TRAIN)
    url = mcp_url(served, episode)
    auth = {"authorization": f"Bearer {token}", **BOTH}
    with httpx.Client(timeout=60) as http:
        # 401 in JSON-RPC's shape, with the bearer challenge.
        denied = http.post(url, json=INIT, headers={"authorization": "Bearer nope", **BOTH})
        assert denied.status_code == 401 and "bearer" in denied.headers["www-authenticate"].lower()
        assert denied.json()["error"]["code"] == mcp.ERROR_CODES[401]
        assert http.post(url, json=INIT, headers=BOTH).status_code == 401
        # A version not served at all: 400, -32022, naming it and the ones served.
        probe = http.post(
            url, json=rpc("tools/list"), headers={**auth, "mcp-protocol-version": "1999-01-01"}
        )
        assert probe.status_code == 400
        error = probe.json()["error"]
        assert error["code"] == -32022 and error["data"]["requested"] == "1999-01-01"
        assert error["data"]["supported"] == list(mcp.SUPPORTED_VERSIONS)
        # initialize opens a session; its id is required after.
        opened = http.post(url, json=INIT, headers=auth)
        assert opened.status_code == 200, opened.text
        assert opened.headers["content-type"].startswith("application/json")
        assert opened.json()["result"]["protocolVersion"] == "2025-06-18"
        sid = opened.headers["mcp-session-id"]
        assert sid.isascii() and len(sid) >= 32
        inside = {**auth, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        accepted = http.post(url, json=note, headers=inside)
        assert accepted.status_code == 202 and accepted.content == b""
        missing = http.post(url, json=rpc("tools/list"), headers=auth)
        assert missing.status_code == 400 and "mcp-session-id" in missing.json()["error"]["message"]
        wrong = {**inside, "mcp-protocol-version": "2025-03-26"}
        assert http.post(url, json=rpc("tools/list"), headers=wrong).status_code == 400
        listed = http.post(url, json=rpc("tools/list"), headers=inside)
        assert [t["name"] for t in listed.json()["result"]["tools"]] == ["echo", "submit"]
        # A batch, answered as one JSON array (notifications get no entry).
        batch = [rpc("ping", message_id=1), note, rpc("tools/list", message_id=2)]
        replies = http.post(url, json=batch, headers=inside).json()
        assert [r["id"] for r in replies] == [1, 2]
        # A client that takes only SSE gets the reply as an event stream.
        sse_only = {**inside, "accept": "text/event-stream"}
        call = rpc("tools/call", {"name": "echo", "arguments": {"text": "over sse"}}, 3)
        streamed = http.post(url, json=call, headers=sse_only)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        event = streamed.text.strip().splitlines()
        assert event[0] == "event: message" and event[1].startswith("data: ")
        assert json.loads(event[1][6:])["result"]["content"][0]["text"] == "over sse"
        # Bad bodies and headers.
        garbled = http.post(
            url, content=b'{"jsonrpc":', headers={**inside, "content-type": "application/json"}
        )
        assert garbled.status_code == 400 and garbled.json()["error"]["code"] == mcp.PARSE_ERROR
        as_text = {**inside, "content-type": "text/plain"}
        assert http.post(url, content=b"{}", headers=as_text).status_code == 415
        pictures = {**inside, "accept": "image/png"}
        assert http.post(url, json=rpc("ping"), headers=pictures).status_code == 406
        # Another token cannot use the session, nor reach the episode: the 404 of nothing.
        theirs = {**inside, "authorization": f"Bearer {other}"}
        stolen = http.post(url, json=rpc("tools/list"), headers=theirs)
        assert stolen.status_code == 404
        elsewhere = mcp_url(served, start(served.url, token, ECHO_TRAIN))
        assert http.post(elsewhere, json=rpc("tools/list"), headers=inside).status_code == 404
        # No server-initiated stream; DELETE ends the session, not the episode.
        assert http.get(url, headers=inside).status_code == 405
        assert http.delete(url, headers=inside).status_code == 200
        assert http.post(url, json=rpc("ping"), headers=inside).status_code == 404
        # A token revoked mid-session is refused on its next message.
        name = f"mcp-revoked-{uuid.uuid4().hex[:6]}"
        revoked = make_token(served, "train", name=name)
        theirs = {"authorization": f"Bearer {revoked}", **BOTH}
        own = mcp_url(served, start(served.url, revoked, ECHO_TRAIN))
        sid = http.post(own, json=INIT, headers=theirs).headers["mcp-session-id"]
        assert http.delete(f"{served.url}/v1/tokens/{name}", headers=served.headers).is_success
        late = http.post(own, json=rpc("ping"), headers={**theirs, "mcp-session-id": sid})
        assert late.status_code == 401 and late.json()["error"]["code"] == mcp.ERROR_CODES[401]
    with HTTPClient(served.url, token=token) as client:
        assert client.state(episode).status.value == "active"
