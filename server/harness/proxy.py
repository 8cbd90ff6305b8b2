"""The session model proxy (issue 20; docs/reference/harness.md): one `SessionProxy`
per server, one `LlmSession` per harness episode.

A session forwards the harness's chat-completions calls (and, translated by
server/harness/dialects.py, Anthropic messages and Open Responses) to the one endpoint
named at reset, `options.model_endpoint` + `/chat/completions`, and nowhere else: no URL
from the body or the headers, no path of the harness's joined in, no redirect followed, no
proxy from the environment. It asks the upstream for its token ids the vLLM way and
records each call as an `LlmCall` with the ids and logprobs exactly as returned; a reply
without them is an infrastructure fault (the episode is void), as is an upstream that does
not answer. What the agent causes (a context too long: the upstream's 4xx) goes back to
the harness unchanged. The episode's call and token limits are enforced here: the call
that would go over is refused and `limit` says which.

What is recorded of each call, and how many bytes (`llm_max_recorded_mb`,
`token_max_llm_recorded_mb`; refused calls too, bounded): server/harness/records.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import h11
from pydantic_core import to_json

from palaestra.sandbox.base import SocketService
from palaestra.sdk.harness import HarnessOptions, LlmApi, LlmCall
from palaestra.sdk.http11 import Target, TooLarge, UpstreamPool
from palaestra.server.config import Settings
from palaestra.server.harness import anthropic, responses
from palaestra.server.harness.chat_shape import (
    Refusal,
    check_fields,
    completion_error,
    reply_tokens,
)
from palaestra.server.harness.dialects import ANTHROPIC, OPENAI, RESPONSES, answer_reply, to_chat
from palaestra.server.harness.gateway import ModelGateway
from palaestra.server.harness.records import UPSTREAM_ERROR_CHARS, Records, upstream_error
from palaestra.server.harness.replay import Replay
from palaestra.server.harness.wire import Reply, openai_error

log = logging.getLogger("palaestra.harness")

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
MESSAGES_PATHS = frozenset({"/v1/messages", "/messages"})
RESPONSES_PATHS = frozenset({"/v1/responses", "/responses"})
MODELS_PATHS = frozenset({"/v1/models", "/models"})
# The fields of a harness's body sent on: OpenAI's chat request, less what the proxy sets
# itself. The rest (vLLM's extensions: reply-growing `prompt_logprobs`/`top_logprobs`/`echo`,
# inputs engines crash on such as a huge `top_k`, grammars to compile) is not: an upstream's
# 500, a reply past llm_max_response_kb or a dead engine is a fault, void, the policy caused.
HARNESS_FIELDS = frozenset({
    "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens",
    "max_completion_tokens", "stop", "temperature", "top_p", "seed", "presence_penalty",
    "frequency_penalty", "n",
})  # fmt: skip
# A record the server fails to store is a fault (void), so a request whose record could not
# be written (a lone \ud800 surrogate: no UTF-8; nesting past pydantic's serialization depth)
# is refused first, checked as the store will write it, this many levels down its record.
RECORD_DEPTH = 16
NO_IDS = "serve with vLLM ≥ 0.10.2 or palaestra.sdk.train.openai_server"


class _Fault(Exception):
    """The upstream failed in a way the policy cannot cause: the session's `fault`;
    `status` the HTTP status it answered, if it answered one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _endpoint_target(endpoint: str) -> Target:
    """The one URL a session posts to; ValueError naming what is wrong with `endpoint`."""
    try:
        return Target.parse(endpoint.rstrip("/") + "/chat/completions")
    except ValueError as exc:
        raise ValueError(f"model_endpoint {endpoint!r}: {exc}") from None


def _no_constant(name: str) -> Any:
    """NaN and ±Infinity are no JSON (RFC 8259), though Python's parser takes them: sent on,
    a sampling parameter of NaN is the upstream's crash, a fault the policy would cause."""
    raise ValueError(f"{name} is not JSON; send a finite number")


def _api(path: str) -> LlmApi:
    """The dialect of a path (OpenAI's error shape, which Responses shares, for any other)."""
    return ANTHROPIC if path in MESSAGES_PATHS else RESPONSES if path in RESPONSES_PATHS else OPENAI


def _fail(api: LlmApi, status: int, message: str, code: str, param: str | None = None) -> Reply:
    if api == ANTHROPIC:
        return anthropic.anthropic_error(status, message)
    return openai_error(status, message, code, param)


class LlmSession:
    """One harness episode's model session (see the module docstring). Calls run one at a
    time: a harness's loop is sequential, and so the limits stay exact."""

    def __init__(
        self,
        proxy: SessionProxy,
        key: str,
        options: HarnessOptions,
        *,
        owner: str,
        max_calls: int,
        max_tokens: int,
        on_call: Callable[[LlmCall], None],
        replay: Replay | None = None,
    ) -> None:
        self.key = key
        self.owner = owner
        self.options = options
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.calls = 0
        self.malformed = 0  # requests refused after their body was read (parsing costs)
        self.completion_tokens = 0
        self.fault: str | None = None
        self.fault_status: int | None = None  # the HTTP status of the fault, if any
        self.limit: str | None = None
        self.diverged: str | None = None  # a resumed harness left its capture (replay.py)
        self.replay = replay
        self.stopped = asyncio.Event()
        self.closed = False
        self._proxy = proxy
        self._on_call = on_call
        self._target = _endpoint_target(options.model_endpoint)
        self.records = Records(proxy.settings)
        self._lock = asyncio.Lock()

    # ---- the paths a session serves -------------------------------------------------------
    async def handle(self, method: str, path: str, body: bytes) -> Reply:
        """Answer one request of the harness (`path` relative to the session's base)."""
        path = path.partition("?")[0]
        api = _api(path)
        if self.closed:
            return _fail(
                api, 409, "this model session is closed (its episode ended)", "session_closed"
            )
        if path in MODELS_PATHS and method == "GET":
            card = {"id": self.options.model, "object": "model", "owned_by": "palaestra"}
            return Reply.json(200, {"object": "list", "data": [card]})
        if path not in CHAT_PATHS | MESSAGES_PATHS | RESPONSES_PATHS | MODELS_PATHS:
            return _fail(
                api,
                404,
                f"no route {path[:200]!r} here: POST /v1/chat/completions, POST /v1/messages, "
                "POST /v1/responses, GET /v1/models",
                "not_found",
            )
        if method != "POST":
            return _fail(api, 405, f"{method} {path}: this path takes POST", "method_not_allowed")
        if self.replay is not None and self.replay.pending:
            return await self._replayed(api, body)
        started_at, t0 = time.time(), time.perf_counter()
        try:
            try:
                return await self._call(api, body, started_at, t0)
            except Refusal as exc:
                if exc.code not in ("limit_reached", "session_closed"):
                    self._record_refused(api, exc, body, started_at, t0)
                    self._count_malformed()
                return _fail(api, exc.status, str(exc), exc.code, exc.param)
        except _Fault as exc:
            self._set_fault(str(exc), exc.status)
            return _fail(api, 502, str(exc), "upstream_failed")

    async def _replayed(self, api: LlmApi, raw: bytes) -> Reply:
        """A resumed harness's call answered from its capture (server/harness/replay.py),
        counted as it was the first time and not recorded again; a request that is not the
        captured one stops the session (`diverged`: the episode is void, resume_failed)."""
        replay = self.replay
        assert replay is not None
        async with self._lock:
            if not replay.pending or self.diverged is not None:
                return _fail(api, 409, f"the resume diverged: {self.diverged}", "resume_diverged")
            why = replay.diverges(api, raw)
            if why is not None:
                index = replay.pending[0].index
                self.diverged = f"model call {index} of the capture's {replay.total}: {why}"
                log.warning("model session %s: resume diverged at %s", self.key, self.diverged)
                self.stopped.set()
                return _fail(api, 409, f"the resume diverged: {self.diverged}", "resume_diverged")
            call, reply = replay.answer()
            if call.error is None:
                self.calls += 1
                self.completion_tokens += len(call.completion_token_ids)
            elif "(refused by the proxy:" in call.error:
                self.malformed += 1
            else:
                self.calls += 1
            self._proxy.charge(self.owner, self.records.replayed(call))
            return reply

    def _record_refused(
        self, api: LlmApi, exc: Refusal, raw: bytes, started_at: float, t0: float
    ) -> None:
        """A request the proxy refused after reading it, as a refused call: nothing the
        harness sends is dropped unsaid, and its record is bounded as the module says."""
        request = exc.request
        error = f"HTTP {exc.status}: {exc} (refused by the proxy: {exc.code})"
        stream = request is not None and request.get("stream") is True
        made = self.records.call(api, request, raw, None, None, None, stream=stream,
                                 started_at=started_at, upstream_s=0.0, t0=t0,
                                 error=error[:UPSTREAM_ERROR_CHARS])  # fmt: skip
        self._record(*made)

    def _set_fault(self, reason: str, status: int | None = None) -> None:
        if self.fault is None:
            self.fault, self.fault_status = reason, status
            log.warning("model session %s: %s", self.key, reason)
        self.stopped.set()

    def _count_malformed(self) -> None:
        """A refused request cost its parse but no call: bounded by max_calls as well, or a
        policy could keep the event loop busy with bad 8 MiB bodies at no cost to it."""
        self.malformed += 1
        if self.malformed >= self.max_calls:
            self._set_limit(f"max_calls: {self.malformed} malformed requests (as many as calls)")

    def _set_limit(self, reason: str) -> None:
        if self.limit is None:
            self.limit = reason
        self.stopped.set()

    def _parse(self, api: LlmApi, raw: bytes) -> tuple[dict[str, Any], int]:
        """The request body and the bytes of its JSON as the record stores it."""
        cap = self._proxy.settings.llm_max_request_kb
        if len(raw) > cap * 1024:
            raise Refusal(
                413, f"the request body is over {cap} KiB (llm_max_request_kb)", "too_large"
            )
        try:
            body = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise Refusal(400, f"the request body is not JSON: {exc}", "invalid_json") from None
        if not isinstance(body, dict):
            raise Refusal(400, "the request body must be a JSON object", "invalid_json")
        nested: Any = body
        for _ in range(RECORD_DEPTH):
            nested = [nested]
        try:
            size = len(to_json(nested)) - 2 * RECORD_DEPTH
        except ValueError as exc:
            raise Refusal(
                400,
                f"the request body cannot be recorded ({exc}); send valid Unicode text (no "
                "lone \\ud800-\\udfff escape) nested at most 200 levels deep",
                "invalid_json",
            ) from None
        return body, size

    def _check_open(self, size: int) -> None:
        """Refusal (or the session's fault) unless a call of a `size`-byte request may go
        on; a limit it reaches stops the session."""
        if self.closed:
            raise Refusal(409, "this model session is closed (its episode ended)", "session_closed")
        if self.fault is not None:
            raise _Fault(self.fault)
        if self.calls >= self.max_calls:
            self._set_limit(f"max_calls: the episode's {self.max_calls} model calls are used")
        elif self.completion_tokens >= self.max_tokens:
            self._set_limit(
                f"max_tokens: the episode's {self.max_tokens} completion tokens are used"
            )
        elif (over := self.records.over(size, self._proxy.recorded(self.owner))) is not None:
            self._set_limit(over)
        else:
            return
        raise Refusal(400, f"limit reached: {self.limit}", "limit_reached")

    def _upstream_body(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The harness's request with the reset's sampling over it, the model named, no
        stream, token ids asked for, and a max_tokens asked for cut to what the episode has
        left. One not asked for stays unset: the proxy does not know the model's context,
        and a max_tokens past it is an upstream 400 the agent did not cause; such a call
        may go over the episode's budget, and the next is refused. Only HARNESS_FIELDS of
        the harness are sent, as `check_fields` bounds them."""
        asked_for = {k: v for k, v in chat.items() if k in HARNESS_FIELDS}
        check_fields(asked_for)
        body = {**asked_for, **self.options.sampling, "model": self.options.model, "stream": False}
        body.pop("stream_options", None)
        if body.get("n", 1) not in (1, None):
            raise Refusal(400, "n must be 1: the proxy records one choice a call", "n", "n")
        body["return_token_ids"] = True
        body["logprobs"] = True
        left = self.max_tokens - self.completion_tokens
        asked = [body.pop(k) for k in ("max_completion_tokens", "max_tokens") if k in body]
        sizes = [a for a in asked if isinstance(a, int) and not isinstance(a, bool) and a > 0]
        if sizes:
            body["max_tokens"] = min([left, *sizes])
        return body

    async def _call(self, api: LlmApi, raw: bytes, started_at: float, t0: float) -> Reply:
        if self.limit is not None:  # stopped: refused unread
            raise Refusal(400, f"limit reached: {self.limit}", "limit_reached")
        request, size = self._parse(api, raw)
        try:
            return await self._forward(api, request, size, started_at, t0)
        except Refusal as exc:
            exc.request = request
            raise

    async def _forward(
        self, api: LlmApi, request: dict[str, Any], size: int, started_at: float, t0: float
    ) -> Reply:
        stream = request.get("stream") is True
        try:
            chat = to_chat(api, request)
        except anthropic.MessagesError as exc:
            raise Refusal(400, str(exc), "invalid_request") from None
        except responses.ResponsesError as exc:
            raise Refusal(400, str(exc), "invalid_request", exc.param) from None
        except (TypeError, ValueError, AttributeError, LookupError) as exc:  # a shape missed
            log.warning("model session %s: a %s body not translated: %r", self.key, api, exc)
            raise Refusal(
                400, f"the {api} request is malformed ({type(exc).__name__})", "invalid_request"
            ) from None
        async with self._lock:
            self._check_open(size)
            body = self._upstream_body(chat)
            self.calls += 1
            t1 = time.perf_counter()
            status, reply, raw_reply, headers = await self._proxy.post(
                self._target, body, self.options.model_endpoint
            )
            upstream_s = time.perf_counter() - t1
            if status == 429:  # the upstream's load, not the agent's: retried, not counted
                self.calls -= 1
                return self._passthrough(api, status, reply, raw_reply, headers)
            if status >= 400:
                refused = upstream_error(status, reply, raw_reply)
                made = self.records.call(api, request, None, reply, raw_reply, None,
                                         stream=stream, started_at=started_at,
                                         upstream_s=upstream_s, t0=t0, error=refused)  # fmt: skip
                self._record(*made)
                return self._passthrough(api, status, reply, raw_reply, headers)
            assert reply is not None
            if (wrong := completion_error(reply)) is not None:
                raise _Fault(f"model endpoint {self.options.model_endpoint} answered {wrong}")
            tokens = reply_tokens(reply)
            if tokens is None:
                raise _Fault(
                    f"model endpoint {self.options.model_endpoint} returned no token ids; {NO_IDS}"
                )
            self.completion_tokens += len(tokens[1])
            answer = self._shaped(api, request, reply)
            made = self.records.call(api, request, size, answer, None,
                                     (reply, tokens), stream=stream,
                                     started_at=started_at, upstream_s=upstream_s,
                                     t0=t0)  # fmt: skip
            self._record(*made)
        return answer_reply(api, answer, stream)

    def _shaped(
        self, api: LlmApi, request: dict[str, Any], reply: dict[str, Any]
    ) -> dict[str, Any]:
        """What the harness gets: the upstream's reply without the ids and logprobs it did
        not ask for (they are in the record), or its Anthropic translation."""
        model = str(request.get("model") or self.options.model)
        if api == ANTHROPIC:
            return anthropic.from_openai(reply, model)
        if api == RESPONSES:
            return responses.from_chat(reply, request, model)
        choice = dict(reply["choices"][0])
        answer = {**reply, "choices": [choice, *reply["choices"][1:]]}
        if not request.get("logprobs"):
            choice["logprobs"] = None
        if not request.get("return_token_ids"):
            answer.pop("prompt_token_ids", None)
            choice.pop("token_ids", None)
        return answer

    def _passthrough(
        self,
        api: LlmApi,
        status: int,
        reply: dict[str, Any] | None,
        raw: bytes,
        headers: tuple[tuple[str, str], ...],
    ) -> Reply:
        """An upstream 4xx as the harness's dialect says it: OpenAI's unchanged; Responses
        in OpenAI's shape with a string code (vLLM's is a number), as the spec has it."""
        if api == OPENAI:
            return Reply(status, raw, "application/json", headers)
        error = (reply or {}).get("error")
        message = error.get("message") if isinstance(error, dict) else None
        text = str(message or raw[:500].decode(errors="replace"))
        if api == RESPONSES:
            answer = openai_error(status, text, "upstream_error")
            return Reply(answer.status, answer.body, answer.content_type, headers)
        return anthropic.anthropic_error(status, text)

    def _record(self, call: LlmCall, size: int) -> None:
        """Hand a record (`Records.call`'s) to the episode; its bytes count for its token."""
        if not self.closed:  # a closed session's bytes were given back by `close`
            self._proxy.charge(self.owner, size)
        try:
            self._on_call(call)
        except Exception as exc:  # the store's fault, never the agent's
            log.exception("recording model call %d of %s", call.index, self.key)
            raise _Fault(f"recording the model call failed: {type(exc).__name__}: {exc}") from exc


class SessionProxy:
    """This server's model sessions by episode key, and the one connection pool they
    share. `gateway` serves a sandbox's listener for its session (server/harness/gateway.py)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._sessions: dict[str, LlmSession] = {}
        self._recorded: dict[str, int] = {}  # by owner: bytes its open sessions recorded
        self._pool = UpstreamPool(connect_timeout_s=min(settings.llm_call_timeout_s, 30.0))
        self.gateway: SocketService = ModelGateway(self.get, settings)

    def open(
        self,
        key: str,
        options: HarnessOptions,
        *,
        owner: str,
        max_calls: int,
        max_tokens: int,
        on_call: Callable[[LlmCall], None],
        replay: Replay | None = None,
    ) -> LlmSession:
        """A session for episode `key` (answering `replay`'s calls first: a resumed harness);
        ValueError for a bad endpoint or an open key."""
        if key in self._sessions:
            raise ValueError(f"episode {key!r} already has a model session")
        session = LlmSession(
            self,
            key,
            options,
            owner=owner,
            max_calls=max_calls,
            max_tokens=max_tokens,
            on_call=on_call,
            replay=replay,
        )
        self._sessions[key] = session
        return session

    def get(self, key: str) -> LlmSession | None:
        return self._sessions.get(key)

    def recorded(self, owner: str) -> int:
        """Bytes the open sessions of token `owner` have recorded (token_max_llm_recorded_mb)."""
        return self._recorded.get(owner, 0)

    def charge(self, owner: str, size: int) -> None:
        """`size` bytes more recorded by a session of `owner` (negative: it closed)."""
        left = self._recorded.pop(owner, 0) + size
        if left > 0:
            self._recorded[owner] = left

    async def close(self, key: str) -> None:
        """End session `key`: its later calls are refused (409), and what it recorded no
        longer counts toward its token's live bytes. Idempotent."""
        session = self._sessions.pop(key, None)
        if session is not None:
            session.closed = True
            self.charge(session.owner, -session.records.held)

    async def aclose(self) -> None:
        for key in list(self._sessions):
            await self.close(key)
        await self._pool.aclose()

    async def post(
        self, target: Target, body: dict[str, Any], endpoint: str
    ) -> tuple[int, dict[str, Any] | None, bytes, tuple[tuple[str, str], ...]]:
        """POST `body` to `target`: (status, the JSON reply or None, its bytes, headers
        worth passing on); _Fault when the upstream cannot be reached, times out, fails
        (5xx), redirects, or answers 2xx with anything but a chat completion."""
        s = self.settings
        where = f"model endpoint {endpoint}"
        try:
            async with asyncio.timeout(s.llm_call_timeout_s):
                answer = await self._pool.post(
                    target, json.dumps(body).encode(), s.llm_max_response_kb * 1024
                )
        except TimeoutError:
            raise _Fault(
                f"{where} did not answer within {s.llm_call_timeout_s:g} s (llm_call_timeout_s)"
            ) from None
        except TooLarge:
            raise _Fault(
                f"{where} answered more than {s.llm_max_response_kb} KiB (llm_max_response_kb)"
            ) from None
        except (OSError, h11.ProtocolError) as exc:
            raise _Fault(f"{where} cannot be reached: {type(exc).__name__}: {exc}") from None
        raw, status, got = answer.body, answer.status, answer.headers
        if 300 <= status < 400:
            to = got.get("location", "")
            raise _Fault(
                f"{where} answered a redirect ({status} to {to[:200]!r}); none is followed"
            )
        if status >= 500 or status < 200:
            text = raw[:300].decode(errors="replace")
            raise _Fault(f"{where} failed: HTTP {status}: {text}", status)
        reply: dict[str, Any] | None = None
        with contextlib.suppress(ValueError, RecursionError):
            parsed = json.loads(raw)
            reply = parsed if isinstance(parsed, dict) else None
        try:  # recorded as parsed: JSON no record can store (a lone \ud800) is no answer
            to_json(reply)
        except ValueError as exc:
            raise _Fault(f"{where} answered JSON that cannot be recorded: {exc}") from None
        headers = tuple((k, got[k]) for k in ("retry-after",) if k in got)
        if status >= 400:
            return status, reply, raw, headers
        choices = reply.get("choices") if reply else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _Fault(f"{where} answered {status} with something that is no chat completion")
        return status, reply, raw, headers
