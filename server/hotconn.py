"""The trainer's hot routes answered by the connection itself, under the ASGI app.

A served step's CPU went, besides the episode, to the layers any ASGI request passes:
uvicorn's request cycle (an `asyncio.Event`, a task, a `receive` message, two `send`
messages each checked header by header), its proxy-headers middleware, and the app's
call chain down to the front door (server/fastpath.py). `hot_protocol` gives `palaestra
serve`'s connection protocol a shorter way for `POST /v1/episodes/{id}/step` and the batch
routes: the parsed request goes straight to the front door's own functions (`authenticate`,
`hot_reply`, the same ones `StepFastPath` calls) and the answer leaves in one write. The
requests whose bodies came in one turn of the event loop are answered together at its end
(`Answering`), each at once (`batch.eager`: a no-op step never waits, so most need no task).
Every other request, and any hot one this path does not take, goes through uvicorn and the
app as before: a chunked or `Expect: 100-continue` body, HTTP/1.0, a query string or an
escaped path, uvicorn's concurrency limit reached, and what the front door refuses at the
head (a bad token, a body declared too large), answered there before a byte of body is read.

What stays the protocol's: keep-alive and pipelining (a request behind an unanswered one
waits in uvicorn's pipeline, and this cycle's `run_asgi` runs it from there), the
connection guards (server/guards.py: header timeout, strangers), flow control and the
graceful shutdown (the tasks it waits on).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from palaestra.server import batch, guards
from palaestra.server.auth import Principal
from palaestra.server.fastpath import (
    JSON_HEADERS,
    HotRoute,
    Reply,
    authenticate,
    error_body,
    hot_reply,
    hot_route,
)
from palaestra.server.manager import EpisodeManager

log = logging.getLogger("palaestra.server")

Hot = tuple[HotRoute, Principal]  # a hot request's route and its authenticated caller
JSON_HEAD = b"".join(name + b": " + value + b"\r\n" for name, value in JSON_HEADERS)


def response(status: int, body: bytes, headers: list[tuple[bytes, bytes]], close: bool) -> bytes:
    """A whole JSON response: status line, `headers` (the server's default ones first), body."""
    line = STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status  # uvicorn's, 100-599
    parts = [line, JSON_HEAD, b"content-length: %d\r\n" % len(body)]
    parts.extend(name + b": " + value + b"\r\n" for name, value in headers)
    if close:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


class Answering:
    """The hot requests whose bodies came in during one turn of the event loop, answered
    together once the turn's reads are done: their steps run one after another, with the
    episode code warm in the CPU's caches, not each between a parse and a socket write of
    its own (bench/api.py: 147 → 113 µs of server CPU a served step)."""

    def __init__(self) -> None:
        self._ready: list[HotCycle] = []

    def add(self, cycle: HotCycle, loop: asyncio.AbstractEventLoop) -> None:
        if not self._ready:
            loop.call_soon(self._answer)
        self._ready.append(cycle)

    def _answer(self) -> None:
        ready, self._ready = self._ready, []
        for cycle in ready:
            cycle.start()


class HotCycle:
    """One hot request on a connection: what uvicorn's protocol reads and writes on its
    `cycle` (body, more_body, message_event, keep_alive, response_complete, …), and an
    answer written at once. `message_event` is the cycle itself: the protocol `set()`s it
    as the body comes in, and the last piece starts the answer."""

    def __init__(
        self, conn: Any, manager: EpisodeManager, hot: Hot, keep_alive: bool, current: bool
    ) -> None:
        self.conn = conn  # the protocol (a Guarded HttpToolsProtocol, hot_protocol's)
        self.manager = manager
        self.route, self.principal = hot
        self.headers: list[tuple[bytes, bytes]] = conn.headers
        self.transport = conn.transport
        self.flow = conn.flow
        self.keep_alive = keep_alive
        self.message_event = self
        self.body = bytearray()
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.on_response = conn.on_response_complete
        self._current = current  # not queued behind another request: start when the body is in
        self._started = False
        self._body_in: asyncio.Future[None] | None = None  # run_asgi's wait for the body

    def set(self) -> None:
        """More body, its end, or the client gone (uvicorn's on_body, on_message_complete,
        connection_lost)."""
        if self.more_body and not self.disconnected:
            if len(self.body) > HIGH_WATER_LIMIT and (self._current or self._started):
                # on_body paused reading past it: the request being answered reads on (its
                # body is bounded by its Content-Length); one queued behind another does not,
                # as uvicorn's own pipeline (one such body at a time on a connection)
                self.flow.resume_reading()
            return
        if self._body_in is not None:
            if not self._body_in.done():
                self._body_in.set_result(None)
        elif self._current and not self._started:
            self._started = True
            self.conn.answering.add(self, self.conn.loop)

    def start(self) -> None:
        """Answer now, in a task only if the answer waits on something."""
        task = batch.eager(self.run_asgi(None))
        if task is not None:
            self.conn.tasks.add(task)
            task.add_done_callback(self.conn.tasks.discard)

    async def run_asgi(self, app: Any) -> None:
        """Answer the request (the name is the one uvicorn starts a pipelined cycle by)."""
        self._started = True
        try:
            if self.more_body and not self.disconnected:
                self._body_in = self.conn.loop.create_future()
                await self._body_in
            if self.disconnected:
                return
            principal: Principal | Reply = self.principal
            if not self._current:  # queued: its token is looked up again now (revoked since?)
                principal = authenticate(self.manager.services, self.headers)
            if not isinstance(principal, Principal):
                await self._answer(*principal)
                return
            raw = bytes(self.body)
            await self._answer(*await hot_reply(self.manager, self.route, principal, raw))
        except Exception as exc:  # a bug: the contract's 500, or a cut answer
            log.exception("unhandled error on %s", self.route.path)
            if self.response_started:
                self.transport.close()
            else:
                body = error_body("internal", f"internal error ({type(exc).__name__}); a bug")
                await self._answer(500, body, [])
        finally:
            self.on_response = _nothing

    async def _answer(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()  # the client reads no answers: wait until it does
        if self.disconnected:
            return
        defaults = self.conn.server_state.default_headers
        data = response(status, body, defaults + headers, not self.keep_alive)
        self.response_started = True
        self.transport.write(data)
        self.response_complete = True
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


def _nothing() -> None:
    pass


def hot_protocol(base: type[Any], app: Any) -> type[Any]:
    """`base` (uvicorn's httptools protocol, guarded: server/guards.py) answering the hot
    routes of `app` (whose `state.manager` serves them) itself; any other base is kept."""
    if not issubclass(base, HttpToolsProtocol):
        return base

    class HotConnection(base):  # type: ignore[misc]
        cycle: Any  # uvicorn's: its RequestResponseCycle, or a HotCycle
        answering = Answering()  # this server's (one class per hot_protocol call)

        def on_headers_complete(self) -> None:
            manager: EpisodeManager = app.state.manager
            try:
                hot = self._hot(manager)
            except Exception:  # a bug (or the token table gone): the front door's 500
                log.exception("unhandled error in front of %s", self.url[:200])
                hot = None
            if hot is None:
                super().on_headers_complete()
                return
            keep_alive = self.parser.should_keep_alive()
            existing = self.cycle
            current = existing is None or existing.response_complete
            cycle: Any = HotCycle(self, manager, hot, keep_alive, current)
            self.cycle = cycle  # what the protocol feeds the body to, as its own cycles
            if not current:  # pipelined behind an answer still going: uvicorn starts it then
                self.flow.pause_reading()
                self.pipeline.appendleft((cycle, self.app))

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            self.pipeline.clear()  # queued requests never run now: their bodies go at once

        def _hot(self, manager: EpisodeManager) -> Hot | None:
            """The hot route of the request whose head just came and its caller, if this
            path takes it. A request refused at its head (413 by its declared length, 401)
            is the front door's to answer, before its body is read."""
            url: bytes = self.url
            if (
                not url.isascii()
                or b"?" in url
                or b"%" in url
                or self.expect_100_continue
                or self.root_path
                or self.parser.get_http_version() != "1.1"
                or self.parser.should_upgrade()
            ):
                return None
            route = hot_route(self.parser.get_method().decode("ascii"), url.decode("ascii"))
            if route is None:
                return None
            declared = guards.declared_length(self.headers)
            if declared is None or declared > manager.services.settings.max_body_bytes:
                return None  # chunked, or too large
            limit = self.limit_concurrency
            if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
                return None  # uvicorn answers its 503
            principal = authenticate(manager.services, self.headers)
            if not isinstance(principal, Principal):
                return None
            self.trust()  # the connection is a tenant's now, not a stranger's
            return route, principal

    HotConnection.__name__ = f"Hot{base.__name__}"
    return HotConnection
