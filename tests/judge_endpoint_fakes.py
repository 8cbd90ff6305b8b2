"""A SCRIPTED FAKE judge endpoint: an OpenAI-compatible `/v1/chat/completions` on loopback
that answers from a script, for what a real judge cannot be made to do on demand (429s
with Retry-After, 5xx, refusing response_format, answering slowly).

It is a real HTTP/1.1 server (asyncio + h11, keep-alive), so the client under test speaks
real HTTP to it; and it records what a test asserts on: requests, the most in flight at
once, the bodies and auth headers it got, and how many requests arrived inside a cool-down
it had announced with Retry-After (`during_window`: a well-behaved client sends none; those
that arrive within `grace_s` of the announcement were on their way before the client could
read it, and are counted apart as `crossed`).
Used by tests/verifiers/test_judge_endpoint.py and bench/judge_throttle.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11


@dataclass
class Reply:
    """One scripted answer."""

    status: int
    body: Any = None  # JSON; None: an OpenAI error object naming the status
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def completion(text: str, model: str = "fake-judge") -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class ScriptedJudge:
    """The fake (see the module docstring). Order of answers: inside an announced window a
    429 (as real rate limiters do); then `script`, first in first out; then a 400 to
    response_format when `refuse_schema`; then a 429 for `rate_limit_fraction` of the rest
    (which opens a window of `retry_after_s`); then a 200 carrying `answer(body)`."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        rate_limit_fraction: float = 0.0,
        retry_after_s: float = 1.0,
        refuse_schema: bool = False,
        answer: Callable[[dict[str, Any]], str] | None = None,
        seed: int = 0,
        keep_bodies: bool = True,
        grace_s: float = 0.0,
    ) -> None:
        self.latency_s = latency_s
        self.rate_limit_fraction = rate_limit_fraction
        self.retry_after_s = retry_after_s
        self.refuse_schema = refuse_schema
        self.answer = answer or (lambda body: '{"verdict": "fine"}')
        self.script: deque[Reply] = deque()
        self.keep_bodies = keep_bodies
        self._rng = random.Random(seed)
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.window_until = 0.0  # time.monotonic() the announced cool-down ends
        self.announced_at = 0.0  # when the last 429 was answered
        self.grace_s = grace_s
        self.during_window = 0
        self.crossed = 0
        self.late: list[float] = []  # in-window arrivals: seconds after the announcement
        self.statuses: Counter[int] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.authorization: list[str | None] = []
        self.arrivals: list[float] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> ScriptedJudge:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def _announce(self, now: float, wait_s: float) -> None:
        if now >= self.window_until:
            self.announced_at = now
        self.window_until = max(self.window_until, now + wait_s)

    def _rate_limited(self, wait_s: float) -> Reply:
        headers = {"retry-after": f"{max(1, round(wait_s))}"}  # integer seconds, as HTTP has
        headers["retry-after-ms"] = f"{wait_s * 1000:.0f}"  # OpenAI's precise one
        return Reply(429, {"error": {"message": "rate limited", "type": "rate_limit"}}, headers)

    async def _answer(self, target: str, raw: bytes, auth: str | None) -> Reply:
        now = time.monotonic()
        self.requests += 1
        self.arrivals.append(now)
        self.authorization.append(auth)
        if target != "/v1/chat/completions":
            return Reply(404, {"error": {"message": f"no route {target}"}})
        body = json.loads(raw)
        if self.keep_bodies:
            self.bodies.append(body)
        if now < self.window_until:
            self.late.append(now - self.announced_at)
            if now - self.announced_at < self.grace_s:
                self.crossed += 1
            else:
                self.during_window += 1
            return self._rate_limited(self.window_until - now)
        if self.script:
            reply = self.script.popleft()
            if reply.status == 429:  # the window it announces, as the fraction's do
                ms, seconds = reply.headers.get("retry-after-ms"), reply.headers.get("retry-after")
                self._announce(now, float(ms) / 1000 if ms else float(seconds or 0))
            return reply
        if self.refuse_schema and "response_format" in body:
            return Reply(400, {"error": {"message": "response_format is not supported"}})
        if self.rate_limit_fraction and self._rng.random() < self.rate_limit_fraction:
            self._announce(now, self.retry_after_s)
            return self._rate_limited(self.retry_after_s)
        return Reply(200, completion(self.answer(body)), delay_s=self.latency_s)

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
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    reply = await self._answer(
                        request.target.decode(), b"".join(chunks), headers.get("authorization")
                    )
                    if reply.delay_s:
                        await asyncio.sleep(reply.delay_s)
                finally:
                    self.in_flight -= 1
                self.statuses[reply.status] += 1
                body = reply.body if reply.body is not None else {"error": {"message": "error"}}
                payload = json.dumps(body).encode()
                head = [("content-type", "application/json"), ("content-length", str(len(payload)))]
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
