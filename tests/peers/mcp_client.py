"""The official `mcp` client against palaestra's /v1/episodes/{id}/mcp (run by
tests/server/doors/test_door_mcp.py with the peer venv's python).

Usage: mcp_client.py PLAN.json, where the plan names the server's url, the tokens and the
episodes the test started over /v1. Every scenario goes through the SDK's own
`streamable_http_client` + `ClientSession` (the 2025-11-25 handshake) or its high-level
`Client` (`auto` mode probes `server/discover` and stays on 2026-07-28, stateless; a version
pin skips the probe); the last stdout line is the JSON of what each saw, with the HTTP
headers each stateless client sent and got.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import httpx2
import mcp_types
from mcp import ClientSession
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

Wire = list[dict[str, Any]]


def dump(result: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def error(exc: MCPError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "data": exc.data}


def endpoint(plan: dict[str, Any], episode: str) -> str:
    return f"{plan['url']}/v1/episodes/{episode}/mcp"


def http(token: str, wire: Wire | None = None) -> httpx2.AsyncClient:
    """An HTTP client with the bearer token; `wire` gets each exchange's headers and status."""
    hooks = {}
    if wire is not None:

        async def seen(response: httpx2.Response) -> None:
            wire.append(
                {
                    "sent": {k.lower(): v for k, v in response.request.headers.items()},
                    "got": {k.lower(): v for k, v in response.headers.items()},
                    "status": response.status_code,
                }
            )

        hooks = {"response": [seen]}
    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=120, event_hooks=hooks
    )


async def session_run(url: str, token: str, steps: list[tuple[str, dict[str, Any]]]) -> Any:
    """initialize, list_tools, then each tool call in turn (errors recorded, not raised)."""
    out: dict[str, Any] = {"calls": []}
    async with (
        http(token) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        out["initialize"] = dump(init)
        listed = await session.list_tools()
        out["tools"] = [dump(t) for t in listed.tools]
        for name, arguments in steps:
            try:
                out["calls"].append(dump(await session.call_tool(name, arguments)))
            except MCPError as exc:
                out["calls"].append({"error": error(exc)})
    return out


async def refused(url: str, token: str) -> dict[str, Any]:
    """What initialize raises for a token or an episode the server must refuse."""
    seen: dict[str, Any] = {"error": "initialize succeeded"}
    try:
        async with (
            http(token) as client,
            streamable_http_client(url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
    except* MCPError as raised:  # the session's task groups wrap it
        seen = error(first_leaf(raised))
    return seen


def first_leaf(group: BaseExceptionGroup[MCPError]) -> MCPError:
    inner = group.exceptions[0]
    return inner if isinstance(inner, MCPError) else first_leaf(inner)


async def auto_mode(url: str, token: str) -> dict[str, Any]:
    """The high-level Client as it comes: server/discover first, then stateless requests."""
    wire: Wire = []
    async with (
        http(token, wire) as client,
        Client(streamable_http_client(url, http_client=client)) as mcp,
    ):
        tools = await mcp.list_tools()
        echoed = await mcp.call_tool("echo", {"text": "auto"})
        info = mcp.server_info
        return {
            "version": mcp.protocol_version,
            "server": info.name if info is not None else None,
            "tools": [t.name for t in tools.tools],
            "echo": dump(echoed),
            "wire": wire,
        }


async def stateless_run(url: str, token: str, steps: list[tuple[str, dict[str, Any]]]) -> Any:
    """A Client pinned to the newest stateless revision (no probe, no handshake): list the
    tools, then each call in turn (errors recorded, not raised)."""
    out: dict[str, Any] = {"calls": [], "wire": []}
    async with (
        http(token, out["wire"]) as client,
        Client(streamable_http_client(url, http_client=client), mode=LATEST_MODERN_VERSION) as mcp,
    ):
        out["version"] = mcp.protocol_version
        out["tools"] = [t.name for t in (await mcp.list_tools()).tools]
        for name, arguments in steps:
            try:
                out["calls"].append(dump(await mcp.call_tool(name, arguments)))
            except MCPError as exc:
                out["calls"].append({"error": error(exc)})
    return out


async def stateless_refused(url: str, token: str) -> dict[str, Any]:
    """What a pinned stateless Client's first request raises where the server must refuse."""
    seen: dict[str, Any] = {"error": "list_tools succeeded"}
    try:
        async with (
            http(token) as client,
            Client(
                streamable_http_client(url, http_client=client), mode=LATEST_MODERN_VERSION
            ) as mcp,
        ):
            await mcp.list_tools()
    except* MCPError as raised:
        seen = error(first_leaf(raised))
    return seen


async def unserved_version(url: str, token: str) -> dict[str, Any]:
    """The SDK's own discover probe at a version no server speaks: the -32022 it raises,
    its data parsed by the SDK's own model."""
    async with (
        http(token) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        try:
            await session.send_discover("1999-01-01")
        except MCPError as exc:
            data = mcp_types.UnsupportedProtocolVersionErrorData.model_validate(exc.error.data)
            return {**error(exc), "parsed": data.model_dump(mode="json")}
    return {"error": "discover succeeded"}


async def main(plan: dict[str, Any]) -> dict[str, Any]:
    tokens, episodes = plan["tokens"], plan["episodes"]
    out: dict[str, Any] = {"client_offers": LATEST_HANDSHAKE_VERSION}
    out["echo"] = await session_run(
        endpoint(plan, episodes["echo"]),
        tokens["a"],
        [
            ("echo", {"text": "hello"}),
            ("echo", {"text": 5}),  # a refused action: isError, the episode goes on
            ("no_such_tool", {}),
            ("submit", {"answer": plan["echo_answer"]}),
            ("echo", {"text": "after the end"}),
        ],
    )
    write = {"path": "solution.py", "content": plan["solution"]}
    out["humaneval"] = await session_run(
        endpoint(plan, episodes["humaneval"]),
        tokens["a"],
        [("write_file", write), ("submit", {})],
    )
    out["sealed"] = await session_run(
        endpoint(plan, episodes["sealed"]),
        tokens["eval"],
        [
            ("write_file", {"path": "solution.py", "content": plan["wrong_solution"]}),
            ("run_tests", {}),
            ("submit", {}),
        ],
    )
    out["auto"] = await auto_mode(endpoint(plan, episodes["auto"]), tokens["a"])
    out["stateless"] = await stateless_run(
        endpoint(plan, episodes["stateless"]),
        tokens["a"],
        [
            ("echo", {"text": "hello"}),
            ("echo", {"text": 5}),
            ("no_such_tool", {}),
            ("submit", {"answer": plan["echo_answer"]}),
            ("echo", {"text": "after the end"}),
        ],
    )
    out["stateless_humaneval"] = await stateless_run(
        endpoint(plan, episodes["stateless_humaneval"]),
        tokens["a"],
        [("write_file", write), ("submit", {})],
    )
    out["unserved_version"] = await unserved_version(endpoint(plan, episodes["auto"]), tokens["a"])
    out["wrong_token"] = await refused(endpoint(plan, episodes["auto"]), "not-a-token")
    out["other_token"] = await refused(endpoint(plan, episodes["auto"]), tokens["b"])
    out["unknown_episode"] = await refused(endpoint(plan, plan["unknown"]), tokens["b"])
    stateless = endpoint(plan, episodes["auto"])
    out["stateless_wrong_token"] = await stateless_refused(stateless, "not-a-token")
    out["stateless_other_token"] = await stateless_refused(stateless, tokens["b"])
    out["stateless_unknown"] = await stateless_refused(endpoint(plan, plan["unknown"]), tokens["b"])
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        loaded = json.load(f)
    print(json.dumps(anyio.run(main, loaded)))
