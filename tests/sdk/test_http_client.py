"""The HTTP clients retry what is retryable, and a retried step never steps twice."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import ServerProcess, free_port

from palaestra.sdk.errors import CapacityError, TransportError
from palaestra.sdk.http import AsyncHTTPClient, HTTPClient, RetryPolicy

ECHO = "palaestra/echo:say-birch"


class DropFirstResponse:
    """A loopback TCP proxy that forwards requests but drops the first step's response.

    It models a response lost on the way back (a reset connection): the server has
    stepped, the client never heard, so the client retries the same request.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.dropped = 0
        self._transports: list[asyncio.BaseTransport] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DropFirstResponse:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        for transport in self._transports:
            transport.abort()
        self._loop.run_until_complete(asyncio.sleep(0.05))  # let the aborts finish
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._transports += [writer.transport, up_w.transport]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                up_w.write(head + body)
                await up_w.drain()
                reply_head = await up_r.readuntil(b"\r\n\r\n")
                size = 0
                for line in reply_head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        size = int(line.split(b":")[1])
                reply = reply_head + await up_r.readexactly(size)
                if b"/step " in head.split(b"\r\n")[0] and self.dropped == 0:
                    self.dropped += 1
                    writer.transport.abort()  # the server stepped; the client hears nothing
                    return
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            up_w.close()


def test_lost_step_response_is_retried_without_stepping_twice(server: ServerProcess) -> None:
    with DropFirstResponse(server.port) as proxy:
        with HTTPClient(
            f"http://127.0.0.1:{proxy.port}",
            token=server.token,
            retry=RetryPolicy(attempts=3, base_s=0.01),
        ) as client:
            episode = client.reset(ECHO)
            reply = client.step(episode.episode_id, {"tool": "echo", "arguments": {"text": "x"}})
            assert reply.observation.text == "x"
            state = client.state(episode.episode_id)
        assert proxy.dropped == 1
        assert state.step_count == 1  # retried with the same request_id: replayed, not re-run
        assert len(state.trajectory) == 1


async def test_async_client_lost_response_is_retried(server: ServerProcess) -> None:
    with DropFirstResponse(server.port) as proxy:
        async with AsyncHTTPClient(
            f"http://127.0.0.1:{proxy.port}",
            token=server.token,
            retry=RetryPolicy(attempts=3, base_s=0.01),
        ) as client:
            episode = await client.reset(ECHO)
            await client.step(episode.episode_id, {"tool": "echo", "arguments": {"text": "y"}})
            state = await client.state(episode.episode_id)
        assert proxy.dropped == 1
        assert state.step_count == 1


def test_capacity_is_retried_after_retry_after(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", args=["--max-episodes", "1"]).start()
    try:
        with (
            server.client(retry=RetryPolicy(attempts=1)) as once,
            server.client(retry=RetryPolicy(attempts=6, max_s=0.5)) as patient,
        ):
            held = once.reset(ECHO)
            with pytest.raises(CapacityError) as refused:
                once.reset(ECHO)
            assert refused.value.retry_after is not None
            assert refused.value.retryable
            timer = threading.Timer(0.4, once.close, args=(held.episode_id,))
            timer.start()
            started = time.monotonic()
            second = patient.reset(ECHO)  # 429s until the timer frees the place
            assert time.monotonic() - started >= 0.3
            assert second.episode_id != held.episode_id
            timer.join()
    finally:
        server.stop()


def test_unreachable_server_raises_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with (
            HTTPClient(
                f"http://127.0.0.1:{port}", retry=RetryPolicy(attempts=2, base_s=0.01)
            ) as client,
            pytest.raises(TransportError) as failed,
        ):
            client.reset(ECHO)
    assert failed.value.retryable
    assert "POST /v1/episodes" in failed.value.message


def test_sync_client_in_a_thread_and_inside_a_running_loop(server: ServerProcess) -> None:
    """The sync client needs no event loop of its own and never touches the caller's: it
    works in a thread without one, and when user code calls it from inside a running loop."""
    say = {"tool": "echo", "arguments": {"text": "t"}}

    def play(client: HTTPClient) -> str:
        episode = client.reset(ECHO)
        text = client.step(episode.episode_id, say).observation.text
        client.close(episode.episode_id)
        return text

    with server.client() as client:
        got: list[str] = []
        worker = threading.Thread(target=lambda: got.append(play(client)))
        worker.start()
        worker.join(60)
        assert got == ["t"]

        async def inside_a_loop() -> str:
            return play(client)  # blocking, as a sync client is; the loop is left alone

        assert asyncio.run(inside_a_loop()) == "t"


def test_one_client_surface() -> None:
    """The sync clients are generated from the async interface: the same methods, the same
    signatures, in the HTTP and the in-process clients alike."""
    import inspect

    from palaestra.sdk.client import AsyncServerClient, Client
    from palaestra.server.inprocess import AsyncInProcessClient, InProcessClient

    public = [n for n in dir(AsyncServerClient) if not n.startswith("_")]
    assert {"reset", "step", "verify", "batch_step", "tasks", "sampler"} <= set(public)
    for name in public:
        want = inspect.signature(getattr(AsyncServerClient, name))
        for sync in (Client, HTTPClient, InProcessClient):
            assert inspect.signature(getattr(sync, name)) == want, (sync, name)
        for concrete in (AsyncHTTPClient, AsyncInProcessClient):
            assert inspect.signature(getattr(concrete, name)) == want, (concrete, name)
    assert issubclass(HTTPClient, Client) and issubclass(InProcessClient, Client)
