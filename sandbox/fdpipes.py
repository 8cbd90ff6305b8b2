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
    """Writes to the write end `fd` (owned from here on), waiting while the pipe is full.

    Writes are serialised: two callers never interleave their bytes.  Once the reader is
    gone a write raises BrokenPipeError; after `close`, ConnectionResetError."""

    def __init__(self, fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._lock = asyncio.Lock()
        self._writable: asyncio.Future[None] | None = None
        os.set_blocking(fd, False)

    async def write(self, data: bytes) -> None:
        async with self._lock:
            view = memoryview(data)
            while view:
                if self._fd < 0:
                    raise ConnectionResetError("the pipe was closed")
                try:
                    view = view[os.write(self._fd, view) :]
                except (BlockingIOError, InterruptedError):
                    await self._wait_writable()

    async def _wait_writable(self) -> None:
        waiter = self._writable = self._loop.create_future()
        self._loop.add_writer(self._fd, self._wake)
        try:
            await waiter
        finally:
            self._writable = None
            if self._fd >= 0:
                self._loop.remove_writer(self._fd)

    def _wake(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def close(self) -> None:
        """Close the descriptor (a write waiting for room ends with ConnectionResetError);
        idempotent."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if self._writable is not None:
            self._loop.remove_writer(fd)
            if not self._writable.done():
                self._writable.set_result(None)  # its loop sees the closed pipe
        os.close(fd)
