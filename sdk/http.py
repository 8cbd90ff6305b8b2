"""HTTP clients (httpx) for the wire API: typed exceptions, retries of what is retryable.

A step without a `request_id` gets one here, so that retrying it after a lost
response can never step the episode twice (the server replays the stored result).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from palaestra.sdk.client import (
    ActionLike,
    AsyncServerClient,
    Client,
    SamplerQuery,
    StepItemLike,
    TaskQuery,
    as_action,
    step_item,
)
from palaestra.sdk.errors import PalaestraError, TransportError, error_from_response
from palaestra.sdk.groups import GroupScorer, GroupVerifyRequest, GroupVerifyResponse
from palaestra.sdk.models import (
    BatchResetRequest,
    BatchResetResponse,
    BatchResetResult,
    BatchStepRequest,
    BatchStepResponse,
    BatchStepResult,
    CheckpointResponse,
    EpisodeState,
    FamilyInfo,
    ForkRequest,
    ForkResponse,
    PackInfo,
    PackYankResponse,
    RegradeRequest,
    ResetRequest,
    ResetResponse,
    ResumeResponse,
    SamplerReleaseResponse,
    SamplerReport,
    StepRequest,
    StepResponse,
    TaskList,
    Verdict,
)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
_FAMILIES = TypeAdapter(list[FamilyInfo])
_PACKS = TypeAdapter(list[PackInfo])


class RetryPolicy:
    """Exponential backoff with jitter; honours `Retry-After` on 429/503."""

    def __init__(self, attempts: int = 4, base_s: float = 0.1, max_s: float = 5.0) -> None:
        self.attempts = attempts
        self.base_s = base_s
        self.max_s = max_s

    def delay(self, attempt: int, error: PalaestraError) -> float:
        if error.retry_after is not None:
            return min(error.retry_after, self.max_s)
        backoff: float = min(self.max_s, self.base_s * 2**attempt)
        return backoff * (0.5 + random.random() / 2)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    raise error_from_response(response.status_code, body, response.headers.get("retry-after"))


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _step_body(action: ActionLike, request_id: str | None) -> dict[str, Any]:
    request = StepRequest(action=as_action(action), request_id=request_id or uuid.uuid4().hex)
    return request.model_dump(mode="json")


def _batch_reset_body(requests: Sequence[ResetRequest]) -> bytes:
    """Every item gets a client-side episode id, so that a retried call cannot start an
    episode twice unseen: a replayed item answers 409 `episode_exists` instead."""
    items = [
        r if r.episode_id else r.model_copy(update={"episode_id": uuid.uuid4().hex})
        for r in requests
    ]
    return BatchResetRequest(items=items).model_dump_json().encode()


def _batch_step_body(items: Sequence[StepItemLike], wait_s: float | None) -> bytes:
    """Every item gets a `request_id`, so a retried call never steps an episode twice."""
    parsed = [step_item(i) for i in items]
    parsed = [
        i if i.request_id else i.model_copy(update={"request_id": uuid.uuid4().hex}) for i in parsed
    ]
    return BatchStepRequest(items=parsed, wait_s=wait_s).model_dump_json().encode()


_JSON = {"content-type": "application/json"}


def _segment(episode_id: str) -> str:
    """An episode id as one URL path segment: a `/`, `?`, `#` or `%` in it is escaped and
    `.`/`..` spelled out, so an id read from a run directory never reaches another route
    (httpx removes dot segments; a `?` would end the path)."""
    if episode_id in (".", ".."):
        return episode_id.replace(".", "%2E")
    return quote(episode_id, safe="")


class _Transport(Protocol):
    """Where the requests of an `AsyncHTTPClient` go, and how it waits between retries."""

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    async def sleep(self, seconds: float) -> None: ...

    async def aclose(self) -> None: ...


class _AsyncTransport:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.http.request(method, path, **kwargs)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def aclose(self) -> None:
        await self.http.aclose()


class _BlockingTransport:
    """An `httpx.Client` behind coroutines that never suspend: `HTTPClient` runs them to
    their end without an event loop, in any thread, inside a running loop or not."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, **kwargs)

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def aclose(self) -> None:
        self.http.close()


class HTTPOptions(TypedDict, total=False):
    """What both HTTP clients take beside the URL (and `http=`, an httpx client of one's own,
    which then brings its own token, timeout and pool)."""

    token: str | None  # the bearer token
    timeout: float  # seconds a request may take (default 120)
    retry: RetryPolicy | None  # default RetryPolicy()
    max_connections: int  # the pool (default: 64 for HTTPClient, 256 for AsyncHTTPClient)


def _pool(base_url: str, options: HTTPOptions, connections: int) -> dict[str, Any]:
    """The options of the httpx client a client makes for itself."""
    n = options.get("max_connections", connections)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    headers = _headers(options.get("token"))
    timeout = options.get("timeout", 120.0)
    return {"base_url": base_url, "timeout": timeout, "headers": headers, "limits": limits}


class AsyncHTTPClient(AsyncServerClient):
    """Asynchronous client; one connection pool shared by all concurrent calls.

    Over a synchronous `httpx.Client` (`http=`) its coroutines block and never suspend:
    that is how `HTTPClient` runs it."""

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.AsyncClient | httpx.Client | None = None,
        **options: Unpack[HTTPOptions],
    ) -> None:
        if isinstance(http, httpx.Client):
            self._transport: _Transport = _BlockingTransport(http)
        else:
            pool = _pool(base_url, options, 256)
            self._transport = _AsyncTransport(http or httpx.AsyncClient(**pool))
        self._retry = options.get("retry") or RetryPolicy()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self._retry.attempts):
            try:
                response = await self._transport.request(method, path, **kwargs)
                _raise_for(response)
                return response
            except httpx.TransportError as exc:
                error: PalaestraError = TransportError(f"{method} {path}: {exc!r}")
            except PalaestraError as exc:
                error = exc
            if not error.retryable or attempt + 1 >= self._retry.attempts:
                raise error
            await self._transport.sleep(self._retry.delay(attempt, error))
        raise AssertionError("unreachable")

    async def _get(self, path: str, model: type[M], params: Mapping[str, Any] | None = None) -> M:
        return model.model_validate_json((await self._request("GET", path, params=params)).content)

    async def _reset(self, request: ResetRequest) -> ResetResponse:
        body = request.model_dump(mode="json")
        response = await self._request("POST", "/v1/episodes", json=body)
        return ResetResponse.model_validate_json(response.content)

    async def step(
        self, episode_id: str, action: ActionLike, *, request_id: str | None = None
    ) -> StepResponse:
        path = f"/v1/episodes/{_segment(episode_id)}/step"
        response = await self._request("POST", path, json=_step_body(action, request_id))
        return StepResponse.model_validate_json(response.content)

    async def batch_reset(self, requests: Sequence[ResetRequest]) -> list[BatchResetResult]:
        """Many resets in one call; per-item results and errors, in order."""
        body = _batch_reset_body(requests)
        response = await self._request("POST", "/v1/batch/reset", content=body, headers=_JSON)
        return BatchResetResponse.model_validate_json(response.content).items

    async def batch_step(
        self, items: Sequence[StepItemLike], *, wait_s: float | None = None
    ) -> list[BatchStepResult]:
        """Many steps in one call (`(episode_id, action)` or `BatchStepItem`), in order.
        With `wait_s`, items still running then answer `still_running` (resend them)."""
        body = _batch_step_body(items, wait_s)
        response = await self._request("POST", "/v1/batch/step", content=body, headers=_JSON)
        return BatchStepResponse.model_validate_json(response.content).items

    async def verify(self, episode_id: str) -> Verdict:
        response = await self._request("POST", f"/v1/episodes/{_segment(episode_id)}/verify")
        return Verdict.model_validate_json(response.content)

    async def state(self, episode_id: str) -> EpisodeState:
        return await self._get(f"/v1/episodes/{_segment(episode_id)}", EpisodeState)

    async def close(self, episode_id: str) -> None:
        await self._request("DELETE", f"/v1/episodes/{_segment(episode_id)}")

    async def families(self) -> list[FamilyInfo]:
        return _FAMILIES.validate_json((await self._request("GET", "/v1/families")).content)

    async def packs(self) -> list[PackInfo]:
        return _PACKS.validate_json((await self._request("GET", "/v1/packs")).content)

    async def _tasks(self, query: TaskQuery) -> TaskList:
        return await self._get("/v1/tasks", TaskList, query.params())

    async def _sampler(self, query: SamplerQuery) -> SamplerReport:
        return await self._get("/v1/sampler", SamplerReport, query.params())

    async def fork(self, episode_id: str, *, fork_id: str | None = None) -> ForkResponse:
        body = ForkRequest(episode_id=fork_id).model_dump(mode="json")
        response = await self._request(
            "POST", f"/v1/episodes/{_segment(episode_id)}/fork", json=body
        )
        return ForkResponse.model_validate_json(response.content)

    async def regrade(self, episode_id: str, pack: str) -> Verdict:
        body = RegradeRequest(pack=pack).model_dump(mode="json")
        response = await self._request(
            "POST", f"/v1/episodes/{_segment(episode_id)}/regrade", json=body
        )
        return Verdict.model_validate_json(response.content)

    async def checkpoint(self, episode_id: str) -> CheckpointResponse:
        response = await self._request("POST", f"/v1/episodes/{_segment(episode_id)}/checkpoint")
        return CheckpointResponse.model_validate_json(response.content)

    async def resume(self, episode_id: str) -> ResumeResponse:
        response = await self._request("POST", f"/v1/episodes/{_segment(episode_id)}/resume")
        return ResumeResponse.model_validate_json(response.content)

    async def release_task(self, task: str) -> SamplerReleaseResponse:
        response = await self._request("POST", "/v1/sampler/release", json={"task": task})
        return SamplerReleaseResponse.model_validate_json(response.content)

    async def yank(self, ref: str, *, undo: bool = False) -> PackYankResponse:
        path = f"/v1/packs/{ref}/{'unyank' if undo else 'yank'}"
        return PackYankResponse.model_validate_json((await self._request("POST", path)).content)

    async def verify_group(
        self, episode_ids: Sequence[str], scorer: GroupScorer
    ) -> GroupVerifyResponse:
        body = GroupVerifyRequest(episode_ids=list(episode_ids), scorer=scorer)
        content = body.model_dump_json().encode()
        response = await self._request("POST", "/v1/groups/verify", content=content, headers=_JSON)
        return GroupVerifyResponse.model_validate_json(response.content)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncHTTPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class HTTPClient(Client):
    """Synchronous client: `HTTPClient("http://127.0.0.1:8000")`, an `AsyncHTTPClient` over
    a blocking `httpx.Client`, its coroutines run to their end in the calling thread."""

    def __init__(
        self, base_url: str, *, http: httpx.Client | None = None, **options: Unpack[HTTPOptions]
    ) -> None:
        http = http or httpx.Client(**_pool(base_url, options, 64))
        retry = options.get("retry")
        self._async: AsyncHTTPClient = AsyncHTTPClient(base_url, http=http, retry=retry)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            coro.send(None)
        except StopIteration as done:
            result: T = done.value
            return result
        coro.close()
        raise RuntimeError("a blocking HTTP call suspended")  # _BlockingTransport never does

    def close_connection(self) -> None:
        self._run(self._async.aclose())

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_connection()
