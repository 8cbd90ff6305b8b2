"""palaestra's ACP client: drives an Agent Client Protocol agent for one episode (docs/harness.md).

It runs inside the episode's sandbox (standard library only, on the sandbox's python3) as
the harness's process. It starts the agent (the argv after `--`) as its child and speaks
ACP to it over the child's stdio, newline-delimited JSON-RPC 2.0, in one persistent
session: `initialize` (protocol version 1; it offers fs read/write and terminals),
`session/new` with the workspace as cwd, then one `session/prompt` with the task's
instruction. While the turn runs it answers the agent's requests: `fs/read_text_file`,
`fs/write_text_file` (absolute paths inside the workspace only, symlinks resolved),
`terminal/*` (processes it runs in the workspace, their output bounded),
`session/request_permission` (the first allow option: the sandbox is the wall), and reads
the `session/update` notifications. When the prompt turn ends (its stop reason) the agent
is stopped and the client exits; the episode is then verified.

Its last stdout line is `palaestra-acp: {json}` (how the session ended, what it did); the
exit status says the same: 0 the turn ended with `end_turn`; 1 another stop reason;
3 the agent broke the protocol (a malformed message, a reply to no request, a line past
the limit, a wrong protocol version); 4 the agent exited before its turn ended;
5 the agent answered an ACP request of the client with an error.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import stat
import sys
from typing import Any

MARKER = "palaestra-acp: "
PROTOCOL_VERSION = 1
STOP_REASONS = ("end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled")
END_TURN, OTHER_STOP, PROTOCOL_ERROR, AGENT_EXITED, AGENT_ERROR = 0, 1, 3, 4, 5
MAX_TERMINALS = 16
MAX_HANDLING = 64  # of the agent's requests answered at once; past it, refused at once
MAX_OUTPUT = 1 << 20  # bytes of a terminal's output kept at most (its tail)
MAX_FILE = 8 << 20  # bytes of a file read or written at most
INVALID_PARAMS, METHOD_NOT_FOUND, INTERNAL = -32602, -32601, -32603


class ProtocolFault(Exception):
    """The agent broke ACP: the session cannot go on."""


class AgentError(Exception):
    """The agent answered one of the client's requests with a JSON-RPC error."""


class AgentGone(Exception):
    """The agent's stdout closed (it exited) while the client waited on it."""


class RpcError(Exception):
    """The client's error answer to one of the agent's requests."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Terminal:
    """One `terminal/create` process: its own process group, its output's tail kept."""

    def __init__(self, proc: asyncio.subprocess.Process, limit: int) -> None:
        self.proc, self.limit = proc, limit
        self.output = bytearray()
        self.truncated = False
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := await self.proc.stdout.read(65536):
            self.output += chunk
            if len(self.output) > self.limit:
                del self.output[: len(self.output) - self.limit]
                self.truncated = True

    def exit_status(self) -> dict[str, Any] | None:
        code = self.proc.returncode
        if code is None:
            return None
        if code < 0:
            return {"exitCode": None, "signal": signal_name(-code)}
        return {"exitCode": code, "signal": None}

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class Client:
    """The ACP client side of one session with the agent process `proc`."""

    def __init__(self, proc: asyncio.subprocess.Process, workspace: str) -> None:
        self.proc = proc
        self.workspace = os.path.realpath(workspace)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.terminals: dict[str, Terminal] = {}
        self.counts: dict[str, int] = {}  # messages by method (the client's, else "other")
        self.refused: collections.deque[str] = collections.deque(maxlen=20)  # the last ones
        self.handlers: set[asyncio.Task[None]] = set()

    # -- the wire ------------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        try:
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise AgentGone("the agent closed its stdin") from None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        await self.send({"id": self.next_id, "method": method, "params": params})
        return await future

    async def listen(self) -> None:
        """Read the agent's messages until its stdout closes; a fault fails every wait."""
        assert self.proc.stdout is not None
        try:
            while True:
                try:
                    line = await self.proc.stdout.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    raise ProtocolFault(f"a message longer than {MAX_FILE * 2} bytes") from None
                if not line:
                    raise AgentGone("the agent closed its stdout (it exited)")
                if line.strip():
                    self.dispatch(parse(line))
        except (ProtocolFault, AgentGone) as exc:
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(exc)
            raise

    def dispatch(self, message: dict[str, Any]) -> None:
        method, key = message.get("method"), message.get("id")
        if method is None:  # a response to one of ours
            future = self.pending.pop(key, None) if isinstance(key, int) else None
            if future is None:
                raise ProtocolFault(f"a response to no request of the client (id {key!r})")
            if "error" in message:
                future.set_exception(AgentError(describe_error(message["error"])))
            elif "result" in message:
                future.set_result(message["result"])
            else:
                raise ProtocolFault(f"a response (id {key!r}) with neither result nor error")
            return
        if not isinstance(method, str):
            raise ProtocolFault(f"a method that is not a string: {method!r}"[:300])
        params = message.get("params", {})
        if params is None:
            params = {}
        counted = method if method in HANDLERS or method == "session/update" else "other"
        self.counts[counted] = self.counts.get(counted, 0) + 1
        if "id" not in message:
            return  # a notification (session/update, ...): read, nothing to answer
        if not isinstance(key, int | str) or isinstance(key, bool):
            raise ProtocolFault(f"a request id that is neither number nor string: {key!r}"[:300])
        if len(self.handlers) >= MAX_HANDLING:
            busy = RpcError(INTERNAL, f"{MAX_HANDLING} requests are being answered; wait")
            task = asyncio.ensure_future(self.answer(key, method, busy))
        else:
            task = asyncio.ensure_future(self.answer(key, method, params))
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)

    async def answer(self, key: int | str, method: str, params: Any) -> None:
        try:
            if isinstance(params, RpcError):
                raise params
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, f"{method}: params must be an object")
            handler = HANDLERS.get(method)
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"the client does not offer {method!r}"[:300])
            result = await handler(self, params)
            reply: dict[str, Any] = {"id": key, "result": result}
        except RpcError as exc:
            self.refused.append(f"{method}: {exc}"[:300])
            reply = {"id": key, "error": {"code": exc.code, "message": str(exc)}}
        except OSError as exc:
            self.refused.append(f"{method}: {exc}"[:300])
            reply = {"id": key, "error": {"code": INTERNAL, "message": f"{method}: {exc}"}}
        except (TypeError, ValueError, LookupError) as exc:  # params of odd types or values
            self.refused.append(f"{method}: {exc}"[:300])
            message = f"{method}: invalid params ({type(exc).__name__}: {exc})"[:300]
            reply = {"id": key, "error": {"code": INVALID_PARAMS, "message": message}}
        except Exception as exc:  # any other: still answered, or the agent waits on it
            self.refused.append(f"{method}: {exc!r}"[:300])
            message = f"{method}: the client failed ({type(exc).__name__})"
            reply = {"id": key, "error": {"code": INTERNAL, "message": message}}
        with contextlib.suppress(AgentGone):  # it exited: nothing to answer
            await self.send(reply)

    # -- fs -------------------------------------------------------------------------------
    def inside(self, params: dict[str, Any], name: str = "path") -> str:
        """`params[name]`: an absolute path that, every symlink resolved, is in the workspace."""
        path = params.get(name)
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise RpcError(INVALID_PARAMS, f"{name} must be an absolute path, got {path!r}"[:300])
        real = os.path.realpath(path)
        if real != self.workspace and not real.startswith(self.workspace + os.sep):
            raise RpcError(
                INVALID_PARAMS, f"{path} is outside the workspace {self.workspace}"[:300]
            )
        return real

    async def read_text_file(self, params: dict[str, Any]) -> dict[str, Any]:
        path = self.inside(params)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RpcError(INVALID_PARAMS, f"{path} is not a regular file")
            data = f.read(MAX_FILE + 1)
        if len(data) > MAX_FILE:
            raise RpcError(INVALID_PARAMS, f"{path} is over {MAX_FILE} bytes")
        text = data.decode("utf-8", errors="replace")
        line, limit = params.get("line"), params.get("limit")
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max(int(line) - 1, 0) if isinstance(line, int) else 0
            end = start + int(limit) if isinstance(limit, int) and limit >= 0 else None
            text = "".join(lines[start:end])
        return {"content": text}

    async def write_text_file(self, params: dict[str, Any]) -> None:
        path = self.inside(params)
        content = params.get("content")
        if not isinstance(content, str):
            raise RpcError(INVALID_PARAMS, "content must be a string")
        data = content.encode("utf-8", errors="surrogatepass")
        if len(data) > MAX_FILE:
            raise RpcError(INVALID_PARAMS, f"content is over {MAX_FILE} bytes")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return None

    # -- terminals ------------------------------------------------------------------------
    async def create_terminal(self, params: dict[str, Any]) -> dict[str, Any]:
        command, args = params.get("command"), params.get("args") or []
        if not isinstance(command, str) or not command:
            raise RpcError(INVALID_PARAMS, "command must be a non-empty string")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RpcError(INVALID_PARAMS, "args must be a list of strings")
        cwd = self.inside(params, "cwd") if params.get("cwd") is not None else self.workspace
        env = dict(os.environ)
        for var in params.get("env") or []:
            if not isinstance(var, dict) or not isinstance(var.get("name"), str):
                raise RpcError(INVALID_PARAMS, "env must be a list of {name, value}")
            env[var["name"]] = str(var.get("value", ""))
        limit = params.get("outputByteLimit")
        limit = min(limit, MAX_OUTPUT) if isinstance(limit, int) and limit > 0 else MAX_OUTPUT
        if len(self.terminals) >= MAX_TERMINALS:
            raise RpcError(INVALID_PARAMS, f"{MAX_TERMINALS} terminals at most: release one")
        proc = await asyncio.create_subprocess_exec(
            command, *args, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.next_id += 1
        terminal_id = f"term-{self.next_id}"
        self.terminals[terminal_id] = Terminal(proc, limit)
        return {"terminalId": terminal_id}

    def terminal(self, params: dict[str, Any]) -> Terminal:
        terminal = self.terminals.get(params.get("terminalId"))  # type: ignore[arg-type]
        if terminal is None:
            raise RpcError(INVALID_PARAMS, f"no terminal {params.get('terminalId')!r}"[:300])
        return terminal

    async def terminal_output(self, params: dict[str, Any]) -> dict[str, Any]:
        terminal = self.terminal(params)
        if terminal.proc.returncode is not None:
            await asyncio.wait({terminal.reader}, timeout=1.0)  # what it printed last
        output = bytes(terminal.output).decode("utf-8", errors="replace")
        return {
            "output": output,
            "truncated": terminal.truncated,
            "exitStatus": terminal.exit_status(),
        }

    async def wait_for_exit(self, params: dict[str, Any]) -> dict[str, Any]:
        terminal = self.terminal(params)
        await terminal.proc.wait()
        await asyncio.wait({terminal.reader}, timeout=1.0)
        return terminal.exit_status() or {}

    async def kill_terminal(self, params: dict[str, Any]) -> None:
        self.terminal(params).kill()
        return None

    async def release_terminal(self, params: dict[str, Any]) -> None:
        self.terminal(params).kill()
        self.terminals.pop(params["terminalId"]).reader.cancel()
        return None

    # -- permission -----------------------------------------------------------------------
    async def request_permission(self, params: dict[str, Any]) -> dict[str, Any]:
        """The first allow option (the sandbox, not a person, bounds what the agent does)."""
        options = params.get("options")
        if not isinstance(options, list):
            raise RpcError(INVALID_PARAMS, "options must be a list")
        allowed = [
            o for o in options
            if isinstance(o, dict) and o.get("kind") in ("allow_once", "allow_always")
            and isinstance(o.get("optionId"), str)
        ]  # fmt: skip
        if not allowed:
            return {"outcome": {"outcome": "cancelled"}}
        return {"outcome": {"outcome": "selected", "optionId": allowed[0]["optionId"]}}

    async def close(self) -> None:
        for terminal in self.terminals.values():
            terminal.kill()
        for task in self.handlers:
            task.cancel()


HANDLERS = {
    "fs/read_text_file": Client.read_text_file,
    "fs/write_text_file": Client.write_text_file,
    "terminal/create": Client.create_terminal,
    "terminal/output": Client.terminal_output,
    "terminal/wait_for_exit": Client.wait_for_exit,
    "terminal/kill": Client.kill_terminal,
    "terminal/release": Client.release_terminal,
    "session/request_permission": Client.request_permission,
}


def signal_name(number: int) -> str:
    """A signal's name, those Python has none for too (SIGRTMIN+1: an agent's `kill -35`)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low = int(signal.SIGRTMIN)
        return f"SIGRTMIN+{number - low}" if number > low else f"SIG{number}"


def parse(line: bytes) -> dict[str, Any]:
    """One JSON-RPC 2.0 message of the agent's, or the fault that it is not one."""
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise ProtocolFault(f"a line that is not JSON ({exc}): {line[:200]!r}") from None
    if not isinstance(message, dict):
        raise ProtocolFault(f"a message that is not a JSON object: {line[:200]!r}")
    if message.get("jsonrpc") != "2.0":
        raise ProtocolFault(f'a message without "jsonrpc": "2.0": {line[:200]!r}')
    return message


def describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('code')}: {str(error.get('message'))[:500]}"
    return str(error)[:500]


async def session(client: Client, instruction: str) -> str:
    """initialize, session/new, session/prompt: the turn's stop reason."""
    init = await client.request(
        "initialize",
        {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": True, "writeTextFile": True},
                "terminal": True,
            },
            "clientInfo": {"name": "palaestra", "version": "1"},
        },
    )
    version = init.get("protocolVersion") if isinstance(init, dict) else None
    if version != PROTOCOL_VERSION:
        raise ProtocolFault(f"initialize answered protocol version {version!r}; the client "
                            f"speaks {PROTOCOL_VERSION}")  # fmt: skip
    new = await client.request("session/new", {"cwd": client.workspace, "mcpServers": []})
    session_id = new.get("sessionId") if isinstance(new, dict) else None
    if not isinstance(session_id, str) or not session_id:
        raise ProtocolFault(f"session/new answered no sessionId: {str(new)[:200]}")
    prompt = [{"type": "text", "text": instruction}]
    result = await client.request("session/prompt", {"sessionId": session_id, "prompt": prompt})
    stop = result.get("stopReason") if isinstance(result, dict) else None
    if stop not in STOP_REASONS:
        raise ProtocolFault(f"session/prompt answered no known stopReason: {str(result)[:200]}")
    return str(stop)


async def drive(agent: list[str], workspace: str, instruction: str) -> tuple[int, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        *agent, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        cwd=workspace, limit=MAX_FILE * 2, start_new_session=True,
    )  # fmt: skip
    client = Client(proc, workspace)
    listener = asyncio.ensure_future(client.listen())
    end: dict[str, Any] = {}
    try:
        turn = asyncio.ensure_future(session(client, instruction))
        await asyncio.wait({turn, listener}, return_when=asyncio.FIRST_COMPLETED)
        if not turn.done() and listener.done():  # a fault before the turn's end
            turn.cancel()
            listener.result()
        stop = turn.result()
        code, end = (END_TURN if stop == "end_turn" else OTHER_STOP), {"end": "stop"}
        end["stop_reason"] = stop
    except ProtocolFault as exc:
        code, end = PROTOCOL_ERROR, {"end": "protocol_error", "detail": str(exc)[:1000]}
    except AgentGone as exc:
        code, end = AGENT_EXITED, {"end": "agent_exited", "detail": str(exc)}
    except AgentError as exc:
        code, end = AGENT_ERROR, {"end": "agent_error", "detail": str(exc)[:1000]}
    finally:
        listener.cancel()
        await client.close()
        await stop_agent(proc)
    end.update(messages=client.counts, refused=list(client.refused), agent_exit=proc.returncode)
    return code, end


async def stop_agent(proc: asyncio.subprocess.Process) -> None:
    """Close the agent's stdin, give it a moment, then kill its process group."""
    if proc.stdin is not None:
        proc.stdin.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 2.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="palaestra's ACP client (one prompt turn)")
    parser.add_argument("--instruction-file", required=True, help="the task's instruction")
    parser.add_argument("--workspace", default=os.getcwd(), help="the session's cwd")
    parser.add_argument("agent", nargs=argparse.REMAINDER, help="-- the agent's argv")
    args = parser.parse_args(argv)
    agent = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    if not agent:
        parser.error("give the agent's argv after --")
    with open(args.instruction_file, encoding="utf-8") as f:
        instruction = f.read()
    code, end = asyncio.run(drive(agent, args.workspace, instruction))
    print(MARKER + json.dumps(end), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
