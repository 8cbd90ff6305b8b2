"""The model gateway: the `SocketService` that serves a harness sandbox's one listener
(127.0.0.1:GATEWAY_PORT inside its network namespace, placed there by the backend) for the
episode's model session, in process: each request goes to `session.handle(...)` directly,
with no HTTP hop to the server's own routes.

HTTP/1.1 by h11, keep-alive. What a hostile harness could use against it is bounded: the
request head (max_header_bytes), the body (llm_max_request_kb), the time a request may take
to arrive after its first byte (header_timeout_s: no slowloris), an idle keep-alive
connection's life (keep_alive_s), connections open at once per sandbox, and the request
bodies a sandbox's connections hold at once (HELD_BODIES requests' worth: 64 connections
of 8 MiB bodies, parsed, would be gigabytes). Only origin-form
targets (`/path`) are served: an absolute URI is refused, and the Host header is never
read; the session decides where its calls go, and that is the endpoint named at reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import h11

from palaestra.server.config import Settings
from palaestra.server.harness.wire import Reply, error_object, openai_error

log = logging.getLogger("palaestra.harness")

MAX_CONNECTIONS = 64  # open at once per sandbox
HELD_BODIES = 2  # full-size request bodies a sandbox's connections may hold at once
CHUNK = 64 * 1024


class Handles(Protocol):
    """What the gateway serves: a model session (server/harness/proxy.py)."""

    async def handle(self, method: str, path: str, body: bytes) -> Reply: ...


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Listener:
    key: str
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    held: int = 0  # body bytes its requests hold (being read or answered)


def _raw_error(status: int, message: str) -> bytes:
    """A whole error response, for when h11's state can no longer send one."""
    body = json.dumps(error_object(message, "invalid_request_error", str(status))).encode()
    head = (
        f"HTTP/1.1 {status} {h11_reason(status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def h11_reason(status: int) -> str:
    reasons = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
               429: "Too Many Requests"}  # fmt: skip
    return reasons.get(status, "Request Header Fields Too Large" if status == 431 else "Error")


class ModelGateway:
    """Serves sandbox listeners for sessions looked up by key (`lookup`, the proxy's `get`)."""

    def __init__(self, lookup: Callable[[str], Handles | None], settings: Settings) -> None:
        self._lookup = lookup
        self.settings = settings
        self._servers: dict[asyncio.Server, _Listener] = {}

    async def serve(self, sock: socket.socket, key: str) -> asyncio.Server:
        """Serve the listening socket `sock` for session `key` until `close`."""
        listener = _Listener(key)

        async def on_connection(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._connection(listener, r, w)

        server = await asyncio.start_server(on_connection, sock=sock, limit=CHUNK)
        self._servers[server] = listener
        return server

    async def close(self, server: asyncio.Server) -> None:
        """Stop serving one sandbox: its listener and its open connections."""
        listener = self._servers.pop(server, None)
        server.close()
        for w in list(listener.writers if listener else ()):
            w.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    async def aclose(self) -> None:
        for server in list(self._servers):
            await self.close(server)

    # ---- one connection ---------------------------------------------------------------------
    async def _connection(
        self, listener: _Listener, r: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> None:
        if len(listener.writers) >= MAX_CONNECTIONS:
            w.close()
            return
        listener.writers.add(w)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.settings.max_header_bytes)
        first = True
        mine = [0]  # body bytes of this connection's request in listener.held
        try:
            while True:
                listener.held -= mine[0]
                mine[0] = 0
                try:
                    request = await self._request(conn, r, w, first, listener, mine)
                except _Refused as exc:
                    w.write(_raw_error(exc.status, str(exc)))
                    await w.drain()
                    return
                except h11.RemoteProtocolError as exc:
                    w.write(_raw_error(exc.error_status_hint, f"malformed HTTP request: {exc}"))
                    await w.drain()
                    return
                if request is None:
                    return
                method, target, body = request
                reply = await self._dispatch(listener.key, method, target, body)
                await self._send(conn, w, reply)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
                first = False
        except (OSError, ConnectionError, h11.LocalProtocolError):
            pass
        finally:
            listener.held -= mine[0]
            listener.writers.discard(w)
            w.close()

    async def _request(
        self,
        conn: h11.Connection,
        r: asyncio.StreamReader,
        w: asyncio.StreamWriter,
        first: bool,
        listener: _Listener,
        mine: list[int],
    ) -> tuple[str, str, bytes] | None:
        """The next request (method, target, body); None when the client closed or idled
        out between requests; _Refused for one not served. Its body's bytes are counted
        in `listener.held` (and `mine`) until the caller releases them."""
        s = self.settings
        cap = s.llm_max_request_kb * 1024
        deadline: float | None = time.monotonic() + s.header_timeout_s if first else None
        head: h11.Request | None = None
        body: list[bytes] = []
        size = 0
        received = False
        taken = len(conn.trailing_data[0])  # bytes of this request so far (pipelined ones)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                # Idle between requests: keep_alive_s for a first byte; from then on (and
                # from connecting, for the first) the whole request within header_timeout_s.
                wait = s.keep_alive_s if deadline is None else deadline - time.monotonic()
                try:
                    data = await asyncio.wait_for(r.read(CHUNK), max(wait, 0.0))
                except TimeoutError:
                    if not received:
                        return None
                    raise _Refused(408, f"the request took over {s.header_timeout_s:g} s") from None
                received = received or bool(data)
                taken += len(data)
                if deadline is None:
                    deadline = time.monotonic() + s.header_timeout_s
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
                if taken - len(conn.trailing_data[0]) > s.max_header_bytes:
                    raise _Refused(431, f"the request head is over {s.max_header_bytes} bytes")
                target = event.target.decode("latin-1")
                if not target.startswith("/"):
                    raise _Refused(400, "only origin-form targets (/path) are served here")
                length = dict(event.headers).get(b"content-length")
                if length is not None and length.isdigit() and int(length) > cap:
                    raise _Refused(
                        413,
                        f"the request body is over {s.llm_max_request_kb} KiB (llm_max_request_kb)",
                    )
                if conn.they_are_waiting_for_100_continue:
                    w.write(
                        conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                    )
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > cap:
                    raise _Refused(
                        413,
                        f"the request body is over {s.llm_max_request_kb} KiB (llm_max_request_kb)",
                    )
                mine[0] += len(event.data)
                listener.held += len(event.data)
                if listener.held > HELD_BODIES * cap:
                    raise _Refused(
                        429,
                        f"this sandbox's requests hold over {HELD_BODIES} x "
                        f"{s.llm_max_request_kb} KiB of bodies at once (llm_max_request_kb); "
                        "send one model call at a time",
                    )
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return head.method.decode("latin-1"), head.target.decode("latin-1"), b"".join(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _dispatch(self, key: str, method: str, target: str, body: bytes) -> Reply:
        session = self._lookup(key)
        if session is None:
            return openai_error(409, "this sandbox's model session is closed", "session_closed")
        try:
            return await session.handle(method, target, body)
        except Exception as exc:  # a bug: answered, logged, the connection goes on
            log.exception("model gateway: %s %s for %s", method, target[:200], key)
            return openai_error(500, f"internal error ({type(exc).__name__}); a bug", "internal")

    @staticmethod
    async def _send(conn: h11.Connection, w: asyncio.StreamWriter, reply: Reply) -> None:
        headers = [
            ("content-type", reply.content_type),
            ("content-length", str(len(reply.body))),
            *reply.headers,
        ]
        if reply.content_type.startswith("text/event-stream"):
            headers.append(("cache-control", "no-cache"))
        out = conn.send(h11.Response(status_code=reply.status, headers=headers)) or b""
        out += conn.send(h11.Data(data=reply.body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        w.write(out)
        await w.drain()
