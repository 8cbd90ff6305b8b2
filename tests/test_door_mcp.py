"""MCP per episode (server/doors/mcp.py, server/doors/mcp_http.py).

The core's JSON-RPC handling runs over a real embedded manager (echo episodes). The
streamable HTTP route is driven by the official `mcp` client (its own venv,
tests/peers/mcp_client.py) against a real `palaestra serve`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from conftest import make_settings

from palaestra.sdk.models import Action, ResetRequest, StepRequest, StepResponse, ToolSpec
from palaestra.server.doors import mcp
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager

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


# One embedded manager for the core's tests (a manager loads every pack: ~3 s).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def embedded(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EpisodeManager]:
    built = build_manager(make_settings(data_dir=tmp_path_factory.mktemp("mcp") / "data"))
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


async def test_a_version_we_do_not_serve_is_refused_by_name(echo: Echo) -> None:
    """server/discover (the 2026 stateless revision's probe) is refused with -32022 naming
    the version asked for and the ones served: the official client then initializes."""
    meta = {mcp.PROTOCOL_VERSION_META: "2026-07-28"}
    reply = await echo.send(request("server/discover", {"_meta": meta}, "d"))
    assert isinstance(reply, dict) and reply["id"] == "d"
    error = reply["error"]
    assert error["code"] == mcp.UNSUPPORTED_VERSION == -32022
    assert error["data"] == {"supported": list(mcp.SUPPORTED_VERSIONS), "requested": "2026-07-28"}
    assert "2026-07-28" in error["message"] and "2025-11-25" in error["message"]


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


async def test_old_sessions_get_the_step_in_meta(echo: Echo) -> None:
    await echo.send(request("initialize", {"protocolVersion": "2025-03-26"}))
    called = await echo.send(request("tools/call", {"name": "echo", "arguments": {"text": "x"}}))
    assert isinstance(called, dict)
    assert "structuredContent" not in called["result"]
    assert called["result"]["_meta"][mcp.STEP_META]["reward"] == 0.0


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
