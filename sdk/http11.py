"""A small HTTP/1.1 client for JSON POSTs to model endpoints: keep-alive connections pooled
by origin, spoken with h11. The session model proxy (server/harness/) and the judge
endpoints (verifiers/judge_endpoint.py) share it; each owns its own pool.

Why not httpx (docs/reference/harness.md, "The session model proxy", and
docs/reference/judges.md, "Endpoint operations"): with
32–64 calls at once through one pooled `httpx.AsyncClient`, its pool costs ~2.8–3.8 ms of
CPU a call on this machine (httpcore rescans every connection, a poll(2) each, for every
request), more than everything else the proxy does; this client costs a fraction of that.
It does only what its callers need: POST a JSON body to one URL with a few extra headers,
read the answer whole up to a cap, follow no redirect, read no proxy from the environment.
A pooled connection the server closed while idle is retried once on a fresh one (it never
saw the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

CHUNK = 64 * 1024
MAX_IDLE = 256  # idle connections kept per origin


@dataclass(frozen=True)
class Target:
    """Where a POST goes: scheme, host, port, the Host header and the request target."""

    scheme: str
    host: str
    port: int
    authority: str
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        """ValueError saying what is wrong with `url` (http(s), a host, no query)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("write http(s)://HOST[:PORT]/PATH")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("no query, fragment or user info")
        if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
            raise ValueError("no spaces or control characters")
        port = parts.port or (443 if parts.scheme == "https" else 80)  # ValueError: bad port
        return cls(parts.scheme, parts.hostname, port, parts.netloc, parts.path or "/")

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class TooLarge(Exception):
    """The answer's body is over the caller's cap (the connection is dropped)."""


class _Stale(Exception):
    """A pooled connection closed before a byte of the answer: retry on a fresh one."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.writer.close()


class UpstreamPool:
    """Pooled connections by origin (see the module docstring)."""

    def __init__(
        self, connect_timeout_s: float, user_agent: str = "palaestra-session-proxy"
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.user_agent = user_agent
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self,
        target: Target,
        body: bytes,
        max_bytes: int,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Answer:
        """POST `body` (JSON) to `target` with `headers` besides the usual ones; OSError /
        h11.ProtocolError when the exchange fails, TooLarge past `max_bytes`. Cancelling
        it (a timeout) drops the connection."""
        for attempt in range(2):
            conn, reused = await self._checkout(target)
            try:
                sent = [*self._headers(target, body), *headers]
                answer = await self._exchange(conn, target, sent, body, max_bytes)
            except _Stale:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise ConnectionResetError("the connection closed before an answer") from None
            except BaseException:
                conn.close()
                raise
            if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
                conn.h11.start_next_cycle()
                idle = self._idle.setdefault(target.origin, [])
                if len(idle) < MAX_IDLE:
                    idle.append(conn)
                    return answer
            conn.close()
            return answer
        raise AssertionError("unreachable")

    async def _checkout(self, target: Target) -> tuple[_Conn, bool]:
        idle = self._idle.get(target.origin, [])
        while idle:
            conn = idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn, True
            conn.close()
        tls = None
        if target.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        async with asyncio.timeout(self.connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                target.host, target.port, ssl=tls, limit=CHUNK
            )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(reader, writer), False

    def _headers(self, target: Target, body: bytes) -> list[tuple[str, str]]:
        return [
            ("host", target.authority),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("user-agent", self.user_agent),
        ]

    @staticmethod
    async def _exchange(
        conn: _Conn, target: Target, headers: list[tuple[str, str]], body: bytes, max_bytes: int
    ) -> Answer:
        out = conn.h11.send(h11.Request(method="POST", target=target.path, headers=headers))
        out = (out or b"") + (conn.h11.send(h11.Data(data=body)) or b"")
        out += conn.h11.send(h11.EndOfMessage()) or b""
        conn.writer.write(out)
        await conn.writer.drain()
        head: h11.Response | None = None
        chunks: list[bytes] = []
        size = 0
        got = False
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                data = await conn.reader.read(CHUNK)
                if not data and not got:
                    raise _Stale
                got = True
                conn.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > max_bytes:
                    raise TooLarge
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                named = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
                return Answer(head.status_code, named, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the upstream closed the connection mid-answer")

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
