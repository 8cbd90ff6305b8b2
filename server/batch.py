"""Batch routes: many episodes' resets or steps in one call (the trainer's hot path).

`POST /v1/batch/reset` and `POST /v1/batch/step` take a list of items and answer one
result or one error per item, in order, with status 200 as long as the envelope parses.
An item's error is what the single route would have answered (status, code, message,
retryable, Retry-After), so a client handles a 429 or a 404 per episode and the rest of
the batch goes on. A malformed item fails alone (422 for that item). Items of different
episodes run concurrently; items of one episode run in the order given (a step is never
reordered against another step of its episode).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import to_json

from palaestra.sdk.errors import InvalidActionError, PalaestraError, TooLargeError
from palaestra.sdk.models import (
    BATCH_MAX_ITEMS,
    BatchItemError,
    BatchResetRequest,
    BatchResetResponse,
    BatchResetResult,
    BatchStepItem,
    BatchStepRequest,
    BatchStepResponse,
    BatchStepResult,
    ResetRequest,
    StepResponse,
)
from palaestra.server.auth import Principal
from palaestra.server.manager import EpisodeManager

log = logging.getLogger("palaestra.server")

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Outcome = StepResponse | BatchItemError


def item_error(exc: BaseException) -> BatchItemError:
    """The per-item form of what the single route would answer for `exc`."""
    if isinstance(exc, PalaestraError):
        return BatchItemError(
            status=exc.status or 500,
            code=exc.code,
            message=exc.message,
            retryable=exc.retryable,
            retry_after=exc.retry_after,
        )
    log.error("unhandled error in a batch item", exc_info=exc)
    return BatchItemError(
        status=500, code="internal", message=f"internal error ({type(exc).__name__}); a bug"
    )


def _problem(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "item"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "malformed item: " + "; ".join(parts)


def parse_items(
    raw: bytes, envelope: type[M], item: type[BaseModel], limit: int = BATCH_MAX_ITEMS
) -> tuple[M, list[str | None]]:
    """The request, with one problem string per item that did not validate (None: fine).

    The whole body validates in one pass when it can (the common case); otherwise each
    item is checked alone so that one bad item cannot sink the others. A body that is not
    `{"items": [...]}` raises InvalidActionError (422 for the whole call)."""
    try:
        parsed = envelope.model_validate_json(raw)
        _check_count(len(parsed.items), limit)  # type: ignore[attr-defined]
        return parsed, [None] * len(parsed.items)  # type: ignore[attr-defined]
    except ValidationError as exc:
        # The strict parser's verdict on the JSON itself is final: `json.loads` would let
        # lone surrogates (which SQLite cannot encode) and unbounded nesting through.
        syntax = [e for e in exc.errors() if e.get("type") == "json_invalid"]
        if syntax:
            problem = syntax[0].get("msg", "invalid JSON")
            raise InvalidActionError(
                f"the body is not valid JSON: {problem}", code="invalid_request"
            ) from None
    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidActionError(f"the body is not JSON: {exc}", code="invalid_request") from None
    items = body.get("items") if isinstance(body, dict) else None
    if isinstance(items, list):
        _check_count(len(items), limit)
    if not isinstance(items, list) or not items:
        raise InvalidActionError(
            f'the body must be {{"items": [...]}} with 1 to {limit} items',
            code="invalid_request",
        )
    if set(body) - {"items"}:
        raise InvalidActionError(
            f"unknown fields {sorted(set(body) - {'items'})}; only `items` is allowed",
            code="invalid_request",
        )
    good: list[Any] = []
    problems: list[str | None] = []
    for value in items:
        try:
            good.append(item.model_validate(value))
            problems.append(None)
        except ValidationError as exc:
            # A placeholder keeps positions; it is never run (its problem is answered).
            good.append(None)
            problems.append(_problem(exc))
    return envelope.model_construct(items=good), problems


def _check_count(count: int, limit: int) -> None:
    if count > min(limit, BATCH_MAX_ITEMS):
        raise TooLargeError(
            f"a batch may hold at most {min(limit, BATCH_MAX_ITEMS)} items (max_batch_items),"
            f" this one has {count}; split it"
        )


async def _guard(call: Awaitable[T]) -> T | BatchItemError:
    try:
        return await call
    except Exception as exc:
        return item_error(exc)


async def batch_reset(
    manager: EpisodeManager,
    request: BatchResetRequest,
    principal: Principal,
    problems: list[str | None] | None = None,
) -> BatchResetResponse:
    """Reset every item concurrently; a refused item (429, 404, 403…) fails alone."""
    problems = problems or [None] * len(request.items)

    async def one(index: int, item: ResetRequest | None) -> BatchResetResult:
        problem = problems[index]
        if problem is not None or item is None:
            return BatchResetResult(error=item_error(InvalidActionError(problem or "no item")))
        outcome = await _guard(manager.reset(item, principal))
        if isinstance(outcome, BatchItemError):
            return BatchResetResult(error=outcome)
        return BatchResetResult(result=outcome)

    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(request.items)))
    return BatchResetResponse(items=list(results))


async def batch_step(
    manager: EpisodeManager,
    request: BatchStepRequest,
    principal: Principal,
    problems: list[str | None] | None = None,
) -> BatchStepResponse:
    """Step every item; episodes concurrently, one episode's items in their order."""
    outcomes = await step_outcomes(manager, request, principal, problems)
    return BatchStepResponse(
        items=[
            BatchStepResult(episode_id=episode_id, error=outcome)
            if isinstance(outcome, BatchItemError)
            else BatchStepResult(episode_id=episode_id, result=outcome)
            for episode_id, outcome in outcomes
        ]
    )


async def step_outcomes(
    manager: EpisodeManager,
    request: BatchStepRequest,
    principal: Principal,
    problems: list[str | None] | None = None,
    size: int = 0,
) -> list[tuple[str, Outcome]]:
    """(episode id, reply or error) per item, in order: what `batch_step` answers, before
    it is wrapped in models (the HTTP route serializes these directly). `size`: the request's
    bytes, what its detached items count against the token's pending bytes."""
    items: list[BatchStepItem | None] = list(request.items)
    try:
        # Detached steps of this token still running: bounded per token (server/tenancy.py).
        manager.may_detach(principal, size)
    except PalaestraError as exc:
        refused = item_error(exc)
        return [(_episode_of(item), refused) for item in items]
    results: list[Outcome | None] = [None] * len(items)
    ids: list[str] = []
    by_episode: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        problem = problems[index] if problems else None
        if problem is not None or item is None:
            results[index] = item_error(InvalidActionError(problem or "no item"))
            ids.append(_episode_of(item))
        else:
            ids.append(item.episode_id)
            by_episode.setdefault(item.episode_id, []).append(index)

    step = manager.host.step  # what `manager.step` calls, without its coroutine an item

    async def run(indices: list[int]) -> None:
        for index in indices:
            item = items[index]
            assert item is not None
            # A resent item (same request_id) whose step is still running waits for the
            # episode's lock and gets that step's stored reply: it never steps twice.
            try:
                results[index] = await step(principal, item.episode_id, item)
            except Exception as exc:
                results[index] = item_error(exc)

    started = {eager(run(indices)): len(indices) for indices in by_episode.values()}
    tasks = [task for task in started if task is not None]
    if tasks:
        finished_any = len(tasks) < len(started)
        done, late = await asyncio.wait(tasks, timeout=request.wait_s)
        if late and not done and not finished_any:
            # Nothing to hand back yet: wait for the first item rather than have the
            # caller poll (its resend would only join the same steps).
            done, late = await asyncio.wait(late, return_when=asyncio.FIRST_COMPLETED)
        for task in late:
            # Still running: it goes on (its reply is kept under the item's request_id,
            # and a resend joins it); the caller resends the item.
            held = size * started[task] // max(1, len(items))  # its items' share of the body
            manager.detach(task, principal.token_id, held)
    return [
        (episode_id, _still_running() if outcome is None else outcome)
        for episode_id, outcome in zip(ids, results, strict=True)
    ]


def eager(coro: Coroutine[Any, Any, None]) -> asyncio.Future[None] | None:
    """Run `coro` until it first waits; None if it finished, else a task that goes on.

    What Python 3.12's eager tasks do, for 3.11: a no-op step never waits (the episode
    lock is free, the store write is queued), and a task per item costs more CPU than
    the step itself."""
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_resume(coro, yielded))


async def _resume(coro: Coroutine[Any, Any, None], yielded: Any) -> None:
    """Drive a started coroutine as asyncio's Task would: wait for what it yielded, resume."""
    while True:
        try:
            if yielded is None:
                await asyncio.sleep(0)
            else:  # the future the coroutine awaits: resumed once it is done
                await asyncio.wait([yielded])
        except asyncio.CancelledError:
            try:
                yielded = coro.throw(asyncio.CancelledError())
            except StopIteration:
                return
            continue
        try:
            yielded = coro.send(None)
        except StopIteration:
            return


def _still_running() -> BatchItemError:
    return BatchItemError(
        status=503,
        code="still_running",
        message="the step is still running; resend the item with the same request_id",
        retryable=True,
        retry_after=0.0,
    )


def _episode_of(item: Any) -> str:
    return str(getattr(item, "episode_id", "") or "")


Handler = Callable[[EpisodeManager, bytes, Principal], Awaitable[bytes]]


async def reset_reply(manager: EpisodeManager, raw: bytes, principal: Principal) -> bytes:
    """The JSON body of `POST /v1/batch/reset` (InvalidActionError: the envelope is bad)."""
    limit = manager.settings.max_batch_items
    request, problems = parse_items(raw, BatchResetRequest, ResetRequest, limit)
    reply = await batch_reset(manager, request, principal, problems)
    return reply.model_dump_json().encode()


async def step_reply(manager: EpisodeManager, raw: bytes, principal: Principal) -> bytes:
    """The JSON body of `POST /v1/batch/step` (InvalidActionError: the envelope is bad)."""
    limit = manager.settings.max_batch_items
    request, problems = parse_items(raw, BatchStepRequest, BatchStepItem, limit)
    outcomes = await step_outcomes(manager, request, principal, problems, len(raw))
    # The JSON of a BatchStepResponse, written without building one (the trainer's hot path).
    return to_json(
        {
            "items": [
                {"episode_id": episode_id, "result": None, "error": outcome}
                if isinstance(outcome, BatchItemError)
                else {"episode_id": episode_id, "result": outcome, "error": None}
                for episode_id, outcome in outcomes
            ]
        }
    )


ROUTES: dict[str, Handler] = {"/v1/batch/reset": reset_reply, "/v1/batch/step": step_reply}
