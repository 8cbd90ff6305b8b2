"""HTTP clients (httpx) for the wire API: typed exceptions, retries of what is retryable.

A step without a `request_id` gets one here, so that retrying it after a lost
response can never step the episode twice (the server replays the stored result).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from palaestra.sdk.client import ActionLike, StepItemLike, as_action, reset_request, step_item
from palaestra.sdk.errors import PalaestraError, TransportError, error_from_response
from palaestra.sdk.models import (
    BatchResetRequest,
    BatchResetResponse,
    BatchResetResult,
    BatchStepRequest,
    BatchStepResponse,
    BatchStepResult,
    EpisodeState,
    FamilyInfo,
    PackInfo,
    ResetRequest,
    ResetResponse,
    SamplerReleaseResponse,
    SamplerReport,
    StepRequest,
    StepResponse,
    TaskList,
    Verdict,
)

M = TypeVar("M", bound=BaseModel)
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


def _task_params(
    pack: str | None,
    split: str | None,
    family: str | None,
    domain: str | None,
    limit: int,
    offset: int,
) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    for key, value in (("pack", pack), ("split", split), ("family", family), ("domain", domain)):
        if value is not None:
            params[key] = value
    return params


def _sampler_params(
    pack: str | None, split: str | None, domain: str | None, limit: int
) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit}
    for key, value in (("pack", pack), ("split", split), ("domain", domain)):
        if value is not None:
            params[key] = value
    return params


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


class HTTPClient:
    """Synchronous client: `HTTPClient("http://127.0.0.1:8000")`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        http: httpx.Client | None = None,
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = http or httpx.Client(
            base_url=base_url, timeout=timeout, headers=_headers(token), limits=limits
        )
        self._retry = retry or RetryPolicy()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self._retry.attempts):
            try:
                response = self._http.request(method, path, **kwargs)
                _raise_for(response)
                return response
            except httpx.TransportError as exc:
                error: PalaestraError = TransportError(f"{method} {path}: {exc!r}")
            except PalaestraError as exc:
                error = exc
            if not error.retryable or attempt + 1 >= self._retry.attempts:
                raise error
            time.sleep(self._retry.delay(attempt, error))
        raise AssertionError("unreachable")

    def _get(self, path: str, model: type[M], params: Mapping[str, Any] | None = None) -> M:
        return model.model_validate_json(self._request("GET", path, params=params).content)

    def reset(
        self,
        task: str | None = None,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> ResetResponse:
        body = reset_request(
            task,
            pack=pack,
            split=split,
            domain=domain,
            seed=seed,
            episode_id=episode_id,
            options=options,
        )
        response = self._request("POST", "/v1/episodes", json=body.model_dump(mode="json"))
        return ResetResponse.model_validate_json(response.content)

    def step(
        self, episode_id: str, action: ActionLike, *, request_id: str | None = None
    ) -> StepResponse:
        path = f"/v1/episodes/{episode_id}/step"
        response = self._request("POST", path, json=_step_body(action, request_id))
        return StepResponse.model_validate_json(response.content)

    def batch_reset(self, requests: Sequence[ResetRequest]) -> list[BatchResetResult]:
        """Many resets in one call; per-item results and errors, in order."""
        body = _batch_reset_body(requests)
        response = self._request("POST", "/v1/batch/reset", content=body, headers=_JSON)
        return BatchResetResponse.model_validate_json(response.content).items

    def batch_step(
        self, items: Sequence[StepItemLike], *, wait_s: float | None = None
    ) -> list[BatchStepResult]:
        """Many steps in one call (`(episode_id, action)` or `BatchStepItem`), in order.
        With `wait_s`, items still running then answer `still_running` (resend them)."""
        body = _batch_step_body(items, wait_s)
        response = self._request("POST", "/v1/batch/step", content=body, headers=_JSON)
        return BatchStepResponse.model_validate_json(response.content).items

    def verify(self, episode_id: str) -> Verdict:
        response = self._request("POST", f"/v1/episodes/{episode_id}/verify")
        return Verdict.model_validate_json(response.content)

    def state(self, episode_id: str) -> EpisodeState:
        return self._get(f"/v1/episodes/{episode_id}", EpisodeState)

    def close(self, episode_id: str) -> None:
        self._request("DELETE", f"/v1/episodes/{episode_id}")

    def families(self) -> list[FamilyInfo]:
        return _FAMILIES.validate_json(self._request("GET", "/v1/families").content)

    def packs(self) -> list[PackInfo]:
        return _PACKS.validate_json(self._request("GET", "/v1/packs").content)

    def tasks(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        family: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> TaskList:
        params = _task_params(pack, split, family, domain, limit, offset)
        return self._get("/v1/tasks", TaskList, params)

    def sampler(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
    ) -> SamplerReport:
        """The sampler's weights, probabilities, success rates and quarantine."""
        params = _sampler_params(pack, split, domain, limit)
        return self._get("/v1/sampler", SamplerReport, params)

    def release_task(self, task: str) -> SamplerReleaseResponse:
        """Let the sampler draw a quarantined task again (admin)."""
        response = self._request("POST", "/v1/sampler/release", json={"task": task})
        return SamplerReleaseResponse.model_validate_json(response.content)

    def close_connection(self) -> None:
        self._http.close()

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()


class AsyncHTTPClient:
    """Asynchronous client; one connection pool shared by all concurrent calls."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = http or httpx.AsyncClient(
            base_url=base_url, timeout=timeout, headers=_headers(token), limits=limits
        )
        self._retry = retry or RetryPolicy()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self._retry.attempts):
            try:
                response = await self._http.request(method, path, **kwargs)
                _raise_for(response)
                return response
            except httpx.TransportError as exc:
                error: PalaestraError = TransportError(f"{method} {path}: {exc!r}")
            except PalaestraError as exc:
                error = exc
            if not error.retryable or attempt + 1 >= self._retry.attempts:
                raise error
            await asyncio.sleep(self._retry.delay(attempt, error))
        raise AssertionError("unreachable")

    async def reset(
        self,
        task: str | None = None,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> ResetResponse:
        body = reset_request(
            task,
            pack=pack,
            split=split,
            domain=domain,
            seed=seed,
            episode_id=episode_id,
            options=options,
        )
        response = await self._request("POST", "/v1/episodes", json=body.model_dump(mode="json"))
        return ResetResponse.model_validate_json(response.content)

    async def step(
        self, episode_id: str, action: ActionLike, *, request_id: str | None = None
    ) -> StepResponse:
        path = f"/v1/episodes/{episode_id}/step"
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
        response = await self._request("POST", f"/v1/episodes/{episode_id}/verify")
        return Verdict.model_validate_json(response.content)

    async def state(self, episode_id: str) -> EpisodeState:
        response = await self._request("GET", f"/v1/episodes/{episode_id}")
        return EpisodeState.model_validate_json(response.content)

    async def close(self, episode_id: str) -> None:
        await self._request("DELETE", f"/v1/episodes/{episode_id}")

    async def families(self) -> list[FamilyInfo]:
        return _FAMILIES.validate_json((await self._request("GET", "/v1/families")).content)

    async def packs(self) -> list[PackInfo]:
        return _PACKS.validate_json((await self._request("GET", "/v1/packs")).content)

    async def tasks(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        family: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> TaskList:
        params = _task_params(pack, split, family, domain, limit, offset)
        response = await self._request("GET", "/v1/tasks", params=params)
        return TaskList.model_validate_json(response.content)

    async def sampler(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
    ) -> SamplerReport:
        """The sampler's weights, probabilities, success rates and quarantine."""
        params = _sampler_params(pack, split, domain, limit)
        response = await self._request("GET", "/v1/sampler", params=params)
        return SamplerReport.model_validate_json(response.content)

    async def release_task(self, task: str) -> SamplerReleaseResponse:
        """Let the sampler draw a quarantined task again (admin)."""
        response = await self._request("POST", "/v1/sampler/release", json={"task": task})
        return SamplerReleaseResponse.model_validate_json(response.content)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHTTPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()
