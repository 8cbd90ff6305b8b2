"""Pipe ends the event loop serves by number, each closed exactly once, by its owner.

Why not ``loop.connect_read_pipe`` / ``connect_write_pipe``: under uvloop (the server's
loop whenever uvicorn finds it) a pipe transport's close shuts the descriptor in libuv and
*then* calls the file object's ``close()`` too, ignoring its EBADF.  Between the two, any
other thread of the server may be handed the same number (a sandbox's ``rmtree`` in a
worker thread opens directories all the time), and the second close shuts *that* file: the
thread fails with EBADF, or worse writes to whatever opens next under the number.  So the
pipes of a sandbox's shell and of the Python fork server are read and written here, with
``add_reader`` / ``add_writer`` on descriptors this module owns and closes once, on any loop.
"""

from __future__ import annotations

import asyncio
import os

CHUNK = 1 << 16


class PipeReader:
    """Feeds `stream` from the read end `fd` (owned from here on) until end of file, then
    closes it.  It is also the stream's transport: the stream pauses reading when its
    buffer is over twice its limit, and resumes it as the buffer drains (back-pressure)."""

    def __init__(self, fd: int, stream: asyncio.StreamReader) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._stream = stream
        self._watching = False
        os.set_blocking(fd, False)
        stream.set_transport(self)  # type: ignore[arg-type]  # pause_reading/resume_reading
        self.resume_reading()

    @classmethod
    def open(cls, fd: int, limit: int = 2**16) -> tuple[PipeReader, asyncio.StreamReader]:
        """A reader for `fd` and the stream it fills."""
        stream = asyncio.StreamReader(limit=limit)
        return cls(fd, stream), stream

    def pause_reading(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def resume_reading(self) -> None:
        if not self._watching and self._fd >= 0:
            self._loop.add_reader(self._fd, self._on_readable)
            self._watching = True

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._stream.feed_data(data)
        else:
            self.close()

    def close(self) -> None:
        """Stop reading and close the descriptor (the stream sees end of file); idempotent."""
        self.pause_reading()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
            self._stream.feed_eof()


class PipeWriter:
    """Writes to the write end `fd` (owned from here on) as a transport does: `write` takes
    the whole message at once (what the pipe does not take now is buffered and written as
    it drains), and `drain` waits while more than HIGH_WATER bytes are buffered. So a
    cancelled `drain` never leaves half a message in the pipe: the rest still follows.
    Once the reader is gone `drain` raises BrokenPipeError; after `close`,
    ConnectionResetError."""

    HIGH_WATER = 1 << 16

    def __init__(self, fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._buffer = bytearray()
        self._error: OSError | None = None
        self._waiters: list[asyncio.Future[None]] = []
        os.set_blocking(fd, False)

    def write(self, data: bytes) -> None:
        if self._fd < 0 or self._error is not None:
            return  # `drain` says why
        if not self._buffer:
            try:
                data = data[os.write(self._fd, data) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                self._fail(exc)
                return
            if not data:
                return
            self._loop.add_writer(self._fd, self._on_writable)
        self._buffer += data

    def _on_writable(self) -> None:
        try:
            del self._buffer[: os.write(self._fd, self._buffer)]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        if not self._buffer:
            self._loop.remove_writer(self._fd)
        if len(self._buffer) <= self.HIGH_WATER:
            self._wake()

    def _fail(self, exc: OSError) -> None:
        if self._buffer:
            self._loop.remove_writer(self._fd)
            self._buffer.clear()
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def drain(self) -> None:
        while len(self._buffer) > self.HIGH_WATER and self._fd >= 0 and self._error is None:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter
        if self._error is not None:
            raise self._error
        if self._fd < 0:
            raise ConnectionResetError("the pipe was closed")

    def close(self) -> None:
        """Close the descriptor, dropping what is still buffered (a waiting `drain` ends
        with ConnectionResetError); idempotent."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if self._buffer:
            self._loop.remove_writer(fd)
            self._buffer.clear()
        os.close(fd)
        self._wake()
