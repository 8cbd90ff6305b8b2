"""The episode channel: a front's persistent connection to one worker, for episode calls.

Ray places, starts, watches and names the workers; episode calls (reset, step, verify,
state, close) go over this channel instead of Ray actor calls because an actor call costs
about 1–5 ms from an asyncio front on a busy 2-core machine, while a step may add only
0.5 ms (docs/reference/cluster.md). One TCP connection per front and worker carries
many calls at once, each a length-prefixed frame:

    request:  u32 length | u32 call id | method (ascii) | 0x0a | JSON arguments
    reply:    u32 length | u32 call id | kind (0 ok, 1 error, 2 bug) | JSON body

A connection starts with the worker's channel key (32 bytes, from Ray's worker info), so a
process that can reach the port but is not a front gets nothing. A broken connection fails
every call in flight with WorkerUnreachable; the front then asks Ray whether the worker died.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from palaestra.sdk import errors

log = logging.getLogger("palaestra.cluster")

HEAD = struct.Struct(">II")  # frame length (after the length field), call id
MAX_FRAME = 256 * 1024 * 1024
KEY_BYTES = 32
OK, ERROR, BUG = 0, 1, 2

Handler = Callable[[str, dict[str, Any]], Awaitable[bytes]]


class WorkerUnreachable(Exception):
    """The connection to a worker broke (or never opened): the worker may be gone."""


def error_json(exc: errors.PalaestraError) -> bytes:
    body = {
        "type": type(exc).__name__,
        "message": exc.message,
        "code": exc.code,
        "retryable": exc.retryable,
        "retry_after": exc.retry_after,
    }
    return json.dumps(body).encode()


def raise_error(body: bytes) -> None:
    """Raise the PalaestraError a worker answered with, as the same class."""
    data = json.loads(body)
    cls = getattr(errors, str(data.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.PalaestraError)):
        cls = errors.ServerError
    raise cls(
        str(data.get("message")),
        code=data.get("code"),
        retryable=data.get("retryable"),
        retry_after=data.get("retry_after"),
    )


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readexactly(HEAD.size)
    length, call_id = HEAD.unpack(head)
    if length < 4 or length > MAX_FRAME:
        raise ConnectionError(f"a frame of {length} bytes is out of bounds")
    return call_id, await reader.readexactly(length - 4)


def _frame(call_id: int, payload: bytes) -> bytes:
    return HEAD.pack(len(payload) + 4, call_id) + payload


class ChannelServer:
    """The worker's side: answers calls with `handler(method, args)` → JSON bytes."""

    def __init__(self, handler: Handler, key: bytes) -> None:
        self.handler = handler
        self.key = key
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str) -> int:
        self._server = await asyncio.start_server(self._serve, host, 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            offered = await asyncio.wait_for(reader.readexactly(KEY_BYTES), 5.0)
            if not hmac.compare_digest(offered, self.key):
                log.warning("episode channel: a connection offered the wrong key")
                return
            while True:
                call_id, payload = await _read_frame(reader)
                task = asyncio.create_task(self._answer(writer, call_id, payload))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, call_id: int, payload: bytes) -> None:
        method, _, raw = payload.partition(b"\n")
        try:
            body = await self.handler(method.decode(), json.loads(raw))
            kind = OK
        except errors.PalaestraError as exc:
            body, kind = error_json(exc), ERROR
        except Exception as exc:
            log.exception("episode channel: %s failed", method.decode(errors="replace"))
            body, kind = json.dumps(f"{type(exc).__name__}: {exc}").encode(), BUG
        if not writer.is_closing():
            writer.write(_frame(call_id, bytes([kind]) + body))


class ChannelClient:
    """The front's side: one connection to one worker, opened on first use."""

    def __init__(self, host: str, port: int, key: bytes, timeout_s: float = 10.0) -> None:
        self.address = (host, port)
        self.key = key
        self.timeout_s = timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._next = 0
        self._opening = asyncio.Lock()

    @property
    def broken(self) -> bool:
        return self._writer is not None and self._writer.is_closing()

    async def _open(self) -> asyncio.StreamWriter:
        async with self._opening:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.address), self.timeout_s
                )
            except (OSError, TimeoutError) as exc:
                raise WorkerUnreachable(f"cannot connect to {self.address}: {exc}") from None
            writer.write(self.key)
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read_replies(reader))
            return writer

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        why = "the worker closed the connection"
        try:
            while True:
                call_id, payload = await _read_frame(reader)
                waiter = self._waiting.pop(call_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result((payload[0], payload[1:]))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            why = f"the connection broke ({type(exc).__name__})"
        finally:
            if self._writer is not None:
                self._writer.close()
            for waiter in self._waiting.values():
                if not waiter.done():
                    waiter.set_exception(WorkerUnreachable(why))
            self._waiting.clear()

    async def call(self, method: str, args: dict[str, Any]) -> bytes:
        """The worker's JSON answer; raises its PalaestraError, or WorkerUnreachable."""
        writer = await self._open()
        self._next = (self._next + 1) % 2**32
        call_id = self._next
        waiter: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = waiter
        payload = method.encode() + b"\n" + json.dumps(args).encode()
        try:
            writer.write(_frame(call_id, payload))
            kind, body = await waiter
        finally:
            self._waiting.pop(call_id, None)
        if kind == ERROR:
            raise_error(body)
        if kind == BUG:
            raise errors.ServerError(f"a worker failed: {json.loads(body)}", code="worker_error")
        return body

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
