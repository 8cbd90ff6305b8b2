"""The Open Responses API over an OpenAI chat-completions upstream (the session proxy's
`POST /v1/responses`; the spec openresponses.org names, governed by the AAIF): a harness
that speaks Responses (the `openai` client's `responses.create`, NeMo Gym's model servers,
AReaL's bridge) is served by the same vLLM-style endpoint, and the call is recorded from
the chat reply (its token ids) like any other.

`to_chat` turns a Responses request into a chat request: `instructions` and system or
developer messages, text (and inline image) parts, `function_call` and
`function_call_output` items, function tools, tool_choice, max_output_tokens, sampling.
`from_chat` turns the chat reply into a Response resource (a message item, one
`function_call` item per tool call, logprobs when `include` asks for them); `response_sse`
cuts a whole Response into the spec's stream events. The proxy is stateless: no
`previous_response_id`, no `item_reference`, nothing stored; what the upstream cannot take
(hosted tools, files, structured output, background) is refused with a message saying
so (ResponsesError, a 400), never dropped silently. Reasoning items a harness sends back
are left out, as Anthropic's thinking blocks are: the chat upstream never sees them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from palaestra.server.harness.wire import sse_events

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # the spec's function name
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
LOGPROBS = "message.output_text.logprobs"
INCLUDES = frozenset({LOGPROBS, "reasoning.encrypted_content"})
SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


class ResponsesError(ValueError):
    """A Responses request this translation refuses (`param`: the field): answered 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _str(item: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    """`item[key]`, a string; ResponsesError naming it otherwise."""
    value = item.get(key, default)
    if not isinstance(value, str):
        raise ResponsesError(f"{where}.{key} must be a string", where.split("[")[0])
    return value


def _part(part: Any, where: str) -> dict[str, Any]:
    """One content part as a chat part: text, or an image given inline (a `data:` URL)."""
    kind = part.get("type") if isinstance(part, dict) else None
    kind = kind if isinstance(kind, str) else None  # a list or object is no type
    if kind in TEXT_PARTS:
        key = "refusal" if kind == "refusal" else "text"
        return {"type": "text", "text": _str(part, key, where)}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url.startswith("data:"):
            raise ResponsesError(
                f"{where}: an input_image needs an inline image_url (a data: URL); the model "
                "server fetches no URL and holds no file ids for a sandbox",
                "input",
            )
        return {"type": "image_url", "image_url": {"url": url}}
    raise ResponsesError(
        f"{where}: content part type {kind!r} is not supported (input_text, output_text, "
        "refusal, input_image with a data: URL)",
        "input",
    )


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: a string stays one; text-only parts are joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesError(f"{where}.content must be a string or a list of parts", "input")
    parts = [_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    given = item.get("role")
    role = ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise ResponsesError(
            f"{where}.role must be one of user, assistant, system, developer", "input"
        )
    content = _content(item.get("content", ""), where)
    if role != "user" and not isinstance(content, str):
        raise ResponsesError(f"{where}: a {role} message takes text parts only", "input")
    return {"role": role, "content": content}


def _output(item: dict[str, Any], where: str) -> str:
    """A function_call_output's output as the tool message's text."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    content = _content(output, where) if isinstance(output, list) else None
    if not isinstance(content, str):
        raise ResponsesError(f"{where}.output must be a string or a list of text parts", "input")
    return content


def _items(items: list[Any], messages: list[dict[str, Any]]) -> None:
    """Append the chat messages of `input` items to `messages`: consecutive function_call
    items join one assistant message (its tool calls), each output a `tool` message."""
    for k, item in enumerate(items):
        where = f"input[{k}]"
        if not isinstance(item, dict):
            raise ResponsesError(f"{where} must be an object (an input item)", "input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            function = {"name": _str(item, "name", where),
                        "arguments": _str(item, "arguments", where)}  # fmt: skip
            call = {"id": _str(item, "call_id", where), "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _str(item, "call_id", where)
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _output(item, where)})  # fmt: skip
        elif kind != "reasoning":  # the upstream never sees reasoning items
            raise ResponsesError(
                f"{where}: item type {kind!r} is not supported (message, function_call, "
                "function_call_output, reasoning); this proxy is stateless: send the whole "
                "conversation, no item_reference",
                "input",
            )


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as chat functions; ResponsesError for any other (a tool left out
    unsaid would leave the model without it, the harness none the wiser)."""
    if not isinstance(tools, list):
        raise ResponsesError("tools must be a list of function tools", "tools")
    functions = []
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ResponsesError(
                f"{where}: tool type {kind!r} is not supported (only function tools: the "
                "harness runs its tools itself)",
                "tools",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ResponsesError(f"{where}.name must match ^[a-zA-Z0-9_-]{{1,64}}$", "tools")
        schema = tool.get("parameters")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise ResponsesError(f"{where}.parameters must be a JSON Schema object", "tools")
        function: dict[str, Any] = {"name": name}  # OpenAI's key order: templates keep it
        if tool.get("description") is not None:
            function["description"] = _str(tool, "description", where)
        function["parameters"] = schema
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise ResponsesError(
        "tool_choice must be auto, none, required or {type: function, name}", "tool_choice"
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """ResponsesError for a field asking what a stateless proxy over chat cannot do."""
    for key in ("previous_response_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise ResponsesError(
                f"{key} is not supported: this proxy stores nothing; send the whole "
                "conversation as input",
                key,
            )
    if body.get("background"):
        raise ResponsesError("background is not supported: the call is answered at once",
                             "background")  # fmt: skip
    text = body.get("text")
    kind = (text.get("format") or {}).get("type", "text") if isinstance(text, dict) else "text"
    if text is not None and (not isinstance(text, dict) or kind != "text"):
        raise ResponsesError("text.format must be {type: text}: no structured output here",
                             "text")  # fmt: skip
    include = body.get("include")
    if include is not None and not (
        isinstance(include, list) and all(isinstance(i, str) and i in INCLUDES for i in include)
    ):
        raise ResponsesError(f"include may name only {', '.join(sorted(INCLUDES))}", "include")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise ResponsesError(
            f"top_logprobs must be 0: include {LOGPROBS!r} for each token's logprob",
            "top_logprobs",
        )


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request of a Responses request (ResponsesError when refused)."""
    _refuse_unsupported(body)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ResponsesError("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        _items(given, messages)
    else:
        raise ResponsesError("input must be a string or a list of input items", "input")
    if not messages:
        raise ResponsesError("input is empty: give instructions or at least one item", "input")
    chat: dict[str, Any] = {"messages": messages}
    for key in (*SAMPLING, "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    limit = body.get("max_output_tokens")
    if limit is not None:
        if type(limit) is not int or limit < 1:
            raise ResponsesError("max_output_tokens must be a positive integer",
                                 "max_output_tokens")  # fmt: skip
        chat["max_tokens"] = limit
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat reply's token logprobs in the spec's LogProb shape (no alternatives)."""
    content = (choice.get("logprobs") or {}).get("content") or []
    out = []
    for entry in content if isinstance(content, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
            continue
        token = entry.get("token")
        token = token if isinstance(token, str) else ""
        raw = entry.get("bytes")
        ints = isinstance(raw, list) and all(type(b) is int for b in raw)
        data = raw if ints else list(token.encode("utf-8", "replace"))
        out.append({"token": token, "logprob": float(entry["logprob"]), "bytes": data,
                    "top_logprobs": []})  # fmt: skip
    return out


def _uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output_items(request: dict[str, Any], choice: dict[str, Any]) -> list[dict[str, Any]]:
    message = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        items.append({"type": "reasoning", "id": _uid("rs"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}]})  # fmt: skip
    text = message.get("content")
    if isinstance(text, str) and text:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        include = request.get("include")
        if isinstance(include, list) and LOGPROBS in include:
            part["logprobs"] = _logprobs(choice)
        items.append({"type": "message", "id": _uid("msg"), "status": "completed",
                      "role": "assistant", "content": [part]})  # fmt: skip
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append({"type": "function_call", "id": _uid("fc"),
                      "call_id": call.get("id") or _uid("call"),
                      "name": function.get("name") or "",
                      "arguments": function.get("arguments") or "{}",
                      "status": "completed"})  # fmt: skip
    return items


def _echoed_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    tools = request.get("tools") if isinstance(request.get("tools"), list) else []
    return [{"type": "function", "name": t["name"], "description": t.get("description"),
             "parameters": t.get("parameters"),
             "strict": t["strict"] if isinstance(t.get("strict"), bool) else None}
            for t in tools or []]  # fmt: skip


def _number(request: dict[str, Any], key: str, default: float) -> float:
    value = request.get(key)
    return float(value) if isinstance(value, int | float) else default


def from_chat(reply: dict[str, Any], request: dict[str, Any], model: str) -> dict[str, Any]:
    """The Response resource of a chat completion: output items, status, usage; the
    request's parameters echoed as the spec's resource carries them."""
    choice = reply["choices"][0]
    usage = reply.get("usage") or {}
    prompt, completion = (int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens"))
    cut = choice.get("finish_reason") == "length"
    choice_asked = request.get("tool_choice")
    metadata = request.get("metadata")
    instructions = request.get("instructions")
    created = reply.get("created")  # the upstream's; nothing else of it is trusted
    return {
        "id": f"resp_{str(reply.get('id') or uuid.uuid4().hex).removeprefix('chatcmpl-')}",
        "object": "response",
        "created_at": created if type(created) is int else int(time.time()),
        "completed_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": model,
        "previous_response_id": None,
        "instructions": instructions if isinstance(instructions, str) else None,
        "output": _output_items(request, choice),
        "error": None,
        "tools": _echoed_tools(request),
        "tool_choice": choice_asked if choice_asked is not None else "auto",
        "truncation": "disabled",
        "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
        "text": {"format": {"type": "text"}},
        "top_p": _number(request, "top_p", 1.0),
        "presence_penalty": _number(request, "presence_penalty", 0.0),
        "frequency_penalty": _number(request, "frequency_penalty", 0.0),
        "top_logprobs": 0,
        "temperature": _number(request, "temperature", 1.0),
        "reasoning": None,
        "usage": {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": None,
        "store": False,
        "background": False,
        "service_tier": "default",
        "metadata": metadata if isinstance(metadata, dict) else {},
        "safety_identifier": None,
        "prompt_cache_key": None,
    }


def _item_events(k: int, item: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """One output item's events: added, its content (text or arguments) at once, done."""
    where = {"item_id": item["id"], "output_index": k}
    if item["type"] == "message":
        yield "response.output_item.added", {"output_index": k, "item": item | {
            "status": "in_progress", "content": []}}  # fmt: skip
        for j, part in enumerate(item["content"]):
            at = where | {"content_index": j}
            empty = part | {"text": ""} | ({"logprobs": []} if "logprobs" in part else {})
            yield "response.content_part.added", at | {"part": empty}
            yield "response.output_text.delta", at | {
                "delta": part["text"], "logprobs": part.get("logprobs") or []}  # fmt: skip
            yield "response.output_text.done", at | {
                "text": part["text"], "logprobs": part.get("logprobs") or []}  # fmt: skip
            yield "response.content_part.done", at | {"part": part}
    elif item["type"] == "function_call":
        yield "response.output_item.added", {"output_index": k, "item": item | {
            "status": "in_progress", "arguments": ""}}  # fmt: skip
        yield "response.function_call_arguments.delta", where | {"delta": item["arguments"]}
        yield "response.function_call_arguments.done", where | {"arguments": item["arguments"]}
    else:
        yield "response.output_item.added", {"output_index": k, "item": item}
    yield "response.output_item.done", {"output_index": k, "item": item}


def _events(response: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    start = response | {"status": "in_progress", "output": [], "usage": None,
                        "completed_at": None, "incomplete_details": None}  # fmt: skip
    yield "response.created", {"response": start}
    yield "response.in_progress", {"response": start}
    for k, item in enumerate(response["output"]):
        yield from _item_events(k, item)
    yield f"response.{response['status']}", {"response": response}


def response_sse(response: dict[str, Any]) -> bytes:
    """A whole Response as the spec's stream: response.created, response.in_progress,
    each output item's events, response.completed (or response.incomplete); each event
    names its type and carries its sequence_number."""
    numbered = (
        (name, {"type": name, "sequence_number": n, **data})
        for n, (name, data) in enumerate(_events(response))
    )
    return sse_events(numbered)
