"""palaestra's ACP reference agent: the smallest agent on the Agent Client Protocol's own
Python SDK (PyPI `agent-client-protocol`, its `acp.Agent` and `acp.run_agent`).

It runs inside an episode's sandbox under palaestra's ACP client (acp_client.py), which
starts it and speaks ACP over its stdio; the SDK comes from the `acp` toolchain
(scripts/bootstrap-harness.sh) on PYTHONPATH. Its model is the session proxy's chat
completions (`$OPENAI_BASE_URL`, `$OPENAI_MODEL`; bash_agent.py's call). Its tools do
nothing themselves: each is an ACP request to the client, which acts in the workspace —
`bash` is `terminal/create` (after `session/request_permission`), `wait_for_exit`,
`output`, `release`; `write_file` is `fs/write_text_file`; `read_file` is
`fs/read_text_file`; `submit` ends the turn (`end_turn`). A client's refusal (a path
outside the workspace) goes back to the model as the tool's result. Each model reply's text
and each tool call are sent as `session/update` notifications.

Stop reasons: `end_turn` (submitted, or a second reply with no tool call),
`max_turn_requests` (`--max-turns` model calls). A model endpoint that fails (the proxy
refused a call, no answer) is the prompt's JSON-RPC error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from typing import Any

import acp  # type: ignore[import-not-found]
from acp import (
    RequestError,
    run_agent,
    start_tool_call,
    text_block,
    update_tool_call,
)
from acp.schema import (  # type: ignore[import-not-found]
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallUpdate,
)
from bash_agent import NUDGE, SYSTEM, EndpointError, chat, tool_calls  # type: ignore[import-not-found]

FILE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a text file (path relative to the working directory).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file (path relative to the working directory).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]
ALLOW = [
    PermissionOption(option_id="allow", name="Run it", kind="allow_once"),
    PermissionOption(option_id="reject", name="Do not run it", kind="reject_once"),
]


def bash_tools() -> list[dict[str, Any]]:
    """bash_agent's `bash` and `submit`, with the file tools between them."""
    from bash_agent import TOOLS

    return [TOOLS[0], *FILE_TOOLS, TOOLS[1]]


class ReferenceAgent(acp.Agent):  # type: ignore[misc]  # the SDK is not in the venv
    """One ACP agent process: sessions by id, each a working directory."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sessions: dict[str, str] = {}
        self.conn: Any = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:  # fmt: skip
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(),
            agent_info=Implementation(name="palaestra-acp-agent", version="1"),
        )

    async def new_session(
        self, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = cwd
        return NewSessionResponse(session_id=session_id)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        cwd = self.sessions.get(session_id)
        if cwd is None:
            raise RequestError.invalid_params({"sessionId": "unknown session"})
        text = "\n".join(getattr(block, "text", "") for block in prompt)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": text},
        ]
        nudged = False
        for _ in range(self.args.max_turns):
            body = {"model": self.args.model, "messages": messages, "tools": bash_tools()}
            try:
                message = await asyncio.to_thread(
                    chat, self.args.base_url, body, self.args.api_key, self.args.call_timeout
                )
            except EndpointError as exc:
                raise RequestError.internal_error({"model": str(exc)[:2000]}) from None
            calls = tool_calls(message)
            if message.get("content"):
                update = acp.update_agent_message_text(str(message["content"]))
                await self.conn.session_update(session_id, update)
            messages.append({"role": "assistant", "content": message.get("content")})
            if calls:
                messages[-1]["tool_calls"] = calls
            elif nudged:
                return PromptResponse(stop_reason="end_turn")
            else:
                nudged = True
                messages.append({"role": "user", "content": NUDGE})
                continue
            for call in calls:
                result = await self.tool(session_id, cwd, call)
                if result is None:
                    return PromptResponse(stop_reason="end_turn")
                call_id = str(call.get("id", ""))
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        return PromptResponse(stop_reason="max_turn_requests")

    async def tool(self, session_id: str, cwd: str, call: dict[str, Any]) -> str | None:
        """One tool call through the client; its result text (None: `submit`)."""
        function = call.get("function") or {}
        name, raw = function.get("name"), function.get("arguments")
        if name == "submit":
            return None
        try:
            arguments = raw if isinstance(raw, dict) else json.loads(raw or "{}")
        except (TypeError, ValueError):
            return "error: the arguments are not JSON"
        if not isinstance(arguments, dict):
            return "error: the arguments must be an object"
        call_id = f"{name}-{uuid.uuid4().hex[:8]}"
        start = start_tool_call(call_id, str(name), kind=KINDS.get(str(name), "other"),
                                status="in_progress", raw_input=arguments)  # fmt: skip
        await self.conn.session_update(session_id, start)
        try:
            result = await self.run_tool(session_id, cwd, call_id, str(name), arguments)
            status = "completed"
        except RequestError as exc:  # the client refused: the model is told why
            result, status = f"error: the client refused: {exc}", "failed"
        done = update_tool_call(call_id, status=status,
                                content=[acp.tool_content(text_block(result[:2000]))])  # fmt: skip
        await self.conn.session_update(session_id, done)
        return result

    async def run_tool(
        self, session_id: str, cwd: str, call_id: str, name: str, arguments: dict[str, Any]
    ) -> str:
        path = arguments.get("path")
        if name in ("write_file", "read_file"):
            if not isinstance(path, str) or not path:
                return f'error: `{name}` needs {{"path": "..."}}'
            target = os.path.join(cwd, path)
            if name == "read_file":
                read = await self.conn.read_text_file(session_id=session_id, path=target)
                return str(read.content)
            content = arguments.get("content")
            if not isinstance(content, str):
                return 'error: `write_file` needs {"content": "..."}'
            await self.conn.write_text_file(session_id=session_id, path=target, content=content)
            return f"wrote {len(content)} characters to {path}"
        if name != "bash":
            return f"error: unknown tool {name!r}; the tools are {', '.join(KINDS)}, submit"
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return 'error: `bash` needs {"command": "<a command line>"}'
        return await self.bash(session_id, cwd, call_id, command)

    async def bash(self, session_id: str, cwd: str, call_id: str, command: str) -> str:
        asked = await self.conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=call_id, title=command[:200], kind="execute"),
            options=ALLOW,
        )
        outcome = asked.outcome
        if getattr(outcome, "option_id", None) != "allow":
            return "error: the client did not permit this command"
        term = await self.conn.create_terminal(
            session_id=session_id, command="bash", args=["-c", command], cwd=cwd,
            output_byte_limit=self.args.output_limit,
        )  # fmt: skip
        tid = term.terminal_id
        try:
            waited = self.conn.wait_for_terminal_exit(session_id=session_id, terminal_id=tid)
            exited = await asyncio.wait_for(waited, self.args.command_timeout)
            code = exited.exit_code
            head = f"exit status {code if code is not None else exited.signal}"
        except TimeoutError:
            await self.conn.kill_terminal(session_id=session_id, terminal_id=tid)
            head = f"timed out after {self.args.command_timeout:g} s (killed)"
        out = await self.conn.terminal_output(session_id=session_id, terminal_id=tid)
        await self.conn.release_terminal(session_id=session_id, terminal_id=tid)
        cut = "\n[output truncated]" if out.truncated else ""
        return f"{head}\n{out.output}{cut}"


KINDS = {"bash": "execute", "write_file": "edit", "read_file": "read"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="palaestra's ACP reference agent (stdio)")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", ""))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", ""))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--max-turns", type=int, default=30, help="model calls a prompt turn")
    parser.add_argument("--command-timeout", type=float, default=60.0, help="seconds a command")
    parser.add_argument("--output-limit", type=int, default=10_000, help="bytes of its output")
    parser.add_argument("--call-timeout", type=float, default=600.0, help="seconds a model call")
    args = parser.parse_args(argv)
    if not args.base_url or not args.model:
        parser.error("set OPENAI_BASE_URL and OPENAI_MODEL (or --base-url and --model)")
    asyncio.run(run_agent(ReferenceAgent(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
