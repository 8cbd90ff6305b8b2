"""MCP for one episode's tools: a JSON-RPC 2.0 handler that any transport drives.

The door's HTTP route (server/doors/mcp_http.py) and the OpenEnv door's MCP endpoint and
WebSocket `mcp` frame share it. Its interface, kept stable:

- `McpEpisode(tools, step)`: what a transport gives: the episode's tools (`ToolSpec`s,
  the OpenAI function shape) and `step(action) -> StepResponse`, the episode manager's
  step for the caller's episode (raising `PalaestraError` as the manager does).
- `McpSession()`: the state of one MCP session: `protocol_version`, the version
  `initialize` negotiated (None before), `initialized` (the client's notification came), and
  `stateless`: the transport chose 2026-07-28, so every request must carry its envelope.
- `await handle(message, episode, session, max_batch=...)`: one parsed JSON-RPC message or
  batch in; out the reply to send (a response object, a list for a batch), or None when
  nothing is due (notifications and client responses only).
- `await handle_bytes(raw, episode, session, max_batch=...)`: the same from a raw body
  (-32700 on bad JSON).
- `await decode(raw, max_batch)`: a raw body parsed as `handle` takes it, a batch one message
  at a time (RpcError: -32700, or -32600 past `max_batch`, before the rest is parsed);
  `await encode(reply)`: the reply's JSON text; `status_of(reply)`: the HTTP status a
  transport-level error asks for (its `data.status`), else None.
- `SUPPORTED_VERSIONS` (`HANDSHAKE_VERSIONS` through initialize, then `MODERN_VERSIONS`),
  `LATEST_VERSION` (initialize's counter-offer), and `version_error(requested)`: the JSON-RPC
  error object refusing a protocol version (code -32022, `data: {supported, requested}`),
  for a transport's own version checks (the HTTP `MCP-Protocol-Version` header).
- `is_modern(message)` and `modern_version(params)`: whether a message is of the stateless
  2026-07-28 era, and the version its `_meta` envelope names (RpcError -32602 for a missing
  or malformed envelope, -32022 for a version not served statelessly).
- `episode_error(exc)`: the JSON-RPC error object for a `PalaestraError` (`ERROR_CODES`);
  `error_response(id, error)` and `is_initialize(message)`: for transports.

Bounded work per request (issue 34): a batch holds at most `max_batch` messages (the
`jsonrpc_max_batch` setting; longer: -32600 naming it, none run), and long work (parsing,
running and encoding a batch) yields to the event loop every `YIELD_EVERY` messages, so no
request holds the loop (other tenants' steps, /healthz) for long. Values a client sent are
clipped to `SHOWN_CHARS` where an error message quotes them.

The era is chosen per request. A request whose `params._meta` carries
`io.modelcontextprotocol/protocolVersion` (and every `server/discover`, and every request of
a `stateless` session) is of the 2026-07-28 revision: no handshake, the version and the
client's capabilities in each request's `_meta`, checked on each; it may call
`server/discover`, `tools/list` and `tools/call`, each result carrying `resultType`
(`initialize` and `ping` are gone from that revision: -32601), and it is never part of a
batch. Any other request is of the session `initialize` negotiated (2024-11-05..2025-11-25):
`initialize`, `ping`, `tools/list`, `tools/call`. Notifications are accepted, never answered.

`tools/call` steps the episode with `{"tool": name, "arguments": ...}`: the observation
becomes content blocks (text, and PNG images); reward, terminated, truncated, verdict, info
and the observation's data go in `structuredContent` (`_meta["palaestra/step"]` on sessions
older than 2025-06-18, which have no structuredContent). A refused action (422) is a tool
result with `isError: true`; an unknown tool is -32602; every other episode error is a
JSON-RPC error whose `data` carries the HTTP status and the /v1 error code (`ERROR_CODES`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import palaestra
from palaestra.sdk.errors import InvalidActionError, PalaestraError
from palaestra.sdk.models import Action, StepResponse, ToolSpec

log = logging.getLogger("palaestra.server")

HANDSHAKE_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS: tuple[str, ...] = ("2026-07-28",)  # stateless: the version in each request
SUPPORTED_VERSIONS: tuple[str, ...] = (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS)
LATEST_VERSION = HANDSHAKE_VERSIONS[-1]  # initialize's answer to a version it does not serve
UNSTRUCTURED = frozenset({"2024-11-05", "2025-03-26"})  # revisions without structuredContent
# The 2026-07-28 request envelope (`params._meta`): the version and capabilities are required.
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"  # a 2026 discover result's stamp
DISCOVER = "server/discover"
TOOLS_TTL_MS = 3_600_000  # an episode's tools never change: a client may cache tools/list
STEP_META = "palaestra/step"
MAX_BATCH = 64  # the `jsonrpc_max_batch` default, for in-process callers without settings
YIELD_EVERY = 16  # messages parsed, run or encoded between yields to the event loop
SHOWN_CHARS = 200  # a client's value, quoted in an error message, at most
SPACE = re.compile(r"[ \t\n\r]*")  # JSON's insignificant whitespace

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020  # the MCP spec's codes (-32020..-32099 are the spec's own)
UNSUPPORTED_VERSION = -32022
# Episode errors by HTTP status, in the implementation-defined range -32003..-32019.
ERROR_CODES: dict[int, int] = {
    401: -32003,
    403: -32003,
    404: -32004,
    409: -32009,
    413: -32013,
    422: -32012,
    429: -32014,
    503: -32015,
}
INSTRUCTIONS = (
    "The tools of one palaestra episode. Each tools/call is one step; `submit` ends the "
    "episode, and its result's structuredContent carries the verdict (reward, passed) and "
    "the failure, if any (kind, boundary)."
)

Message = dict[str, Any]
Reply = Message | list[Message] | None
SERVER_INFO: Message = {"name": "palaestra", "version": palaestra.__version__}
DECODER = json.JSONDecoder()  # stateless: json.loads's own


@dataclass(frozen=True)
class McpEpisode:
    tools: Sequence[ToolSpec]
    step: Callable[[Action], Awaitable[StepResponse]]


@dataclass
class McpSession:
    protocol_version: str | None = None
    initialized: bool = False
    stateless: bool = False


class RpcError(Exception):
    """A JSON-RPC error to answer a request with."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.error: Message = {"code": code, "message": message}
        if data is not None:
            self.error["data"] = data


def shown(value: object) -> str:
    """A client's value as an error message quotes it: repr, clipped (a reply never grows
    with what was sent)."""
    text = value if isinstance(value, str) else json.dumps(value)
    clipped = repr(text[:SHOWN_CHARS])
    return clipped if len(text) <= SHOWN_CHARS else f"{clipped}... ({len(text)} characters)"


def batch_error(limit: int) -> Message:
    """The refusal of a batch longer than `limit` (HTTP 413 at a transport)."""
    return {
        "code": INVALID_REQUEST,
        "message": (
            f"Invalid Request: a batch holds at most {limit} messages (jsonrpc_max_batch); "
            "none of this one ran: send the messages in smaller batches"
        ),
        "data": {"status": 413, "setting": "jsonrpc_max_batch", "limit": limit},
    }


def status_of(reply: Reply) -> int | None:
    """The HTTP status a transport-level error reply asks for (`data.status`), else None."""
    if not isinstance(reply, dict) or reply.get("id") is not None:
        return None
    data = reply.get("error", {}).get("data")
    status = data.get("status") if isinstance(data, dict) else None
    return status if isinstance(status, int) and 400 <= status < 600 else None


def version_error(requested: object) -> Message:
    """The error refusing protocol version `requested`, naming the ones served."""
    text = requested if isinstance(requested, str) else json.dumps(requested)
    return {
        "code": UNSUPPORTED_VERSION,
        "message": (
            f"Unsupported protocol version {shown(text)}; this server supports "
            f"{', '.join(SUPPORTED_VERSIONS)} ({', '.join(HANDSHAKE_VERSIONS)} through "
            f"initialize, {', '.join(MODERN_VERSIONS)} in each request's params._meta)"
        ),
        "data": {"supported": list(SUPPORTED_VERSIONS), "requested": text[:SHOWN_CHARS]},
    }


def is_modern(message: object) -> bool:
    """Whether `message` is a 2026-07-28 request: server/discover, or one whose
    params._meta names a protocol version (the stateless envelope)."""
    if not isinstance(message, dict):
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return message.get("method") == DISCOVER or (
        isinstance(meta, dict) and PROTOCOL_VERSION_META in meta
    )


def modern_version(params: object) -> str:
    """The version a 2026-07-28 request's envelope names; RpcError -32602 when the envelope
    is missing or malformed, -32022 when that version is not served statelessly."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    keys = f"{PROTOCOL_VERSION_META!r} and {CLIENT_CAPABILITIES_META!r}"
    if not isinstance(meta, dict):
        raise RpcError(
            INVALID_PARAMS,
            f"Invalid params: a 2026-07-28 request's params._meta must be an "
            f"object carrying {keys}",
        )
    missing = [key for key in (PROTOCOL_VERSION_META, CLIENT_CAPABILITIES_META) if key not in meta]
    if missing:
        raise RpcError(
            INVALID_PARAMS,
            f"Invalid params: params._meta lacks {', '.join(missing)} (a "
            f"2026-07-28 request carries {keys})",
        )
    version = meta[PROTOCOL_VERSION_META]
    if not isinstance(version, str):
        raise RpcError(INVALID_PARAMS, f"Invalid params: {PROTOCOL_VERSION_META} must be a string")
    if version not in MODERN_VERSIONS:
        raise RpcError(**version_error(version))
    return version


def episode_error(exc: PalaestraError) -> Message:
    """The JSON-RPC error object for an episode error (a 404, 409, 429, ... of /v1)."""
    data: Message = {"status": exc.status, "code": exc.code, "retryable": exc.retryable}
    if exc.retry_after is not None:
        data["retry_after"] = exc.retry_after
    return {
        "code": ERROR_CODES.get(exc.status, INTERNAL_ERROR),
        "message": exc.message,
        "data": data,
    }


def error_response(message_id: Any, error: Message) -> Message:
    return {"jsonrpc": "2.0", "id": message_id, "error": error}


def is_initialize(message: object) -> bool:
    return isinstance(message, dict) and message.get("method") == "initialize"


async def decode(raw: bytes, max_batch: int) -> Any:
    """`raw` as JSON; a batch (a top-level array) one message at a time, yielding every
    YIELD_EVERY, and refused (RpcError -32600) at message `max_batch + 1`, before the rest
    is parsed: a huge batch costs what `max_batch` messages do. RpcError -32700: not JSON."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        start = _skip(text, 0)
        if not text.startswith("[", start):
            return json.loads(text)
        items: list[object] = []
        end = _skip(text, start + 1)
        closed = text.startswith("]", end)
        while not closed:
            if len(items) == max_batch:
                raise RpcError(**batch_error(max_batch))
            if items and len(items) % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            item, end = DECODER.raw_decode(text, end)
            items.append(item)
            end = _skip(text, end)
            closed = text.startswith("]", end)
            if not closed:
                if not text.startswith(",", end):
                    raise json.JSONDecodeError("Expecting ',' delimiter", text, end)
                end = _skip(text, end + 1)
        tail = _skip(text, end + 1)
        if tail != len(text):
            raise json.JSONDecodeError("Extra data", text, tail)
        return items
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise RpcError(PARSE_ERROR, f"Parse error: {exc}") from None


def _skip(text: str, position: int) -> int:
    """The position after the whitespace at `position` (a regular expression's C loop: a
    body of spaces costs no Python step per byte)."""
    found = SPACE.match(text, position)
    return found.end() if found else position


async def encode(reply: Reply, **dumps: Any) -> str:
    """The reply's JSON text (`dumps`: json.dumps's options); a batch's one message at a
    time, yielding every YIELD_EVERY."""
    if not isinstance(reply, list):
        return json.dumps(reply, **dumps)
    parts = []
    for index, message in enumerate(reply):
        if index and index % YIELD_EVERY == 0:
            await asyncio.sleep(0)
        parts.append(json.dumps(message, **dumps))
    return "[" + ",".join(parts) + "]"


async def handle_bytes(
    raw: bytes, episode: McpEpisode, session: McpSession, max_batch: int = MAX_BATCH
) -> Reply:
    try:
        message = await decode(raw, max_batch)
    except RpcError as exc:
        return error_response(None, exc.error)
    return await handle(message, episode, session, max_batch)


async def handle(
    message: object, episode: McpEpisode, session: McpSession, max_batch: int = MAX_BATCH
) -> Reply:
    if isinstance(message, list):
        if not message:
            return error_response(None, _invalid("an empty batch"))
        if len(message) > max_batch:
            return error_response(None, batch_error(max_batch))
        replies = []
        for index, item in enumerate(message):
            if index and index % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a long batch never holds the loop: others go on
            reply: Message | None
            if is_initialize(item) or is_modern(item):
                assert isinstance(item, dict)
                what = "initialize" if is_initialize(item) else "a 2026-07-28 request"
                reply = error_response(_valid_id(item), _invalid(f"{what} must not be batched"))
            else:
                reply = await _one(item, episode, session)
            if reply is not None:
                replies.append(reply)
        return replies or None
    return await _one(message, episode, session)


async def _one(message: object, episode: McpEpisode, session: McpSession) -> Message | None:
    if not isinstance(message, dict):
        return error_response(None, _invalid("a message must be a JSON object"))
    message_id = _valid_id(message)
    if message.get("jsonrpc") != "2.0":
        return error_response(message_id, _invalid('"jsonrpc" must be "2.0"'))
    method = message.get("method")
    if method is None and ("result" in message or "error" in message):
        return None  # a response to a request this server never sends: nothing to do
    if not isinstance(method, str):
        return error_response(message_id, _invalid('"method" must be a string'))
    if "id" not in message:
        if method == "notifications/initialized":
            session.initialized = True
        return None  # notifications are never answered (cancelled, progress, ...)
    if message_id is None:
        return error_response(None, _invalid('"id" must be a string or an integer'))
    params = message.get("params", {})
    if not isinstance(params, dict):
        return error_response(message_id, _params("params must be an object"))
    try:
        if session.stateless or is_modern(message):
            result = await _modern(method, params, episode, modern_version(params))
        else:
            result = await _dispatch(method, params, episode, session)
    except RpcError as exc:
        return error_response(message_id, exc.error)
    except Exception as exc:
        log.exception("MCP %s failed", method)
        error = {"code": INTERNAL_ERROR, "message": f"internal error ({type(exc).__name__})"}
        return error_response(message_id, error)
    return {"jsonrpc": "2.0", "id": message_id, "result": result}


async def _dispatch(
    method: str, params: Message, episode: McpEpisode, session: McpSession
) -> Message:
    if method == "initialize":
        return _initialize(params, session)
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": [_tool(spec) for spec in episode.tools]}
    if method == "tools/call":
        return await _call(params, episode, session.protocol_version or LATEST_VERSION)
    raise RpcError(
        METHOD_NOT_FOUND,
        f"Method not found: {shown(method)}; this server serves initialize, ping, tools/list "
        "and tools/call (no resources, prompts or completions)",
    )


async def _modern(method: str, params: Message, episode: McpEpisode, version: str) -> Message:
    """A 2026-07-28 request (its envelope checked): stateless, each result `complete`."""
    if method == DISCOVER:
        return {
            "supportedVersions": list(MODERN_VERSIONS),
            "capabilities": {"tools": {"listChanged": False}},
            "instructions": INSTRUCTIONS,
            "cacheScope": "private",  # answered only to the episode's own token
            "ttlMs": 0,
            "resultType": "complete",
            "_meta": {SERVER_INFO_META: SERVER_INFO},
        }
    if method == "tools/list":
        tools = [_tool(spec) for spec in episode.tools]
        return {
            "tools": tools,
            "cacheScope": "private",
            "ttlMs": TOOLS_TTL_MS,
            "resultType": "complete",
        }
    if method == "tools/call":
        return await _call(params, episode, version)
    raise RpcError(
        METHOD_NOT_FOUND,
        f"Method not found: {shown(method)} at {version}; this server serves server/discover, "
        "tools/list and tools/call there (initialize and ping are the handshake revisions': "
        "send them without the 2026-07-28 _meta envelope)",
    )


def _initialize(params: Message, session: McpSession) -> Message:
    requested = params.get("protocolVersion")
    if not isinstance(requested, str) or not requested:
        raise RpcError(INVALID_PARAMS, "initialize: params.protocolVersion must be a string")
    # The spec: answer with the client's version when served, else with our newest one
    # (the client then decides whether it can speak it).
    version = requested if requested in HANDSHAKE_VERSIONS else LATEST_VERSION
    session.protocol_version = version
    session.initialized = False
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": SERVER_INFO,
        "instructions": INSTRUCTIONS,
    }


def _tool(spec: ToolSpec) -> Message:
    return {"name": spec.name, "description": spec.description, "inputSchema": spec.parameters}


async def _call(params: Message, episode: McpEpisode, version: str) -> Message:
    name = params.get("name")
    if not isinstance(name, str):
        raise RpcError(INVALID_PARAMS, "tools/call: params.name must be a string")
    arguments = params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcError(
            INVALID_PARAMS, f"tools/call {shown(name)}: params.arguments must be an object"
        )
    names = [spec.name for spec in episode.tools]
    if name not in names:
        raise RpcError(
            INVALID_PARAMS,
            f"Unknown tool: {shown(name)}; this episode's tools are: {', '.join(names)}",
        )
    try:
        reply = await episode.step(Action(tool=name, arguments=arguments))
    except InvalidActionError as exc:  # a refused action: the episode goes on
        text = f"{exc.message} (the episode goes on; fix the call and retry)"
        refused = {"content": [{"type": "text", "text": text}], "isError": True}
        return {**refused, "resultType": "complete"} if version in MODERN_VERSIONS else refused
    except PalaestraError as exc:
        raise RpcError(**episode_error(exc)) from None
    return tool_result(reply, version)


def tool_result(reply: StepResponse, version: str = LATEST_VERSION) -> Message:
    """A step's reply as an MCP CallToolResult (for `version`'s shapes)."""
    observation = reply.observation
    content: list[Message] = [{"type": "text", "text": observation.text}]
    content += [
        {"type": "image", "data": png, "mimeType": "image/png"} for png in observation.images
    ]
    info = dict(reply.info)
    step = {
        "reward": reply.reward,
        "terminated": reply.terminated,
        "truncated": reply.truncated,
        "verdict": info.pop("verdict", None),
        "failure": info.pop("failure", None),  # on the last step (sdk/failures.py)
        "info": info,
        "data": observation.data,
    }
    if version in UNSTRUCTURED:
        return {"content": content, "isError": False, "_meta": {STEP_META: step}}
    result = {"content": content, "structuredContent": step, "isError": False}
    return {**result, "resultType": "complete"} if version in MODERN_VERSIONS else result


def _valid_id(message: Message) -> str | int | None:
    message_id = message.get("id")
    if isinstance(message_id, bool) or not isinstance(message_id, (str, int)):
        return None
    return message_id


def _invalid(what: str) -> Message:
    return {"code": INVALID_REQUEST, "message": f"Invalid Request: {what}"}


def _params(what: str) -> Message:
    return {"code": INVALID_PARAMS, "message": f"Invalid params: {what}"}
