"""Drive palaestra's ORS door with the unmodified `ors-sdk` client (its own venv).

    python ors_client.py URL TOKEN OTHER_TOKEN SOLUTIONS_JSON

SOLUTIONS_JSON maps a HumanEval task id to the solution.py to write. Prints one JSON line
of what the client saw; tests/server/doors/test_door_ors.py asserts on it."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from ors.client import ORS, AuthenticationError, ToolCallError
from ors.client._http import request_retryable
from tenacity import stop_after_attempt

ONCE = request_retryable.retry_with(stop=stop_after_attempt(1))  # the client retries 4xx too

ECHO = "palaestra/echo"
HUMANEVAL = "openai/humaneval"


def output(result: Any) -> dict[str, Any]:
    return {
        "reward": result.reward,
        "finished": result.finished,
        "metadata": result.metadata,
        "blocks": [
            {"type": b.type, "text": getattr(b, "text", None), "mime": getattr(b, "mimeType", None)}
            for b in result.blocks
        ],
    }


def foreign(url: str, other: str, env: str, sid: str) -> list[int | str]:
    """Another token naming this session: the client's own HTTP call, answered how?"""

    async def attempt(method: str, path: str, body: dict[str, Any] | None) -> int | str:
        import aiohttp

        async with aiohttp.ClientSession(base_url=url) as client:
            try:
                await ONCE(client, method, path, expect_json=True, token=other, sid=sid, json=body)
            except aiohttp.ClientResponseError as exc:
                return exc.status
            return "reached"

    async def all_of() -> list[int | str]:
        return [
            await attempt("GET", f"/{env}/task_tools", None),
            await attempt("GET", f"/{env}/prompt", None),
            await attempt("POST", "/ping", None),
            await attempt("POST", "/delete", None),
        ]

    return asyncio.run(all_of())


def main() -> None:
    url, token, other, solutions_json = sys.argv[1:5]
    solutions: dict[str, str] = json.loads(solutions_json)
    seen: dict[str, Any] = {}
    started = time.monotonic()
    with ORS(base_url=url, api_key=token) as client:
        envs = {name: client.environment(name) for name in (ECHO, HUMANEVAL)}
        seen["splits"] = {name: env.list_splits() for name, env in envs.items()}
        he = envs[HUMANEVAL]
        heldout = he.list_tasks("heldout")
        seen["heldout_tasks"] = [t.task_spec for t in heldout]
        seen["num_heldout"] = he.num_tasks("heldout")
        seen["task_range"] = [t.task_spec["id"] for t in he.get_task_range("heldout", 0, 3)]
        seen["env_tools"] = [t.name for t in he.list_tools()]
        train = {t.task_spec["id"]: t for t in envs[ECHO].list_tasks("train")}
        birch = next(t for tid, t in train.items() if tid.endswith(":say-birch"))

        with envs[ECHO].session(task=birch) as session:
            echo: dict[str, Any] = {"sid": session.sid}
            echo["prompt"] = [b.text for b in session.get_prompt()]
            echo["tools"] = [t.name for t in session.list_tools()]
            echo["openai_tools"] = session.list_tools(format="openai")
            echo["foreign"] = foreign(url, other, ECHO, session.sid or "")
            echo["say"] = output(session.call_tool("echo", {"text": "hello"}))
            try:
                session.call_tool("no_such_tool", {})
                echo["bad_tool"] = "accepted"
            except ToolCallError as exc:
                echo["bad_tool"] = str(exc)
            echo["submit"] = output(session.call_tool("submit", {"answer": "hcrib"}))
            seen["echo"] = echo

        coding: dict[str, Any] = {}
        listed = {t.task_spec["id"]: t for t in heldout + he.list_tasks("train")}
        for task_id, solution in solutions.items():
            with he.session(task=listed[task_id]) as session:
                run: dict[str, Any] = {"sid": session.sid}
                run["tools"] = [t.name for t in session.list_tools()]
                run["write"] = output(
                    session.call_tool("write_file", {"path": "solution.py", "content": solution})
                )
                run["submit"] = output(session.call_tool("submit", {}))
                coding[task_id] = run
        seen["coding"] = coding
        try:  # split and index name no environment on the wire: refused, said why
            with he.session(split="train", index=0):
                seen["by_index"] = "opened"
        except Exception as exc:
            seen["by_index"] = str(exc)

    try:
        with ORS(base_url=url, api_key="not-a-token") as bad:
            bad.environment(ECHO).list_splits()
        seen["bad_token"] = "accepted"
    except AuthenticationError as exc:
        seen["bad_token"] = str(exc)
    seen["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
