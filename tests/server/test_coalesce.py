"""server/coalesce.py: a response's head leaves with its body in one write, and never later
than the end of the loop iteration that wrote it; on a real `palaestra serve` connection a
step's reply arrives whole."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx

from palaestra.server.coalesce import CoalescingTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    """What reaches the socket: each call, in order (a recording double, not a transport)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, chunks: Any) -> None:
        self.calls.append(("writelines", [bytes(c) for c in chunks]))

    def close(self) -> None:
        self.calls.append(("close", None))

    def abort(self) -> None:
        self.calls.append(("abort", None))

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


async def test_a_head_and_its_body_leave_in_one_call() -> None:
    raw = RecordingTransport()
    t = CoalescingTransport(raw)
    t.write(HEAD)
    assert raw.calls == [] and t.get_write_buffer_size() == len(HEAD)
    t.write(b"{}")
    assert raw.calls == [("writelines", [HEAD, b"{}"])]
    await asyncio.sleep(0)
    assert len(raw.calls) == 1  # nothing left to flush
    assert t.is_closing() is False  # the rest is the transport's own


async def test_a_head_alone_leaves_at_the_end_of_the_iteration_or_at_close() -> None:
    raw = RecordingTransport()
    t = CoalescingTransport(raw)
    t.write(HEAD)  # a stream's head: its first chunk comes later
    await asyncio.sleep(0)
    assert raw.calls == [("write", HEAD)]
    t.write(b"chunk")  # not a head: straight through
    t.write(HEAD)
    t.close()
    assert raw.calls[1:] == [("write", b"chunk"), ("write", HEAD), ("close", None)]
    aborted = RecordingTransport()
    t = CoalescingTransport(aborted)
    t.write(HEAD)
    t.abort()  # an aborted connection sends nothing more
    await asyncio.sleep(0)
    assert aborted.calls == [("abort", None)]


def test_a_served_reply_arrives_whole(server: Any) -> None:
    """Through `palaestra serve` (the session's door server): a raw HTTP/1.1 request gets
    its head and body, on a keep-alive connection, twice."""
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200") and body.startswith(b"{"), data
