"""What one request may cost the server: body size, JSON nesting, connections, header time.

The body and JSON checks run in the front door (server/fastpath.py) before any parser sees
the bytes, so a 2 GiB body or a 100,000-deep `[[[[…` answers 413/422 in the contract's
error shape instead of a RecursionError (500) or an exhausted memory. The connection
guards are the uvicorn side (`uvicorn_options`): how many connections, how large and how
slow a request's headers may be (uvicorn itself never times out a connection that has
not sent its first request yet, nor one that trickles a header a byte at a time), and how
many connections one client address may hold before any of them authenticates. A
connection that has sent a valid token (`trust`, from the front door) is a tenant's: no
stranger's flood closes it, and when the server is full an idle stranger makes room.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pydantic_core
from starlette.types import Receive, Scope

from palaestra.sdk.errors import InvalidActionError, TooLargeError
from palaestra.server.coalesce import CoalescingTransport
from palaestra.server.config import Settings
from palaestra.server.jsondepth import json_shape

# Bodies larger than this have their nesting checked on a worker thread (numpy releases the
# GIL as it scans), so a large body never holds other tenants' steps on the event loop.
DEPTH_OFF_LOOP_BYTES = 256 * 1024
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def check_json_depth(raw: bytes, limit: int, max_values: int | None = None) -> None:
    """InvalidActionError (422) when `raw` nests deeper than `limit`; TooLargeError (413)
    when it holds more than `max_values` values (what a parser would spend time and memory
    on, however few bytes each takes: `[0,0,0,…]`)."""
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets <= limit and (max_values is None or raw.count(b",") + 2 * brackets < max_values):
        return  # cannot be deeper, nor hold more values: the common case
    depth, values = json_shape(raw)
    if depth > limit:
        raise InvalidActionError(
            f"the JSON body nests {depth} levels deep; at most {limit} are allowed "
            "(max_json_depth)",
            code="too_deep",
        )
    if max_values is not None and values > max_values:
        raise TooLargeError(
            f"the JSON body holds about {values} values; at most {max_values} are allowed "
            "(max_json_values): send fewer items or pack large data into strings"
        )


def check_text(raw: bytes) -> None:
    """InvalidActionError (422) when the body holds text no store can encode: bytes that are
    not UTF-8, or an escaped lone surrogate (`"\\ud800"`). The /v1 routes parse with
    pydantic-core, which refuses both; the doors' `json.loads` lets both through, and an
    action holding one would fail to be recorded after its step ran."""
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidActionError(
                f"the body is not UTF-8 text ({exc.reason} at byte {exc.start}); send UTF-8",
                code="invalid_request",
            ) from None
    if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw):
        try:
            pydantic_core.from_json(raw)
        except ValueError as exc:
            raise InvalidActionError(
                f"the body is not valid JSON text ({exc}); a \\u escape of a surrogate must be "
                "half of a pair",
                code="invalid_request",
            ) from None


def check_body(raw: bytes, settings: Settings) -> None:
    """What every JSON body must be before any parser sees it: UTF-8 text, at most
    `max_json_depth` deep and `max_json_values` values."""
    check_text(raw)
    check_json_depth(raw, settings.max_json_depth, settings.max_json_values)


async def vet_json(raw: bytes, settings: Settings) -> None:
    """`check_body`, off the event loop for a large body."""
    if len(raw) > DEPTH_OFF_LOOP_BYTES:
        await asyncio.to_thread(check_body, raw, settings)
    else:
        check_body(raw, settings)


def too_large(limit: int, what: str = "a request body", setting: str = "max_body_bytes") -> str:
    return f"{what} may be at most {limit} bytes ({setting}); send less"


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for key, value in headers:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, at most `limit` bytes (TooLargeError past it), or None when the
    client went away first."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLargeError(too_large(limit))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app `body` (already read), then the client's next events."""
    sent = False

    async def again() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


# -- uvicorn: connections and headers ------------------------------------------------------------
_HEADER_BODY = (
    b'{"error": {"code": "headers_too_large", "message": "the request line and headers are'
    b' over max_header_bytes; send fewer or shorter headers", "retryable": false}}'
)
_HEADER_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(_HEADER_BODY)
) + _HEADER_BODY


_TOO_MANY_BODY = (
    b'{"error": {"code": "capacity", "message": "the server holds its limit of open'
    b' connections (max_connections); retry later", "retryable": true}}'
)
_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(_TOO_MANY_BODY)
) + _TOO_MANY_BODY


_STRANGERS_BODY = (
    b'{"error": {"code": "capacity", "message": "this client address holds its limit of'
    b" connections that have not authenticated (max_unauthenticated_per_client); send a"
    b' request on the ones it holds or retry later", "retryable": true}}'
)
_TOO_MANY_STRANGERS = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(_STRANGERS_BODY)
) + _STRANGERS_BODY

CONNECTION_KEY = "palaestra.connection"  # the request's connection, in scope["state"]


class Strangers:
    """The server's connections that have not authenticated yet, oldest first: overall and
    per client address. Only these are capped per client and evicted to make room, so a
    tenant's own connection, once it has sent a valid token, is never closed for a
    stranger's sake."""

    def __init__(self) -> None:
        self.by_host: dict[str, dict[Any, None]] = {}  # dicts: insertion-ordered sets
        self.all: dict[Any, None] = {}

    def add(self, conn: Any, host: str) -> None:
        self.by_host.setdefault(host, {})[conn] = None
        self.all[conn] = None

    def discard(self, conn: Any, host: str) -> None:
        self.all.pop(conn, None)
        held = self.by_host.get(host)
        if held is not None:
            held.pop(conn, None)
            if not held:
                del self.by_host[host]

    def count(self, host: str) -> int:
        return len(self.by_host.get(host, ()))

    def oldest_idle(self, host: str | None = None) -> Any:
        """The oldest stranger (of `host`, or of anyone) the server is waiting on (for a
        request head or body); None when every one is being answered."""
        held = self.all if host is None else self.by_host.get(host, {})
        return next((conn for conn in held if conn.idle()), None)


def trust(scope: Scope) -> None:
    """Mark the connection `scope` arrived on as authenticated (a valid token was sent on
    it): it leaves the strangers, so neither the per-client cap nor eviction touches it.
    A no-op outside `palaestra serve` (no guarded connection in the scope)."""
    state = scope.get("state")
    conn = state.get(CONNECTION_KEY) if isinstance(state, dict) else None
    if conn is not None:
        conn.trust()


def guarded_protocol(base: type[Any], settings: Settings) -> type[Any]:
    """`base` (uvicorn's httptools or h11 protocol) that closes a connection which has not
    sent a whole request head within `header_timeout_s` of connecting (or of its last
    response), and answers 431 to a head over `max_header_bytes`.

    Connections that have not authenticated (strangers) are bounded per client address
    (`max_unauthenticated_per_client`): past it, that address's oldest idle stranger is
    closed. At `max_connections` the oldest idle stranger of anyone makes room; only when
    none is idle is the new connection refused (429). A WebSocket leaves the guard at its
    upgrade: its life is the door's (idle_ttl_s), not a request-head timer.

    On uvicorn's httptools protocol the same timer also closes a connection idle for
    `keep_alive_s` after an answer (uvicorn's keep-alive wait, which scheduled and
    cancelled a timer of its own on every request)."""
    timeout = settings.header_timeout_s
    keep_alive = settings.keep_alive_s
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        owns_keep_alive = issubclass(base, HttpToolsProtocol)
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        owns_keep_alive = False
    limit = settings.max_header_bytes
    most = settings.max_connections
    per_client = settings.max_unauthenticated_per_client

    class Guarded(base):  # type: ignore[misc]
        strangers = Strangers()  # this server's (one class per guarded_protocol call)
        app_state: dict[str, Any]  # uvicorn's (the lifespan state each scope copies)
        _guard: asyncio.TimerHandle | None = None
        _guard_at = 0.0  # when _guard fires
        _deadline = 0.0  # the loop's time by which a request head must have come
        _idle_until = 0.0  # the loop's time by which some byte must have come (keep-alive)
        _quiet = False  # no byte since the last answer (so _idle_until holds)
        _waiting: object = None
        _head_bytes = 0
        _host = ""
        _stranger = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Each request's scope["state"] is a copy of this: the route can reach its
            # connection (`trust`) however a proxy header rewrote scope["client"].
            self.app_state = {**self.app_state, CONNECTION_KEY: self}

        def connection_made(self, transport: Any) -> None:
            super().connection_made(CoalescingTransport(transport))
            self._host = self.client[0] if self.client else ""
            if self.strangers.count(self._host) >= per_client:
                victim = self.strangers.oldest_idle(self._host)
                if victim is None:
                    self._refuse(_TOO_MANY_STRANGERS)
                    return
                victim.evict()
            if len(self.connections) > most:
                victim = self.strangers.oldest_idle()
                if victim is None:
                    self._refuse(_TOO_MANY)
                    return
                victim.evict()
            self._stranger = True
            self.strangers.add(self, self._host)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._leave()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._leave()  # the WebSocket protocol owns the transport from here
            super().handle_websocket_upgrade(*args)

        def on_response_complete(self) -> None:
            if owns_keep_alive and not self.pipeline:
                # uvicorn's own, less its keep-alive timer: the guard's waits for both
                self.server_state.total_requests += 1
                if self.transport.is_closing():
                    return
                self.flow.resume_reading()
                self._arm(idle=True)
                return
            super().on_response_complete()
            if self.cycle is None or self.cycle.response_complete:
                self._arm()
            # else a request already in (queued, now started) is the server's to answer: no
            # head is awaited, and its time is not the client's (the next answer arms)

        def data_received(self, data: bytes) -> None:
            self._quiet = False
            waiting = self.cycle is self._waiting
            super().data_received(data)
            if waiting and self.cycle is self._waiting:  # the head is still incomplete
                self._head_bytes += len(data)
                if self._head_bytes > limit and not self.transport.is_closing():
                    self.transport.write(_HEADER_TOO_LARGE)
                    self.transport.close()

        def idle(self) -> bool:
            """Whether the server waits on this client, not the client on the server: no
            whole request head yet (pipelined ones queued behind an answer count as
            that), or a body still to come with no answer begun (a slow body holds a
            connection as a slow head does)."""
            if self.transport.is_closing():
                return False
            cycle = self.cycle
            if cycle is self._waiting:
                return True
            return bool(cycle.more_body and not cycle.response_started)

        def trust(self) -> None:
            self._unlist()

        def evict(self) -> None:
            """Close this idle stranger to make room (as a keep-alive timeout would: the
            server is not working for it, only waiting on it). Aborted, not closed: a
            close would keep flushing an answer it does not read. Counted out at once, so
            one new connection closes one stranger, not several while it goes."""
            self._leave()
            self.connections.discard(self)
            self.transport.abort()

        def _refuse(self, reply: bytes) -> None:
            self.transport.write(reply)
            self.transport.close()

        def _leave(self) -> None:
            """Out of the guard's books: no timer, no stranger."""
            if self._guard is not None:
                self._guard.cancel()
                self._guard = None
            self._unlist()

        def _unlist(self) -> None:
            if self._stranger:
                self._stranger = False
                self.strangers.discard(self, self._host)

        def _arm(self, idle: bool = False) -> None:
            """Start the wait for the next request head (and, `idle`, for any byte within
            keep_alive_s). A timer still pending is kept and moves on to the new deadline
            when it fires: a keep-alive client's every response would otherwise cancel one
            timer and schedule another."""
            self._waiting = self.cycle
            self._head_bytes = 0
            now = self.loop.time()
            self._deadline = now + timeout
            self._quiet = idle
            self._idle_until = now + keep_alive
            self._wake_by(self._next_deadline())

        def _wake_by(self, when: float) -> None:
            """The timer set to fire by `when`: kept if it fires sooner, else set anew."""
            if self._guard is not None:
                if self._guard_at <= when:
                    return
                self._guard.cancel()
            self._guard = self.loop.call_at(when, self._expire)
            self._guard_at = when

        def _next_deadline(self) -> float:
            return min(self._deadline, self._idle_until) if self._quiet else self._deadline

        def _expire(self) -> None:
            self._guard = None
            if self.transport.is_closing() or self.cycle is not self._waiting:
                return  # a request head came since: its answer arms the wait again
            now = self.loop.time()
            if now >= self._deadline or (self._quiet and now >= self._idle_until):
                self.transport.close()  # no request head in time (slowloris), or idle
            else:  # armed again since: wait for the rest
                self._wake_by(self._next_deadline())

    Guarded.__name__ = f"Guarded{base.__name__}"
    return Guarded


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of `uvicorn.run`/`uvicorn.Config` that bound what clients hold."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base: type[Any] = HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return {
        "http": guarded_protocol(base, settings),
        # Guarded holds connections at max_connections (an idle stranger makes room, else
        # a 429 in our error shape); uvicorn's own bound (a plain-text 503) stays behind
        # it, for tasks as well as connections.
        "limit_concurrency": 2 * settings.max_connections,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_keep_alive": max(1, round(settings.keep_alive_s)),
        "timeout_graceful_shutdown": max(1, round(settings.shutdown_grace_s)),
    }
