"""What a harness's chat request and a model server's chat reply must look like, checked
before either goes on (server/harness/proxy.py): the request's fields in the JSON types and
ranges OpenAI's chat API gives them, with inline media only; the reply's shape and token
ids. A request out of them is refused (4xx, the policy's doing); a reply out of them is a
fault of the model server (void), never a 500 of this server."""

from __future__ import annotations

from typing import Any

# Media parts the upstream takes inline (a `data:` URL or base64); one naming any other URL
# the model server would fetch itself: a way out of a sandbox that has no route out.
MEDIA = frozenset({"image_url", "input_audio", "video_url", "audio_url"})
MAX_STOP = 4  # OpenAI's limit of stop sequences
# OpenAI's documented ranges (seed: a signed 64-bit integer, as vLLM takes it).
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0, 2), "top_p": (0, 1), "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2), "seed": (-(2**63), 2**63 - 1),
}  # fmt: skip


class Refusal(Exception):
    """A call answered without reaching the upstream (bad request, limit, closed)."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.request: dict[str, Any] | None = None  # the body, when it was parsed


def _strings(value: Any, most: int) -> bool:
    return isinstance(value, list) and len(value) <= most and all(type(v) is str for v in value)


def _fetched(messages: Any) -> str | None:
    """Where a message part is not text or inline media (the upstream would fetch a URL, or
    take raw embeddings); None when every part is."""
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                continue
            if not isinstance(kind, str):  # a list or object is no type (nor hashable)
                return f"messages[{i}].content[{j}]"
            inner = part.get(kind)
            url = inner.get("url", "data:") if isinstance(inner, dict) else None
            if kind not in MEDIA or not isinstance(url, str) or not url.startswith("data:"):
                return f"messages[{i}].content[{j}]"
    return None


def _optional(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _message_error(message: Any) -> str | None:
    """What is wrong with one chat message's JSON types (after its `messages[i]`), or None."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return " must be an object with a string role"
    content = message.get("content")
    if not (content is None or isinstance(content, str | list)):
        return ".content must be a string, a list of parts or null"
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or (kind == "text" and not isinstance(part.get("text"), str)):
            return ".content: each part must be an object with a type (a text part, a string text)"
    for key in ("name", "tool_call_id"):
        if not _optional(message.get(key), str):
            return f".{key} must be a string"
    calls = message.get("tool_calls")
    if not _optional(calls, list):
        return ".tool_calls must be a list"
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)
            and _optional(call.get("id"), str)
        ):
            return ".tool_calls: each must be {id, type, function: {name, arguments}} of strings"
    return None


def _shape_error(fields: dict[str, Any]) -> tuple[str, str] | None:
    """(field, what is wrong) for the first of the harness's fields not in the JSON type
    OpenAI's chat API gives it; None when all are. The upstream is never asked to make
    sense of the rest: its 500 (a fault, void) would be the policy's doing, and a size the
    proxy cannot read would be dropped unsaid."""
    messages = fields.get("messages")
    if not isinstance(messages, list):
        return "messages", "messages must be a list of message objects"
    for i, message in enumerate(messages):
        if (wrong := _message_error(message)) is not None:
            return "messages", f"messages[{i}]{wrong}"
    tools = fields.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        return "tools", "tools must be a list of tool objects"
    choice = fields.get("tool_choice")
    if not (choice is None or isinstance(choice, str | dict)):
        return "tool_choice", "tool_choice must be a string or an object"
    for key in ("max_tokens", "max_completion_tokens", "n"):
        value = fields.get(key)
        if value is not None and (type(value) is not int or value < 1):
            return key, f"{key} must be a positive integer"
    parallel = fields.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        return "parallel_tool_calls", "parallel_tool_calls must be true or false"
    return None


def check_fields(fields: dict[str, Any]) -> None:
    """Refusal naming the first of the harness's fields out of what the upstream is sure to
    take: their JSON types (`_shape_error`), RANGES, inline media only (`_fetched`), at most
    MAX_STOP stop strings."""
    if (wrong := _shape_error(fields)) is not None:
        raise Refusal(400, wrong[1], "invalid_type", wrong[0])
    for key, (low, high) in RANGES.items():
        value = fields.get(key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (
            number and low <= value <= high and (key != "seed" or isinstance(value, int))
        ):
            kind = "an integer" if key == "seed" else "a number"
            raise Refusal(400, f"{key} must be {kind} in [{low}, {high}]", "invalid_value", key)
    if (where := _fetched(fields.get("messages"))) is not None:
        raise Refusal(
            400,
            f"{where}: a part must be text or inline media ({', '.join(sorted(MEDIA))} "
            "with a data: URL); the model server fetches no URL for a sandbox",
            "invalid_value",
            "messages",
        )
    stop = fields.get("stop")
    if not (stop is None or isinstance(stop, str) or _strings(stop, MAX_STOP)):
        raise Refusal(  # each is checked at every token: 10^5 of them, a timeout
            400, f"stop must be a string or at most {MAX_STOP} strings", "invalid_value", "stop"
        )


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return None


def reply_tokens(reply: dict[str, Any]) -> tuple[list[int], list[int], list[float]] | None:
    """(prompt ids, completion ids, logprobs) as the upstream returned them; None when any
    is missing or they disagree in length."""
    choice = reply["choices"][0]
    prompt = _ints(reply.get("prompt_token_ids"))
    completion = _ints(choice.get("token_ids"))
    content = (choice.get("logprobs") or {}).get("content")
    if not prompt or completion is None or not isinstance(content, list):
        return None
    logprobs = [c.get("logprob") if isinstance(c, dict) else None for c in content]
    if len(logprobs) != len(completion) or not all(isinstance(lp, int | float) for lp in logprobs):
        return None
    return prompt, completion, [float(lp) for lp in logprobs]  # type: ignore[arg-type]


def completion_error(reply: dict[str, Any]) -> str | None:
    """What of a 2xx reply is not in the JSON type OpenAI's chat completion gives it (None:
    all is). The model server's shape, never the policy's doing: a fault (void), where
    reading it on would have been a 500 of this server."""
    choice = reply["choices"][0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return "choices[0].message that is no object"
    if not _optional(message.get("content"), str):
        return "choices[0].message.content that is no string"
    calls = message.get("tool_calls")
    if not _optional(calls, list):
        return "choices[0].message.tool_calls that is no list"
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not all(
            _optional(v, str) for v in (call.get("id"), call.get("type"), *function.values())
        ):
            return "a tool call that is no {id, type, function: {name, arguments}} of strings"
    if not _optional(choice.get("finish_reason"), str):
        return "choices[0].finish_reason that is no string"
    if not _optional(choice.get("logprobs"), dict):
        return "choices[0].logprobs that is no object"
    usage = reply.get("usage")
    if not _optional(usage, dict) or not all(
        _optional((usage or {}).get(k), int) for k in ("prompt_tokens", "completion_tokens")
    ):
        return "usage that is no object of token counts"
    return None
