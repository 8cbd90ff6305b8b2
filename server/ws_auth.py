"""A WebSocket handshake's token, wherever a client that cannot set headers puts it.

A browser's `WebSocket` and clients such as `openenv-core`'s `EnvClient` (which sends no
headers) cannot send `Authorization: Bearer …`. A handshake may therefore carry the token:

- in the `Authorization` header: `Bearer <token>`, or HTTP Basic with the token as the
  password (what the `websockets` library sends for a URL `ws://user:<token>@host/…`);
- as a subprotocol `bearer.<token>` (`Sec-WebSocket-Protocol`);
- in the URL's query: `?token=<token>` or `?access_token=<token>`.

The same token, the same scopes, the same refusal as a header. A query token is taken out
of the ASGI scope before the app runs (`lift`, from the front middleware), in place, so
uvicorn's `"WebSocket /path?…"` log line and everything after it see `token=redacted`.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import parse_qsl, urlencode

from starlette.types import Scope

QUERY_NAMES = frozenset({"token", "access_token"})
SUBPROTOCOL_PREFIX = "bearer."
LIFTED_KEY = "palaestra.ws_query_token"
REDACTED = "redacted"


def _split_query(raw: bytes) -> tuple[str | None, bytes]:
    """(the query's token, the query with every token value redacted)."""
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    token = next((value for key, value in pairs if key in QUERY_NAMES and value), None)
    kept = [(key, REDACTED if key in QUERY_NAMES else value) for key, value in pairs]
    return token, urlencode(kept).encode("latin-1")


def lift(scope: Scope) -> None:
    """Move a WebSocket handshake's query token into the scope (redacted in the query)."""
    if scope["type"] != "websocket" or LIFTED_KEY in scope:
        return
    raw: bytes = scope.get("query_string", b"")
    if not any(name.encode() in raw for name in QUERY_NAMES):
        scope[LIFTED_KEY] = None
        return
    token, scope["query_string"] = _split_query(raw)
    scope[LIFTED_KEY] = token


def _basic_token(value: str) -> str | None:
    """The token of `Basic base64(user:token)` (or of `base64(token:)`)."""
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, _, password = decoded.partition(":")
    return password or user or None


def _subprotocols(scope: Scope) -> list[str]:
    offered: list[str] = scope.get("subprotocols") or []
    return offered


def credential(scope: Scope) -> str | None:
    """The handshake's credential as an Authorization value (`Bearer <token>`), or the
    header as it is (refused with the usual message), or None: no credential at all."""
    header: str | None = next(
        (v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"authorization"),
        None,
    )
    if header is not None:
        scheme, _, rest = header.strip().partition(" ")
        if scheme.lower() == "basic":
            basic = _basic_token(rest)
            return f"Bearer {basic}" if basic else header
        return header
    for offered in _subprotocols(scope):
        if offered.startswith(SUBPROTOCOL_PREFIX) and len(offered) > len(SUBPROTOCOL_PREFIX):
            return "Bearer " + offered[len(SUBPROTOCOL_PREFIX) :]
    lift(scope)  # a bare app (no front middleware) lifts it here
    lifted = scope.get(LIFTED_KEY)
    return f"Bearer {lifted}" if isinstance(lifted, str) and lifted else None


def subprotocol(scope: Scope) -> str | None:
    """The subprotocol to answer: the `bearer.<token>` one a client offered (RFC 6455: a
    client that offered subprotocols fails a handshake that names none of them; it goes
    back only to the client that sent it). None when none was offered: this door speaks
    no other subprotocol."""
    offered = _subprotocols(scope)
    return next((p for p in offered if p.startswith(SUBPROTOCOL_PREFIX)), None)
