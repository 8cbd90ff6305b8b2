"""Anthropic's Messages API over an OpenAI chat-completions upstream (the session proxy's
`POST /v1/messages`): a harness that speaks Anthropic (Claude Code, the anthropic SDK) is
served by the same vLLM-style endpoint, and the call is recorded from the OpenAI reply
(its token ids) like any other.

`to_openai` turns a Messages request into a chat request (system, text, tool_use and
tool_result blocks, tools with input_schema, tool_choice, stop sequences); `from_openai`
turns the chat reply back into a Message (stop_reason, usage); `message_sse` cuts a whole
Message into Anthropic's stream events. Blocks the upstream cannot take (images,
documents) are refused with a message saying so, never dropped silently.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from palaestra.server.harness.wire import Reply, sse_events

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    529: "overloaded_error",
}


class MessagesError(ValueError):
    """A Messages request this translation refuses: answered 400 saying what to change."""


def anthropic_error(status: int, message: str) -> Reply:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return Reply.json(status, {"type": "error", "error": {"type": kind, "message": message}})


def _str(block: dict[str, Any], key: str, where: str, default: str = "") -> str:
    """`block[key]`, a string (`default` when absent); MessagesError naming it otherwise:
    nothing the harness sent is turned into something else or dropped unsaid."""
    value = block.get(key, default)
    if not isinstance(value, str):
        raise MessagesError(f"{where}.{key} must be a string, not {type(value).__name__}")
    return value


def _text_of(content: Any, where: str) -> str:
    """A string, or a list of text blocks joined (tool_result and system content)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessagesError(f"{where}: content must be a string or a list of text blocks")
    parts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise MessagesError(f"{where}: only text blocks are supported here, not {kind!r}")
        parts.append(_str(block, "text", where))
    return "".join(parts)


def _user(content: Any, k: int) -> list[dict[str, Any]]:
    """A user turn: tool results become `tool` messages (first), text one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise MessagesError(f"messages[{k}].content must be a string or a list of blocks")
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        where = f"messages[{k}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_str(block, "text", where))
        elif kind == "tool_result":
            body = _text_of(block.get("content", ""), where)
            if block.get("is_error"):
                body = f"Error: {body}"
            call_id = _str(block, "tool_use_id", where)
            tools.append({"role": "tool", "tool_call_id": call_id, "content": body})
        else:
            raise MessagesError(
                f"{where}: block type {kind!r} is not supported (text, tool_result)"
            )
    return tools + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def _assistant(content: Any, k: int) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise MessagesError(f"messages[{k}].content must be a string or a list of blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"messages[{k}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_str(block, "text", where))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise MessagesError(f"{where}.input must be an object")
            function = {"name": _str(block, "name", where), "arguments": json.dumps(arguments)}
            calls.append({"id": _str(block, "id", where), "type": "function", "function": function})
        elif kind not in ("thinking", "redacted_thinking"):  # the upstream never sees them
            raise MessagesError(f"{where}: block type {kind!r} is not supported (text, tool_use)")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise MessagesError("tool_choice must be {type: auto | any | none | tool (with name)}")


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Anthropic's tools as OpenAI functions; MessagesError for any that is not a tool (a
    tool left out unsaid would leave the model without it, the harness none the wiser)."""
    if not isinstance(tools, list):
        raise MessagesError("tools must be a list of {name, description?, input_schema}")
    functions = []
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise MessagesError(f"{where} must be an object {{name, description?, input_schema}}")
        schema = tool.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise MessagesError(f"{where}.input_schema must be a JSON Schema object")
        function = {
            "name": _str(tool, "name", where),
            "description": _str(tool, "description", where),
            "parameters": schema or {"type": "object"},
        }
        if not function["name"]:
            raise MessagesError(f"{where}.name is required")
        functions.append({"type": "function", "function": function})
    return functions


def to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request of a Messages request (MessagesError when refused)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    system = _text_of(body["system"], "system") if body.get("system") is not None else ""
    if system:
        out.append({"role": "system", "content": system})
    for k, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out.extend(_user(m.get("content", ""), k))
        elif role == "assistant":
            out.append(_assistant(m.get("content", ""), k))
        else:
            raise MessagesError(f"messages[{k}].role must be 'user' or 'assistant'")
    chat: dict[str, Any] = {"messages": out}
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        raise MessagesError("max_tokens is required: a positive integer")
    chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "top_k"):
        if key in body:
            chat[key] = body[key]
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
            raise MessagesError("stop_sequences must be a list of strings")
        if stop:
            chat["stop"] = stop
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def from_openai(reply: dict[str, Any], model: str) -> dict[str, Any]:
    """The Messages reply of a chat completion: text and tool_use blocks, stop_reason."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = {"_raw": function.get("arguments")}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                "name": function.get("name", ""),
                "input": args if isinstance(args, dict) else {"_value": args},
            }
        )
    finish = choice.get("finish_reason")
    stop_sequence = choice.get("stop_reason")  # vLLM: the stop string that ended it
    stop_reason = STOP_REASONS.get(finish or "", "end_turn")
    if finish == "stop" and isinstance(stop_sequence, str):
        stop_reason = "stop_sequence"
    usage = reply.get("usage") or {}
    return {
        "id": f"msg_{str(reply.get('id', uuid.uuid4().hex)).removeprefix('chatcmpl-')}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


def _events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    usage = message["usage"]
    start = message | {
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0},
    }
    yield "message_start", {"type": "message_start", "message": start}
    for k, block in enumerate(message["content"]):
        if block["type"] == "text":
            first: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": k, "content_block": first},
        )
        yield "content_block_delta", {"type": "content_block_delta", "index": k, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": k}
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": stop,
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def message_sse(message: dict[str, Any]) -> bytes:
    """A whole Message as Anthropic's stream: message_start, one content block start /
    delta / stop each, message_delta (stop reason, usage), message_stop."""
    return sse_events(_events(message))
