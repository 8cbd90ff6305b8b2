"""What the session proxy says on the wire in OpenAI's dialect: error objects, the reply
type both doors (the sandbox's gateway, the `/llm/` route) write out, and the server-sent
events it synthesizes from a whole chat completion when the harness asked for a stream.

The proxy never streams from the upstream (docs/reference/harness.md, "The session model
proxy"): it needs the whole reply to check and record its token ids before the harness
sees a byte, so a streamed answer is the complete reply cut into OpenAI's chunk shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

JSON = "application/json"
SSE = "text/event-stream"


@dataclass(frozen=True)
class Reply:
    """One HTTP answer of a session: status, body bytes, content type, extra headers."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def json(cls, status: int, payload: object, *headers: tuple[str, str]) -> Reply:
        return cls(status, json.dumps(payload).encode(), JSON, headers)


def error_object(message: str, kind: str, code: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error(status: int, message: str, code: str, param: str | None = None) -> Reply:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return Reply.json(status, error_object(message, kind, code, param))


def chat_chunks(reply: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A whole chat completion (one choice) as OpenAI's `chat.completion.chunk`s: the role,
    the content, each tool call (name and arguments at once), the finish reason, usage."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    head = {
        "id": reply.get("id", ""),
        "object": "chat.completion.chunk",
        "created": reply.get("created", 0),
        "model": reply.get("model", ""),
    }

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, **extra}]}

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]}, logprobs=choice.get("logprobs"))
    for k, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        part = {
            "index": k,
            "id": call.get("id"),
            "type": call.get("type", "function"),
            "function": {"name": function.get("name"), "arguments": function.get("arguments")},
        }
        yield chunk({"tool_calls": [part]})
    last = chunk({}, finish_reason=choice.get("finish_reason"))
    if "usage" in reply:
        last["usage"] = reply["usage"]
    yield last


def openai_sse(reply: dict[str, Any]) -> bytes:
    """The chunks of `reply` as an SSE body, ended by `data: [DONE]`."""
    events = [f"data: {json.dumps(c)}\n\n" for c in chat_chunks(reply)]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def sse_events(events: Iterator[tuple[str, dict[str, Any]]]) -> bytes:
    """Named events (`event: NAME` + `data: JSON`), Anthropic's streaming shape."""
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()
