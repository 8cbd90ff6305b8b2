"""The built-in bash agent: the smallest harness that owns its loop (docs/harness.md).

It runs inside an episode's sandbox on whatever python3 is there, so it uses the standard
library only. It reads the task's instruction from a file, then loops: one OpenAI
chat-completions call (`$OPENAI_BASE_URL/chat/completions`, model `$OPENAI_MODEL`, tools
`bash` and `submit`; with `--api responses` an Open Responses call to
`$OPENAI_BASE_URL/responses` instead, the conversation as input items), each `bash`
call run in the current directory with a timeout and its output truncated, the output
sent back as the tool's result. It stops on `submit`, on a reply with no tool call (after
one nudge), or after `--max-turns` calls.

Exit status: 0 submitted; 1 stopped without submitting (out of turns, no tool call);
2 the model endpoint failed (HTTP error or unreachable; the message is on stderr).
A `<tool_call>{"name": …, "arguments": {…}}</tool_call>` text reply (hermes) counts as a
tool call, for servers that do not parse tool calls themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

SYSTEM = (
    "You are an agent working in a Linux shell, in the task's working directory. "
    "Run shell commands with the `bash` tool (one command line per call; you see its "
    "output). When the task is done, call `submit`."
)
NUDGE = "Your reply had no tool call. Call `bash` to run a command, or `submit` when done."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command line in the working directory; returns its "
            "exit status and combined output (truncated).",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "End the episode: the task is done.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
SUBMITTED, STOPPED, ENDPOINT_FAILED = 0, 1, 2


class EndpointError(Exception):
    """The model endpoint answered an error or could not be reached (not the model's doing)."""


def post(url: str, body: dict[str, Any], api_key: str, timeout_s: float) -> Any:
    """POST `body` as JSON; the reply's JSON. EndpointError for an error or no answer."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:2000]
        raise EndpointError(f"the model endpoint answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EndpointError(f"the model endpoint could not be reached: {exc}") from None
    except ValueError as exc:
        raise EndpointError(f"the model endpoint's reply is not JSON: {exc}") from None
    return reply


def chat(base_url: str, body: dict[str, Any], api_key: str, timeout_s: float) -> dict[str, Any]:
    """One chat-completions call; the reply's first message."""
    reply = post(base_url.rstrip("/") + "/chat/completions", body, api_key, timeout_s)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError(f"the model endpoint's reply has no choices: {str(reply)[:500]}")
    message: Any = choices[0].get("message")
    return message if isinstance(message, dict) else {}


def responses_body(body: dict[str, Any]) -> dict[str, Any]:
    """A chat request as an Open Responses one: the system message as `instructions`, the
    rest as input items (`message`, `function_call`, `function_call_output`), flat tools."""
    items: list[dict[str, Any]] = []
    tools = [{"type": "function", **t["function"]} for t in body["tools"]]
    out: dict[str, Any] = {"model": body["model"], "input": items, "tools": tools}
    for m in body["messages"]:
        if m["role"] == "system":
            out["instructions"] = m["content"]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": m["content"]})  # fmt: skip
        else:
            if m.get("content"):
                items.append({"type": "message", "role": m["role"], "content": m["content"]})
            for c in m.get("tool_calls") or []:
                items.append({"type": "function_call", "call_id": c["id"],
                              "name": c["function"]["name"],
                              "arguments": c["function"]["arguments"]})  # fmt: skip
    if body.get("max_tokens"):
        out["max_output_tokens"] = body["max_tokens"]
    return out


def respond(base_url: str, body: dict[str, Any], api_key: str, timeout_s: float) -> dict[str, Any]:
    """One Open Responses call for the chat request `body`; its output as a chat message
    (the text of its message items, its function_call items as tool calls)."""
    reply = post(base_url.rstrip("/") + "/responses", responses_body(body), api_key, timeout_s)
    output = reply.get("output") if isinstance(reply, dict) else None
    if not isinstance(output, list):
        raise EndpointError(f"the model endpoint's reply has no output: {str(reply)[:500]}")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in (i for i in output if isinstance(i, dict)):
        if item.get("type") == "message":
            content = item.get("content")
            parts: list[Any] = content if isinstance(content, list) else []
            texts += [p["text"] for p in parts
                      if isinstance(p, dict) and isinstance(p.get("text"), str)]  # fmt: skip
        elif item.get("type") == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
            calls.append({"id": item.get("call_id"), "type": "function", "function": function})
    return {"content": "".join(texts) or None, "tool_calls": calls}


def tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message's tool calls, structured; else parsed from hermes blocks in its text."""
    calls = message.get("tool_calls") or []
    if calls:
        return [c for c in calls if isinstance(c, dict)]
    found = []
    for k, block in enumerate(HERMES.findall(message.get("content") or "")):
        try:
            call = json.loads(block)
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            found.append(
                {
                    "id": f"call_text_{k}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(arguments)},
                }
            )
    return found


class _Output:
    """Reads a command's output as it comes, keeping the first `cap` bytes: a command that
    floods its output (`yes`) costs the agent no memory, only the count."""

    def __init__(self, pipe: Any, cap: int) -> None:
        self.kept = bytearray()
        self.total = 0
        self.cap = cap
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe: Any) -> None:
        while True:
            chunk = pipe.read1(65536)
            if not chunk:
                return
            self.total += len(chunk)
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]


def run_bash(command: str, timeout_s: float, limit: int) -> str:
    """Run `command` with bash in the current directory; its status and output, truncated.
    The command gets its own process group, killed whole at the timeout. A background
    process it leaves running may hold the output open: it is read for one more second
    after bash exits, then the result goes back without waiting for it."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = _Output(proc.stdout, cap=4 * limit + 4)  # a character is at most 4 bytes
    try:
        head = f"exit status {proc.wait(timeout=timeout_s)}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        head = f"timed out after {timeout_s:g} s (killed)"
    output.thread.join(timeout=1.0)
    total = output.total
    text = bytes(output.kept).decode(errors="replace")
    if len(text) > limit or total > len(output.kept):
        text = text[:limit] + f"\n[output truncated: {total} bytes, {limit} characters shown]"
    return f"{head}\n{text}"


def call_result(call: dict[str, Any], args: argparse.Namespace) -> str | None:
    """The tool result for one call; None for `submit`."""
    function = call.get("function") or {}
    name = function.get("name")
    if name == "submit":
        return None
    if name != "bash":
        return f"error: unknown tool {name!r}; the tools are `bash` and `submit`"
    raw = function.get("arguments")
    try:
        arguments = raw if isinstance(raw, dict) else json.loads(raw or "{}")
    except (TypeError, ValueError):
        return 'error: the arguments are not JSON; send {"command": "..."}'
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if not isinstance(command, str) or not command.strip():
        return 'error: `bash` needs {"command": "<a command line>"}'
    return run_bash(command, args.command_timeout, args.output_limit)


def loop(args: argparse.Namespace, instruction: str) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": instruction},
    ]
    nudged = False
    for _ in range(args.max_turns):
        body: dict[str, Any] = {"model": args.model, "messages": messages, "tools": TOOLS}
        if args.max_tokens:
            body["max_tokens"] = args.max_tokens
        ask = respond if args.api == "responses" else chat
        message = ask(args.base_url, body, args.api_key, args.call_timeout)
        calls = tool_calls(message)
        assistant: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if not calls:
            if nudged:
                print("bash-agent: a second reply with no tool call; stopping", file=sys.stderr)
                return STOPPED
            nudged = True
            messages.append({"role": "user", "content": NUDGE})
            continue
        for call in calls:
            result = call_result(call, args)
            if result is None:
                return SUBMITTED
            messages.append(
                {"role": "tool", "tool_call_id": str(call.get("id", "")), "content": result}
            )
    print(f"bash-agent: out of turns ({args.max_turns}); stopping", file=sys.stderr)
    return STOPPED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="palaestra's built-in bash agent")
    parser.add_argument("--instruction-file", required=True, help="the task's instruction")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", ""))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", ""))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--max-turns", type=int, default=30, help="model calls at most")
    parser.add_argument("--command-timeout", type=float, default=60.0, help="seconds a command")
    parser.add_argument("--output-limit", type=int, default=10_000, help="characters a result")
    parser.add_argument("--max-tokens", type=int, default=0, help="a reply's (0: the server's)")
    parser.add_argument("--api", choices=("chat", "responses"), default="chat",
                        help="the model API: chat completions or Open Responses")  # fmt: skip
    parser.add_argument("--call-timeout", type=float, default=600.0, help="seconds a model call")
    args = parser.parse_args(argv)
    if not args.base_url or not args.model:
        parser.error("set OPENAI_BASE_URL and OPENAI_MODEL (or --base-url and --model)")
    if args.max_turns < 1:
        parser.error("--max-turns must be at least 1")
    with open(args.instruction_file, encoding="utf-8") as f:
        instruction = f.read()
    try:
        return loop(args, instruction)
    except EndpointError as exc:
        print(f"bash-agent: {exc}", file=sys.stderr)
        return ENDPOINT_FAILED


if __name__ == "__main__":
    sys.exit(main())
