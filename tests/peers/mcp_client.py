"""The official `mcp` client against palaestra's /v1/episodes/{id}/mcp (run by
tests/server/doors/test_door_mcp.py with the peer venv's python).

Usage: mcp_client.py PLAN.json, where the plan names the server's url, the tokens and the
episodes the test started over /v1. Every scenario goes through the SDK's own
`streamable_http_client` + `ClientSession` (and its high-level `Client`, whose `auto`
mode probes `server/discover` first); the last stdout line is the JSON of what each saw.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import LATEST_HANDSHAKE_VERSION


def dump(result: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def error(exc: MCPError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "data": exc.data}


def endpoint(plan: dict[str, Any], episode: str) -> str:
    return f"{plan['url']}/v1/episodes/{episode}/mcp"


def http(token: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)


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
    """The high-level Client: server/discover first (refused: -32022), then initialize."""
    async with (
        http(token) as client,
        Client(streamable_http_client(url, http_client=client)) as mcp,
    ):
        tools = await mcp.list_tools()
        echoed = await mcp.call_tool("echo", {"text": "auto"})
        return {
            "version": mcp.session.protocol_version,
            "tools": [t.name for t in tools.tools],
            "echo": dump(echoed),
        }


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
    out["wrong_token"] = await refused(endpoint(plan, episodes["auto"]), "not-a-token")
    out["other_token"] = await refused(endpoint(plan, episodes["auto"]), tokens["b"])
    out["unknown_episode"] = await refused(endpoint(plan, plan["unknown"]), tokens["b"])
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        loaded = json.load(f)
    print(json.dumps(anyio.run(main, loaded)))
