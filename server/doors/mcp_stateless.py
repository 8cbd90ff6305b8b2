"""What a 2026-07-28 (stateless) request to the MCP door must show before it is answered.

MCP's 2026-07-28 revision has no `initialize` and no session: each POST to
`/v1/episodes/{episode_id}/mcp` is one JSON-RPC request carrying its protocol version and
the client's capabilities in `params._meta`, mirrored into HTTP headers. server/doors/
mcp_http.py routes a POST here when its `MCP-Protocol-Version` header names a version not
reached through `initialize` (2026-07-28, or one not served at all: -32022 naming those
served), or when its body carries the 2026 envelope (then a missing or handshake-era header
is -32020: the header must name the envelope's version). This module is the ladder such a
request climbs, first failure wins (the rungs of the SDK's own server, `mcp` 2.3.0):

1. An `MCP-Protocol-Version` this server does not serve at all: -32022 naming those it does.
2. One JSON-RPC request or notification per POST, never a batch (-32600, HTTP 400); a
   notification is accepted (202) and nothing acts on it.
3. Each routing header (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) at most once, and
   equal to the body: the version to `_meta`'s, `Mcp-Method` to `method`, `Mcp-Name` (its
   `=?base64?...?=` form decoded) to a `tools/call`'s `params.name` (-32020, HTTP 400).
4. The envelope itself (server/doors/mcp.py's `modern_version`: -32602, or -32022 naming the
   versions served, HTTP 400).

Then the core answers it on the episode the URL names, which the bearer token must own on
every request, exactly as /v1 checks it (another token's episode is the 404 of none): the
URL's episode id is the explicit identifier that spans requests, where earlier revisions
had a session. `Mcp-Session-Id` is ignored and none is minted. Palaestra's tools declare no
`x-mcp-header` parameters, so no `Mcp-Param-*` header is recognized or checked.

`status(reply)` is the HTTP status of an answer: the spec's for protocol errors (400, and
404 for -32601), an episode error's own (`data.status`: 404, 409, 429, ...), else 200.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence

from palaestra.server.doors import mcp

VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
ROUTING_HEADERS = frozenset({VERSION_HEADER, METHOD_HEADER, NAME_HEADER})
SENTINEL = re.compile(r"=\?base64\?(?P<payload>.*)\?=")  # a header value's base64 form
# HTTP statuses of protocol errors (the spec's streamable HTTP transport, 2026-07-28).
PROTOCOL_STATUS: dict[int, int] = {
    mcp.PARSE_ERROR: 400,
    mcp.INVALID_REQUEST: 400,
    mcp.INVALID_PARAMS: 400,
    mcp.HEADER_MISMATCH: 400,
    mcp.UNSUPPORTED_VERSION: 400,
    mcp.METHOD_NOT_FOUND: 404,
}


def wanted(headers: Mapping[str, str], message: object) -> bool:
    """Whether a POST is of the stateless era (see the module's docstring): a body carrying
    the envelope under a handshake version's header comes here too, to be told they differ."""
    version = headers.get(VERSION_HEADER)
    return (version is not None and version not in mcp.HANDSHAKE_VERSIONS) or mcp.is_modern(message)


def refusal(raw_headers: Sequence[tuple[bytes, bytes]], message: object) -> mcp.Message | None:
    """The error answer for a request that fails the ladder; None: go on (a notification
    that passes is answered 202 by the caller)."""
    headers = {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw_headers
    }
    version = headers.get(VERSION_HEADER)
    if version is not None and version not in mcp.SUPPORTED_VERSIONS:
        return mcp.error_response(_id_of(message), mcp.version_error(version))
    if not isinstance(message, dict) or "method" not in message:
        what = "a batch" if isinstance(message, list) else "not a request"
        return mcp.error_response(
            None,
            _error(
                mcp.INVALID_REQUEST,
                f"Invalid Request: a 2026-07-28 POST carries one JSON-RPC request or "
                f"notification ({what} was sent)",
            ),
        )
    if "id" not in message:  # a notification: accepted, nothing acts on it
        return None
    message_id = _id_of(message)
    mismatch = _mismatch(raw_headers, headers, message)
    if mismatch is not None:
        return mcp.error_response(message_id, _error(mcp.HEADER_MISMATCH, mismatch))
    try:
        mcp.modern_version(message.get("params"))
    except mcp.RpcError as exc:
        return mcp.error_response(message_id, exc.error)
    return None


def _mismatch(
    raw_headers: Sequence[tuple[bytes, bytes]], headers: Mapping[str, str], message: mcp.Message
) -> str | None:
    """Why the routing headers do not mirror the body, or None."""
    seen: set[str] = set()
    for raw_name, _ in raw_headers:
        name = raw_name.decode("latin-1").lower()
        if name in ROUTING_HEADERS and name in seen:
            return f"Header mismatch: {name} appears more than once; send it once"
        seen.add(name)
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = headers.get(VERSION_HEADER)
    if isinstance(meta, dict) and mcp.PROTOCOL_VERSION_META in meta:
        if version is None:
            return (
                f"Header mismatch: no MCP-Protocol-Version header; a 2026-07-28 request "
                f"carries it, equal to its _meta {mcp.PROTOCOL_VERSION_META}"
            )
        if version != meta[mcp.PROTOCOL_VERSION_META]:
            return (
                f"Header mismatch: MCP-Protocol-Version {mcp.shown(version)} is not the "
                f"request's _meta {mcp.PROTOCOL_VERSION_META} "
                f"({mcp.shown(meta[mcp.PROTOCOL_VERSION_META])})"
            )
    method = message.get("method")
    if headers.get(METHOD_HEADER) != method:
        return (
            f"Header mismatch: Mcp-Method {_quoted(headers.get(METHOD_HEADER))} is not the "
            f"request's method {mcp.shown(method)}"
        )
    tool = params.get("name") if isinstance(params, dict) else None
    if method == "tools/call" and isinstance(tool, str):
        sent = headers.get(NAME_HEADER)
        if sent is None or decoded(sent) != tool:
            return (
                f"Header mismatch: Mcp-Name {_quoted(sent)} is not the tool called, "
                f"{mcp.shown(tool)} (a name outside printable ASCII is sent as "
                "=?base64?...?=)"
            )
    return None


def decoded(value: str) -> str | None:
    """A header value as the body would hold it: the `=?base64?...?=` form decoded (None for
    a malformed one, which then matches nothing), any other value as it is."""
    found = SENTINEL.fullmatch(value)
    if found is None:
        return value
    payload = found["payload"]
    try:
        raw = base64.b64decode(payload, validate=True)
        if base64.b64encode(raw).decode("ascii") != payload:
            return None  # not the canonical encoding a client sends
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def status(reply: mcp.Message) -> int:
    """The HTTP status of a stateless answer."""
    error = reply.get("error")
    if not isinstance(error, dict):
        return 200
    code = error.get("code")
    if isinstance(code, int) and code in PROTOCOL_STATUS:
        return PROTOCOL_STATUS[code]
    data = error.get("data")
    found = data.get("status") if isinstance(data, dict) else None
    return found if isinstance(found, int) and 400 <= found < 600 else 200


def _quoted(header: str | None) -> str:
    return mcp.shown(header) if header is not None else "(absent)"


def _id_of(message: object) -> str | int | None:
    """The request's id where it is a valid one (a string or an integer), else None."""
    found = message.get("id") if isinstance(message, dict) else None
    return None if isinstance(found, bool) or not isinstance(found, (str, int)) else found


def _error(code: int, message: str) -> mcp.Message:
    return {"code": code, "message": message}
