"""FakeModelServer: the tests' one FAKE model server (OpenAI / Anthropic shaped), on one HTTP
stack, answering what each test scripts.

A real model server (sdk/train/openai_server.py over a tiny model) answers garbage or one
fixed call, and never fails on demand; the tests that need a sensible agent, a judge that
grades or is fooled, 429s with Retry-After, 5xx, slow answers, redirects or replies without
token ids script them here. It is a real HTTP/1.1 server on loopback (asyncio + h11, with
keep-alive), so the client under test speaks real HTTP to it. It records what the tests
assert on: every request (`hits`), the most requests in flight at once, the statuses sent.

A test's script is the `answer` function, called with each request (a `Hit`) and returning
a `Reply` (or a coroutine of one); the scripts the suite shares live beside it:
tests/peers/fake_model.py (an agent's replies), tests/judge_fakes.py (judges),
tests/peers/commentary_judge.py (the commentary rubric), tests/harness_fakes.py (upstream
failure modes), tests/judge_endpoint_fakes.py (rate limits and cool-downs).

Serve it on the running event loop (`async with`) or on a loop of its own in a thread
(`with`), for sync tests and for a server process the test starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import h11


@dataclass
class Hit:
    """One request the fake got: the body is its JSON value, else its text (None: empty)."""

    method: str
    path: str  # without the query
    headers: dict[str, str]  # names in lower case
    body: Any
    at: float = field(default_factory=time.monotonic)


@dataclass
class Reply:
    """One answer: a JSON `body`, or a str / bytes sent as they are (`content_type`)."""

    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait this long first (without holding up other requests)
    content_type: str | None = None


Answer = Callable[[Hit], Reply | Awaitable[Reply]]


def error_reply(status: int, message: str, headers: Mapping[str, str] | None = None) -> Reply:
    """An OpenAI error object naming `status`."""
    return Reply(status, {"error": {"message": message, "code": status}}, headers or {})


def not_found(hit: Hit) -> Reply:
    return error_reply(404, f"no route {hit.method} {hit.path}")


def completion(content: str | None, model: str = "fake", **extra: Any) -> dict[str, Any]:
    """An OpenAI chat completion of one assistant message `content`; `extra` adds or
    replaces top-level fields."""
    message = {"role": "assistant", "content": content}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        **extra,
    }


def _encode(reply: Reply) -> tuple[bytes, str]:
    if isinstance(reply.body, bytes):
        return reply.body, reply.content_type or "application/octet-stream"
    if isinstance(reply.body, str):
        return reply.body.encode(), reply.content_type or "text/plain; charset=utf-8"
    if reply.body is None:
        return b"", reply.content_type or "application/json"
    return json.dumps(reply.body).encode(), reply.content_type or "application/json"


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class FakeModelServer:
    """The fake (see the module docstring). `url` is the base URL with `suffix` (`/v1`: what
    an OpenAI client is given)."""

    def __init__(
        self,
        answer: Answer = not_found,
        *,
        suffix: str = "/v1",
        port: int = 0,
        record: bool = True,
    ) -> None:
        self.respond = answer
        self.suffix = suffix
        self.port = port
        self.record = record  # keep every Hit (a benchmark's thousands need not)
        self.hits: list[Hit] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.statuses: Counter[int] = Counter()
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + self.suffix

    # -- on the running loop ------------------------------------------------------------
    async def start(self) -> FakeModelServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def __aenter__(self) -> FakeModelServer:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    # -- on a loop of its own, in a thread --------------------------------------------------
    def __enter__(self) -> FakeModelServer:
        ready = threading.Event()
        failed: list[BaseException] = []

        async def main() -> None:
            try:
                await self.start()
            except BaseException as exc:
                failed.append(exc)
                ready.set()
                return
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await self._stop.wait()
            await self.stop()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    # -- HTTP ------------------------------------------------------------------------------
    async def _reply(self, hit: Hit) -> Reply:
        if self.record:
            self.hits.append(hit)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            try:
                made = self.respond(hit)
                reply = await made if inspect.isawaitable(made) else made
            except Exception as exc:  # a script's bug: said, as a real server's 500 would
                reply = Reply(500, f"the fake's script failed: {exc!r}")
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
        finally:
            self.in_flight -= 1
        self.statuses[reply.status] += 1
        return reply

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request: h11.Request | None = None
                chunks: list[bytes] = []
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        conn.receive_data(data)
                        if not data and conn.their_state is h11.IDLE:
                            return
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        chunks.append(bytes(event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                hit = Hit(
                    method=request.method.decode(),
                    path=request.target.decode().split("?", 1)[0],
                    headers={k.decode().lower(): v.decode() for k, v in request.headers},
                    body=_decode(b"".join(chunks)),
                )
                reply = await self._reply(hit)
                payload, content_type = _encode(reply)
                head = [("content-type", content_type), ("content-length", str(len(payload)))]
                head += list(reply.headers.items())
                out = conn.send(h11.Response(status_code=reply.status, headers=head)) or b""
                out += conn.send(h11.Data(data=payload)) or b""
                out += conn.send(h11.EndOfMessage()) or b""
                writer.write(out)
                await writer.drain()
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            return
        finally:
            writer.close()
