"""openenv-core 0.3.0's own clients (the PyPI name OpenEnv environment repos pin), unmodified,
against a palaestra server's OpenEnv door. Their WebSocket sends no headers of ours: the
token rides in the URL's user info (`http://palaestra:<token>@host/…`), which the
`websockets` library under them sends as HTTP Basic credentials. Run by
tests/server/doors/test_door_openenv.py with the peer's python:

    openenv_core_client.py URL PLAN.json

The last stdout line is JSON with what came back.
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient


def door(url: str, token: str | None, pack: str) -> str:
    """The door's base URL, with `token` as the URL's password when there is one."""
    parts = urlsplit(f"{url}/openenv/{pack}")
    netloc = f"palaestra:{token}@{parts.netloc}" if token else parts.netloc
    return urlunsplit(parts._replace(netloc=netloc))


def failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def generic_episode(url: str, token: str, pack: str, task: str, actions: list[Any]) -> Any:
    """GenericEnvClient: reset(task=…), each action, state()."""
    with GenericEnvClient(base_url=door(url, token, pack)).sync() as env:
        reset = env.reset(task=task)
        steps = [env.step(action) for action in actions]
        state = env.state()
    return {
        "reset": {"observation": reset.observation, "done": reset.done},
        "steps": [
            {"reward": r.reward, "done": r.done, "observation": r.observation} for r in steps
        ],
        "state": state,
    }


def mcp_episode(url: str, token: str, task: str, answer: str) -> dict[str, Any]:
    """MCPToolClient (its default WebSocket mode): list_tools, call_tool, a refused tool,
    and the submit as a CallToolAction step (whose reward the client reports)."""
    with MCPToolClient(base_url=door(url, token, "palaestra/echo")).sync() as env:
        before = [t.name for t in env.list_tools()]  # OpenEnv lists tools before a reset
        env.reset(task=task)
        tools = env.list_tools(use_cache=False)
        echoed = env.call_tool("echo", text="over openenv-core")
        try:
            env.call_tool("teleport", to="mars")
            unknown = "no error"
        except RuntimeError as exc:
            unknown = str(exc)
        submitted = env.step(CallToolAction(tool_name="submit", arguments={"answer": answer}))
        state = env.state()
    return {
        "tools_before_reset": before,
        "tools": [{"name": t.name, "schema": t.input_schema} for t in tools],
        "echoed": echoed,
        "unknown": unknown,
        "submit": {
            "reward": submitted.reward,
            "done": submitted.done,
            "tool_name": submitted.observation.tool_name,
            "error": submitted.observation.error,
        },
        "state": {"episode_id": state.episode_id, "step_count": state.step_count},
    }


def refused(url: str, token: str | None, pack: str, task: str) -> str:
    """What the client raises when the server refuses (a bad token, a missing scope)."""
    try:
        with GenericEnvClient(base_url=door(url, token, pack)).sync() as env:
            env.reset(task=task)
    except Exception as exc:  # the client's own exception, whatever its class
        return failure(exc)
    return "no error"


def main() -> None:
    url, plan_path = sys.argv[1], sys.argv[2]
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    generic = plan["generic"]
    out = {
        "generic": generic_episode(
            url, generic["token"], generic["pack"], generic["task"], generic["actions"]
        ),
        "mcp": mcp_episode(url, plan["mcp"]["token"], plan["mcp"]["task"], plan["mcp"]["answer"]),
        "refused": {
            label: refused(url, spec["token"], spec["pack"], spec["task"])
            for label, spec in plan["refused"].items()
        },
    }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
