"""A SCRIPTED FAKE judge endpoint: a script of the fake model server (tests/peers/
fake_model_server.py, on the test's own event loop) answering `/v1/chat/completions`, for
what a real judge cannot be made to do on demand (429s with Retry-After, 5xx, refusing
response_format, answering slowly). The client under test speaks real HTTP/1.1 to it;
it records what a test asserts on: requests, the most in flight at
once, the bodies and auth headers it got, and how many requests arrived inside a cool-down
it had announced with Retry-After (`during_window`: a well-behaved client sends none; those
that arrive within `grace_s` of the announcement were on their way before the client could
read it, and are counted apart as `crossed`).
Used by tests/verifiers/test_judge_endpoint.py and bench/judge_throttle.py.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from tests.peers.fake_model_server import FakeModelServer, Hit, Reply, completion

__all__ = ["Reply", "ScriptedJudge", "completion"]


class ScriptedJudge(FakeModelServer):
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
        super().__init__(self._judge, record=False)
        self.latency_s = latency_s
        self.rate_limit_fraction = rate_limit_fraction
        self.retry_after_s = retry_after_s
        self.refuse_schema = refuse_schema
        self.answer = answer or (lambda body: '{"verdict": "fine"}')
        self.script: deque[Reply] = deque()
        self.keep_bodies = keep_bodies
        self._rng = random.Random(seed)
        self.requests = 0
        self.window_until = 0.0  # time.monotonic() the announced cool-down ends
        self.announced_at = 0.0  # when the last 429 was answered
        self.grace_s = grace_s
        self.during_window = 0
        self.crossed = 0
        self.late: list[float] = []  # in-window arrivals: seconds after the announcement
        self.bodies: list[dict[str, Any]] = []
        self.authorization: list[str | None] = []
        self.arrivals: list[float] = []

    def _announce(self, now: float, wait_s: float) -> None:
        if now >= self.window_until:
            self.announced_at = now
        self.window_until = max(self.window_until, now + wait_s)

    def _rate_limited(self, wait_s: float) -> Reply:
        headers = {"retry-after": f"{max(1, round(wait_s))}"}  # integer seconds, as HTTP has
        headers["retry-after-ms"] = f"{wait_s * 1000:.0f}"  # OpenAI's precise one
        return Reply(429, {"error": {"message": "rate limited", "type": "rate_limit"}}, headers)

    def _judge(self, hit: Hit) -> Reply:
        reply = self._decide(hit)
        if reply.body is None:  # a scripted status alone: an OpenAI error object
            reply = Reply(
                reply.status, {"error": {"message": "error"}}, reply.headers, reply.delay_s
            )
        return reply

    def _decide(self, hit: Hit) -> Reply:
        now = hit.at
        self.requests += 1
        self.arrivals.append(now)
        self.authorization.append(hit.headers.get("authorization"))
        if hit.path != "/v1/chat/completions":
            return Reply(404, {"error": {"message": f"no route {hit.path}"}})
        body = hit.body if hit.body is not None else {}
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
        return Reply(200, completion(self.answer(body), "fake-judge"), delay_s=self.latency_s)
