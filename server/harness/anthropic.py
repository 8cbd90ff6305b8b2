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
        parts.append(str(block.get("text", "")))
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
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            body = _text_of(block.get("content", ""), where)
            if block.get("is_error"):
                body = f"Error: {body}"
            tools.append(
                {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": body}
            )
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
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": arguments},
                }
            )
        elif kind not in ("thinking", "redacted_thinking"):  # the upstream never sees them
            raise MessagesError(
                f"messages[{k}].content[{j}]: block type {kind!r} is not supported (text, tool_use)"
            )
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


def to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request of a Messages request (MessagesError when refused)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    if body.get("system"):
        out.append({"role": "system", "content": _text_of(body["system"], "system")})
    for k, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out.extend(_user(m.get("content", ""), k))
        elif role == "assistant":
            out.append(_assistant(m.get("content", ""), k))
        else:
            raise MessagesError(f"messages[{k}].role must be 'user' or 'assistant'")
    chat: dict[str, Any] = {"messages": out}
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise MessagesError("max_tokens is required: a positive integer")
    chat["max_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p", "top_k"):
        if key in body:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {"type": "object"},
                },
            }
            for t in body["tools"]
            if isinstance(t, dict)
        ]
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
            "input_tokens": int(usage.get("prompt_tokens", 0)),
            "output_tokens": int(usage.get("completion_tokens", 0)),
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
