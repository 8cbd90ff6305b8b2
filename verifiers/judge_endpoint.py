"""A judge endpoint as the server shares it: one OpenAI-compatible `/chat/completions`
behind one gate that every episode's verifier goes through (`JudgeChat`), and the verdict
cache (`JudgeCache`).

Why a gate of its own and not each caller's retries: a judge is a rate-limited service the
operator pays for. With hundreds of episodes verifying at once, per-caller retries turn a
provider's 429 into a storm (every caller retries on its own schedule, most of them inside
the window the provider asked everyone to wait). The gate holds, per endpoint:

- a concurrency cap (`max_concurrency` requests in flight, never more);
- a shared cool-down: a 429 (or a 503 with Retry-After) stops every caller of the endpoint
  until Retry-After has passed (seconds, an HTTP date, or OpenAI's `retry-after-ms`,
  capped), then they resume with jitter;
- a retry budget: retries are at most `retry_ratio` of the calls of the last minute plus a
  floor, so an endpoint that is dying gets a trickle of retries, not a multiple of its load.
  A retry after a cool-down (429, or 503 with Retry-After) is exempt: every caller waited
  the time the endpoint asked for, so it cannot storm, and charging it voided episodes of a
  judge that was only rate-limiting (bench/judge_throttle.py: 47 of 512 at 20% 429s, 0
  exempt); the call's own `max_retries` still bounds it;
- a deadline per call (the whole call: queueing, cool-downs, retries).

Whatever gives up raises JudgeUnavailable(name, short reason), which voids the episode:
nothing the policy wrote can reach this code. The API key goes in one header and never into
a reason or a log line. Metrics go through `JudgeRecorder`, so this module needs nothing of
the server (dependency direction, DESIGN §2).

The transport is the session proxy's h11 pool (sdk/http11.py), not httpx: at 32 requests
in flight httpx's pool cost ~3.8 ms of CPU a request on this machine, on the event loop that
also serves steps (bench/judge_throttle.py prints the CPU per request).
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import json
import logging
import random
import re
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import h11

from palaestra.sdk.http11 import Answer, Target, TooLarge, UpstreamPool
from palaestra.verifiers.judge_protocol import JudgeSampling, JudgeUnavailable

log = logging.getLogger("palaestra.judges")

BUDGET_WINDOW_S = 60  # the retry budget counts the calls of this many recent seconds
DEFAULT_COOL_DOWN_S = 1.0  # a 429 without Retry-After
MAX_REPLY_BYTES = 8 * 1024 * 1024
SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class EndpointConfig:
    """One endpoint's address and operating limits (Settings.judges builds these)."""

    name: str
    url: str  # the OpenAI base URL (…/v1) or the full …/chat/completions
    model: str
    api_key: str | None = field(default=None, repr=False)
    max_concurrency: int = 16
    deadline_s: float = 120.0
    max_retries: int = 4
    retry_ratio: float = 0.2
    retry_floor: int = 10
    timeout_s: float = 60.0
    retry_after_cap_s: float = 60.0
    backoff_s: float = 0.5  # first 5xx/connection backoff; doubles each retry
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.max_retries < 0 or self.retry_floor < 0:
            raise ValueError("max_concurrency must be >= 1, max_retries and retry_floor >= 0")
        if not (self.deadline_s > 0 and self.timeout_s > 0 and self.retry_ratio >= 0):
            raise ValueError("deadline_s and timeout_s must be > 0, retry_ratio >= 0")

    @property
    def chat_url(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/chat/completions") else f"{url}/chat/completions"


class JudgeRecorder(Protocol):
    """Where an endpoint reports what it does (server/metrics.py's JudgeMetrics)."""

    def request(self, endpoint: str, outcome: str) -> None:
        """One HTTP request sent: ok, 429, 5xx, 4xx, connection, timeout, bad_reply."""

    def retry(self, endpoint: str) -> None:
        """A request sent again (the budget granted it)."""

    def call(self, endpoint: str, latency_s: float, failure: str | None) -> None:
        """One `complete` ended after `latency_s`; `failure` is the kind it gave up for."""

    def in_flight(self, endpoint: str, delta: int) -> None:
        """Requests in flight went up or down by `delta`."""


class NoRecorder:
    """Records nothing (an endpoint outside a server)."""

    def request(self, endpoint: str, outcome: str) -> None:
        pass

    def retry(self, endpoint: str) -> None:
        pass

    def call(self, endpoint: str, latency_s: float, failure: str | None) -> None:
        pass

    def in_flight(self, endpoint: str, delta: int) -> None:
        pass


class RetryBudget:
    """Retries may be at most `ratio` × the calls of the last BUDGET_WINDOW_S seconds,
    plus `floor` (so a quiet endpoint can still retry a few times)."""

    def __init__(self, ratio: float, floor: int) -> None:
        self.ratio = ratio
        self.floor = floor
        self._seconds: OrderedDict[int, list[int]] = OrderedDict()  # second -> [calls, retries]
        self._calls = 0
        self._retries = 0

    def _slot(self) -> list[int]:
        now = int(time.monotonic())
        while self._seconds:
            second, counts = next(iter(self._seconds.items()))
            if second > now - BUDGET_WINDOW_S:
                break
            del self._seconds[second]
            self._calls -= counts[0]
            self._retries -= counts[1]
        slot = self._seconds.get(now)
        if slot is None:
            slot = self._seconds[now] = [0, 0]
        return slot

    def deposit(self) -> None:
        """A new call (not a retry) started."""
        self._slot()[0] += 1
        self._calls += 1

    def withdraw(self) -> bool:
        """Take one retry; False when the budget has none left."""
        slot = self._slot()
        if self._retries + 1 > self.ratio * self._calls + self.floor:
            return False
        slot[1] += 1
        self._retries += 1
        return True


class EndpointGate:
    """The cap, the shared cool-down and the retry budget of one endpoint.

    Within the cap, how many requests may be in flight (`limit`) halves at each cool-down
    and grows by one a success: a burst of requests resuming together after a cool-down
    would mostly arrive after the endpoint's next 429 and be refused too."""

    def __init__(self, config: EndpointConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.budget = RetryBudget(config.retry_ratio, config.retry_floor)
        self._rng = rng or random.Random()
        self._queue: deque[asyncio.Future[None]] = deque()  # callers waiting for a slot
        self.limit = float(config.max_concurrency)
        self._cut_until = 0.0  # the cool-down the limit was last halved for
        self.cool_until = 0.0  # time.monotonic(): no request leaves before it
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    def cooling(self) -> bool:
        return self.cool_until > time.monotonic()

    def cool_down(self, delay_s: float) -> None:
        """Every caller waits `delay_s` (capped) from now before its next request."""
        now = time.monotonic()
        delay = min(max(delay_s, 0.0), self.config.retry_after_cap_s)
        self.cool_until = max(self.cool_until, now + delay)
        if now >= self._cut_until:  # once a cool-down, however many 429s it brings
            self.limit = max(1.0, self.limit / 2)
            self._cut_until = self.cool_until

    def answered(self) -> None:
        """A success: one more request may be in flight, up to the cap."""
        if self.limit < self.config.max_concurrency:
            self.limit = min(float(self.config.max_concurrency), self.limit + 1)
            self._wake()

    async def wait_cool(self, deadline_at: float) -> None:
        """Sleep out the cool-down (with jitter, so the callers do not all resume at once);
        gives up at once when it ends past `deadline_at`."""
        while (wait := self.cool_until - time.monotonic()) > 0:
            if self.cool_until > deadline_at:
                raise _GiveUp("deadline", "429 cool-down outlasts the deadline")
            await asyncio.sleep(wait + self._rng.uniform(0.0, min(0.5, 0.1 * wait) + 0.005))

    async def acquire(self, deadline_at: float) -> None:
        """A slot under the limit, outside any cool-down; callers queue first come first
        served (one woken during a cool-down sleeps it out without holding a slot)."""
        woken = False
        while True:
            await self.wait_cool(deadline_at)
            if self.in_flight < self.allowed and (woken or not self._queue):
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                return
            turn = asyncio.get_running_loop().create_future()
            self._queue.append(turn)
            try:
                await turn
            except BaseException:
                if turn in self._queue:
                    self._queue.remove(turn)
                elif turn.done() and not turn.cancelled():
                    self._wake()  # its turn goes to the next caller
                raise
            woken = True

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        free = self.allowed - self.in_flight
        while free > 0 and self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)
                free -= 1

    def backoff(self, retry: int) -> float:
        """Exponential backoff with full jitter for the `retry`-th retry (from 1)."""
        ceiling = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** (retry - 1))
        return self._rng.uniform(ceiling / 2, ceiling)


class _GiveUp(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind  # the failures metric's label
        self.reason = reason


class _Retry(Exception):
    def __init__(self, kind: str, reason: str, *, shared: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.shared = shared  # the gate's cool-down is the wait (429): no backoff of its own


class _FormatRejected(Exception):
    """A 400 to a request with response_format."""


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait an answer asks for (`headers` named in lower case): `retry-after-ms`,
    `Retry-After` seconds or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class JudgeEndpoint:
    """`JudgeChat` over one OpenAI-compatible endpoint (see the module docstring)."""

    def __init__(
        self,
        config: EndpointConfig,
        *,
        pool: UpstreamPool | None = None,
        recorder: JudgeRecorder | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.gate = EndpointGate(config, rng)
        self._recorder: JudgeRecorder = recorder or NoRecorder()
        self._owns_pool = pool is None
        self._pool = pool or make_pool()
        self._target = Target.parse(config.chat_url)  # ValueError: what is wrong with it
        self._headers = [("accept", "application/json")]
        if config.api_key:
            self._headers.append(("authorization", f"Bearer {config.api_key}"))
        self.schema_refused = False  # the endpoint answered 400 to response_format once

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def model(self) -> str:
        return self.config.model

    async def aclose(self) -> None:
        if self._owns_pool:
            await self._pool.aclose()

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        sampling: JudgeSampling,
        *,
        schema: Mapping[str, Any] | None = None,
    ) -> str:
        started = time.monotonic()
        failure: str | None = "error"  # an exception of ours (a bug) until shown otherwise
        try:
            text = await self._complete(messages, sampling, schema, started)
            failure = None
            return text
        except _GiveUp as exc:
            failure = exc.kind
            reason = self._redact(exc.reason)
            log.debug("judge %s gave no answer: %s", self.name, reason)  # assess logs the void
            raise JudgeUnavailable(self.name, reason) from None
        except asyncio.CancelledError:
            failure = None  # the episode went away: no verdict was waited for
            raise
        finally:
            self._recorder.call(self.name, time.monotonic() - started, failure)

    async def _complete(
        self,
        messages: Sequence[Mapping[str, str]],
        sampling: JudgeSampling,
        schema: Mapping[str, Any] | None,
        started: float,
    ) -> str:
        deadline_s = self.config.deadline_s
        deadline_at = started + deadline_s
        use_schema = schema is not None and not self.schema_refused
        fell_back = False
        self.gate.budget.deposit()
        retries = 0
        last = ""
        try:
            async with asyncio.timeout(deadline_s):
                while True:
                    payload = self._payload(messages, sampling, schema if use_schema else None)
                    try:
                        text = await self._attempt(payload, deadline_at, use_schema)
                    except _FormatRejected:
                        use_schema, fell_back = False, True  # once more, without it
                        continue
                    except _Retry as exc:
                        last = exc.reason
                        await self._before_retry(exc, retries, deadline_at)
                        retries += 1
                        continue
                    if fell_back:  # remembered: this endpoint takes no response_format
                        self.schema_refused = True
                        log.info("judge %s refuses response_format: sent without", self.name)
                    return text
        except TimeoutError:
            after = f" (last: {last})" if last else ""
            raise _GiveUp("deadline", f"deadline {deadline_s:g}s passed{after}") from None

    async def _before_retry(self, exc: _Retry, retries: int, deadline_at: float) -> None:
        """Grant retry number `retries + 1` (the call's and the budget's limits) and wait
        its backoff; _GiveUp when it may not happen."""
        if retries >= self.config.max_retries:
            raise _GiveUp(exc.kind, f"{exc.reason} after {retries} retries") from None
        if not exc.shared and not self.gate.budget.withdraw():
            raise _GiveUp("budget", f"{exc.reason}: retry budget spent") from None
        self._recorder.retry(self.name)
        if exc.shared:
            return  # the gate's cool-down is the wait
        wait = self.gate.backoff(retries + 1)
        if time.monotonic() + wait > deadline_at:
            raise _GiveUp("deadline", f"{exc.reason}: backoff outlasts the deadline") from None
        await asyncio.sleep(wait)

    def _payload(
        self,
        messages: Sequence[Mapping[str, str]],
        sampling: JudgeSampling,
        schema: Mapping[str, Any] | None,
    ) -> bytes:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": [dict(m) for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "stream": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if schema is not None:
            name = SCHEMA_NAME.sub("_", str(schema.get("title") or "verdict"))[:64] or "verdict"
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": dict(schema), "strict": True},
            }
        return json.dumps(body).encode()

    async def _attempt(self, payload: bytes, deadline_at: float, with_schema: bool) -> str:
        """One request through the gate; the reply's text, or _Retry / _GiveUp /
        _FormatRejected."""
        await self.gate.acquire(deadline_at)
        self._recorder.in_flight(self.name, 1)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                answer = await self._pool.post(
                    self._target, payload, MAX_REPLY_BYTES, self._headers
                )
        except TimeoutError:
            self._recorder.request(self.name, "timeout")
            raise _Retry("timeout", f"no answer in {self.config.timeout_s:g}s") from None
        except TooLarge:
            self._recorder.request(self.name, "bad_reply")
            raise _GiveUp("bad_reply", f"reply over {MAX_REPLY_BYTES >> 20} MiB") from None
        except (OSError, h11.ProtocolError) as exc:
            self._recorder.request(self.name, "connection")
            refused = isinstance(exc, ConnectionRefusedError) or "refused" in str(exc).lower()
            reason = (
                "connection refused" if refused else f"connection failed ({type(exc).__name__})"
            )
            raise _Retry("connection", reason) from None
        finally:
            self.gate.release()
            self._recorder.in_flight(self.name, -1)
        return self._read(answer, with_schema)

    def _read(self, response: Answer, with_schema: bool) -> str:
        status = response.status
        if status == 429:
            self._recorder.request(self.name, "429")
            wait = retry_after_s(response.headers)
            self.gate.cool_down(DEFAULT_COOL_DOWN_S if wait is None else wait)
            raise _Retry("rate_limited", "429", shared=True)
        if status >= 500:
            self._recorder.request(self.name, "5xx")
            wait = retry_after_s(response.headers)
            if wait is not None:
                self.gate.cool_down(wait)
            raise _Retry("http_5xx", f"HTTP {status}", shared=wait is not None)
        if status == 400 and with_schema:
            self._recorder.request(self.name, "4xx")
            raise _FormatRejected
        if status == 408:
            self._recorder.request(self.name, "timeout")
            raise _Retry("timeout", "HTTP 408")
        if status != 200:
            self._recorder.request(self.name, "4xx")
            raise _GiveUp("http_4xx", f"HTTP {status}{_error_message(response)}")
        try:
            content = json.loads(response.body)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            self._recorder.request(self.name, "bad_reply")
            raise _Retry("bad_reply", "the reply is not a chat completion with text content")
        self._recorder.request(self.name, "ok")
        self.gate.answered()
        return content

    def _redact(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, "***") if key else text


def _error_message(response: Answer) -> str:
    """': <the error's message>' from an OpenAI error body, short; '' without one."""
    try:
        error = json.loads(response.body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        return ""
    if not isinstance(message, str) or not message.strip():
        return ""
    message = " ".join(message.split())
    return f": {message[:160]}{'…' if len(message) > 160 else ''}"


def make_pool() -> UpstreamPool:
    """Keep-alive connections by origin; no proxy from the environment (configuration comes
    through Settings only), no redirects."""
    return UpstreamPool(connect_timeout_s=10.0, user_agent="palaestra-judge")


class MemoryJudgeCache:
    """`JudgeCache` in memory: the `max_entries` most recently used judgements."""

    def __init__(self, max_entries: int = 10_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> Mapping[str, Any] | None:
        value = self._items.get(key)
        if value is None:
            return None
        self._items.move_to_end(key)
        return copy.deepcopy(value)  # a caller's edits never reach the next one

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        self._items[key] = copy.deepcopy(dict(value))
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)
