"""The MCP door's stateless 2026-07-28 form (server/doors/mcp_stateless.py) under attack, and
its transport as the spec words it: no session to steal, so every request is checked on its
own: the token against the episode the URL names, the headers against the body, the version
against those served, whatever size the `_meta` envelope.

Each test drives the real app in process over a real manager (echo pack), one token per
tenant (redteam.test_door_abuse's `door`)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx

from palaestra.server.doors import mcp
from redteam.test_door_abuse import ECHO, door, mcp_session

MODERN = "2026-07-28"
ACCEPT = {"accept": "application/json, text/event-stream"}


def envelope(version: object = MODERN, **extra: Any) -> dict[str, Any]:
    return {mcp.PROTOCOL_VERSION_META: version, mcp.CLIENT_CAPABILITIES_META: {}, **extra}


def call(message_id: int = 1, tool: str = "echo", **meta: Any) -> dict[str, Any]:
    """A 2026-07-28 tools/call of `tool` (echo says "x")."""
    arguments = {"text": "x"} if tool == "echo" else {"answer": "hcrib"}
    params = {"name": tool, "arguments": arguments, "_meta": envelope(**meta)}
    return {"jsonrpc": "2.0", "id": message_id, "method": "tools/call", "params": params}


def headers_of(message: dict[str, Any], **extra: str) -> dict[str, str]:
    """The headers a conforming client sends with `message`."""
    sent = {**ACCEPT, "mcp-protocol-version": MODERN, "mcp-method": message["method"]}
    if message["method"] == "tools/call":
        sent["mcp-name"] = message["params"]["name"]
    return {**sent, **extra}


async def post(
    client: httpx.AsyncClient, episode_id: str, message: object, headers: Any = None
) -> httpx.Response:
    if headers is None:
        assert isinstance(message, dict)
        headers = headers_of(message)
    return await client.post(
        f"/v1/episodes/{episode_id}/mcp",
        content=json.dumps(message).encode(),
        headers=[("content-type", "application/json"), *dict(headers).items()]
        if isinstance(headers, dict)
        else [("content-type", "application/json"), *headers],
    )


async def start(client: httpx.AsyncClient) -> str:
    started = await client.post("/v1/episodes", json={"task": ECHO})
    assert started.status_code == 200, started.text
    episode_id: str = started.json()["episode_id"]
    return episode_id


async def steps_of(client: httpx.AsyncClient, episode_id: str) -> int:
    state = await client.get(f"/v1/episodes/{episode_id}")
    assert state.status_code == 200, state.text
    return len(state.json()["trajectory"])


def error_of(reply: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert reply.status_code == status, (reply.status_code, reply.text[:500])
    body = reply.json()
    assert body["error"]["code"] == code, body
    error: dict[str, Any] = body["error"]
    return error


async def test_the_stateless_transport(tmp_path: Path) -> None:
    """One POST, one answer: no session minted or needed, notifications 202, no batches,
    the handshake's methods gone, DELETE 405; SSE for a client that takes only that."""
    async with door(tmp_path, mcp_sessions_max=1) as tenant:
        client = tenant()
        episode = await start(client)
        discover = {"jsonrpc": "2.0", "id": "d", "method": "server/discover"}
        discover["params"] = {"_meta": envelope()}
        found = await post(client, episode, discover)
        assert found.status_code == 200 and "mcp-session-id" not in found.headers
        assert found.json()["result"]["supportedVersions"] == [MODERN]
        # A session id, even a made-up one, is ignored (2026 has none).
        said = await post(client, episode, call(), headers_of(call(), **{"mcp-session-id": "x"}))
        assert said.status_code == 200, said.text
        assert said.json()["result"]["content"][0]["text"] == "x"
        # A name outside printable ASCII comes base64'd; the decoded form must match.
        odd = call(tool="submit")
        odd["params"]["name"] = "süb"
        encoded = "=?base64?" + base64.b64encode("süb".encode()).decode() + "?="
        wrong_tool = await post(client, episode, odd, headers_of(odd, **{"mcp-name": encoded}))
        assert "süb" in error_of(wrong_tool, 400, mcp.INVALID_PARAMS)["message"]
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
        assert (await post(client, episode, note, headers_of(note))).status_code == 202
        batch = await post(client, episode, [call(1), call(2)], headers_of(call()))
        assert "batch" in error_of(batch, 400, mcp.INVALID_REQUEST)["message"]
        ping = {"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"_meta": envelope()}}
        assert MODERN in error_of(await post(client, episode, ping), 404, -32601)["message"]
        sse = await post(client, episode, call(4), headers_of(call(4), accept="text/event-stream"))
        assert sse.headers["content-type"].startswith("text/event-stream")
        assert json.loads(sse.text.split("data: ", 1)[1])["id"] == 4
        url = f"/v1/episodes/{episode}/mcp"
        gone = await client.delete(url, headers={"mcp-protocol-version": MODERN})
        assert gone.status_code == 405
        assert await steps_of(client, episode) == 2  # the calls that passed, and only those
        # Nothing was held for them: the server's one MCP session is still free.
        _, opened = await mcp_session(tenant())
        assert opened["mcp-session-id"]


async def test_a_stateless_request_reaches_only_its_own_tokens_episodes(tmp_path: Path) -> None:
    async with door(tmp_path) as tenant:
        victim, attacker = tenant(), tenant()
        episode, legacy = await mcp_session(victim)
        theirs = await post(attacker, episode, call())
        nowhere = await post(attacker, "0" * 32, call())
        error = error_of(theirs, 404, mcp.ERROR_CODES[404])
        assert error["message"].replace(episode, "ID") == error_of(
            nowhere, 404, mcp.ERROR_CODES[404]
        )["message"].replace("0" * 32, "ID")
        # The victim's session id, replayed with the attacker's token, opens nothing either.
        stolen = headers_of(call(), **{"mcp-session-id": legacy["mcp-session-id"]})
        assert (await post(attacker, episode, call(), stolen)).status_code == 404
        for method in ("server/discover", "tools/list"):
            probe = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": envelope()}}
            assert (await post(attacker, episode, probe)).status_code == 404, method
        submit = await post(attacker, episode, call(tool="submit"))
        assert submit.status_code == 404
        forged = headers_of(call(), authorization="Bearer not-a-token")
        unauthenticated = await post(victim, episode, call(), forged)
        assert unauthenticated.status_code == 401
        assert unauthenticated.json()["error"]["code"] == mcp.ERROR_CODES[401]
        assert await steps_of(victim, episode) == 0  # nothing the attacker sent was a step
        mine = await post(victim, episode, call())
        assert mine.status_code == 200, mine.text


async def test_a_bad_or_missing_version_is_refused_naming_those_served(tmp_path: Path) -> None:
    async with door(tmp_path) as tenant:
        client = tenant()
        episode = await start(client)
        served = list(mcp.SUPPORTED_VERSIONS)
        for header in ("1999-01-01", "", "2026-07-28x", "9" * 4000):
            sent = headers_of(call(), **{"mcp-protocol-version": header})
            refused = await post(client, episode, call(), sent)
            error = error_of(refused, 400, mcp.UNSUPPORTED_VERSION)
            assert error["data"]["supported"] == served
            assert error["data"]["requested"] == header[: mcp.SHOWN_CHARS]
            assert len(refused.content) < 2_000
        # The envelope's version, not the header's, is the one the body runs at: they agree.
        for meta_version in ("2025-11-25", 5, None):
            disagree = await post(client, episode, call(version=meta_version))
            assert "MCP-Protocol-Version" in error_of(disagree, 400, mcp.HEADER_MISMATCH)["message"]
        # An envelope but no header: the header is required; a handshake one differs.
        bare = {**ACCEPT, "mcp-method": "tools/call", "mcp-name": "echo"}
        missing = await post(client, episode, call(), bare)
        assert "no MCP-Protocol-Version" in error_of(missing, 400, mcp.HEADER_MISMATCH)["message"]
        older = {**bare, "mcp-protocol-version": "2025-06-18"}
        error_of(await post(client, episode, call(), older), 400, mcp.HEADER_MISMATCH)
        # A header but no envelope: the envelope is required.
        naked = call()
        del naked["params"]["_meta"]
        error = error_of(await post(client, episode, naked), 400, mcp.INVALID_PARAMS)
        assert mcp.CLIENT_CAPABILITIES_META in error["message"]
        no_caps = call()
        del no_caps["params"]["_meta"][mcp.CLIENT_CAPABILITIES_META]
        error_of(await post(client, episode, no_caps), 400, mcp.INVALID_PARAMS)
        # Headers that disagree with the body, or come twice, are refused before any step:
        # an intermediary routing on Mcp-Name cannot be shown one tool while another runs.
        for lying in (
            headers_of(call(), **{"mcp-name": "submit"}),
            headers_of(call(), **{"mcp-method": "tools/list"}),
            headers_of(call(), **{"mcp-name": "=?base64?not base64?="}),
            [*headers_of(call()).items(), ("mcp-name", "submit")],
            [*headers_of(call()).items(), ("MCP-Protocol-Version", MODERN)],
        ):
            error_of(await post(client, episode, call(), lying), 400, mcp.HEADER_MISMATCH)
        assert await steps_of(client, episode) == 0


async def test_a_huge_meta_costs_its_parse_and_no_more(tmp_path: Path) -> None:
    """_meta is the client's to fill: a big one is read once and never echoed; past the
    body limits it is refused before it is parsed whole, never a 5xx."""
    limit = 2 * 1024 * 1024
    async with door(tmp_path, max_body_bytes=limit) as tenant:
        client = tenant()
        episode = await start(client)
        blob = {"com.example/blob": "x" * (limit - 4096)}
        began = time.monotonic()
        big = await post(client, episode, call(**blob))
        assert big.status_code == 200 and len(big.content) < 4096, big.text[:300]
        assert time.monotonic() - began < 2.0
        many = {f"com.example/k{index}": index for index in range(50_000)}
        assert (await post(client, episode, call(**many))).status_code == 200
        huge_version = await post(client, episode, call(version="9" * (limit - 4096)))
        assert len(huge_version.content) < 2_000  # quoted clipped, never echoed
        error_of(huge_version, 400, mcp.HEADER_MISMATCH)
        over = await post(client, episode, call(**{"com.example/blob": "x" * limit}))
        assert over.status_code == 413
        deep: Any = {}
        for _ in range(500):
            deep = {"a": deep}
        nested = await post(client, episode, call(**{"com.example/deep": deep}))
        assert 400 <= nested.status_code < 500, nested.text[:300]
        assert await steps_of(client, episode) == 2
