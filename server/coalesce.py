"""One socket write a response: its head held until its body is written.

uvicorn writes a response's head (`http.response.start`) and its body as two transport
writes, and uvloop sends each at once: two `sendmsg` calls a response, the first of a few
hundred bytes. On a batch step's reply that first call was ~7 % of the server's CPU
(py-spy, bench/api.py --batch). The connection's transport is wrapped so a response head
waits for what follows it in the same loop iteration (the body, as every fast-path reply
sends it) and both leave in one `writelines`; a head with nothing after it (a stream whose
first chunk comes later) leaves at the end of the iteration, on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class CoalescingTransport:
    """`transport`, with a response head held back until the next write (or the end of
    the loop iteration, or a close)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
        elif isinstance(data, bytes) and data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Iterable[bytes]) -> None:
        self.flush()
        self._transport.writelines(chunks)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    # What the connection asks on every request, forwarded by name: `__getattr__` is only
    # reached after a failed lookup (an AttributeError raised and caught each time).
    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        return int(self._transport.get_write_buffer_size()) + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
