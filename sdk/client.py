"""The client interface, written once: the async protocols, and `Client`, their blocking form.

Code written against `Client` or `AsyncClient` runs unchanged against a remote server
(sdk/http.py) or an embedded one in the same process (server/inprocess.py).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

from palaestra.sdk.groups import GroupScorer, GroupVerifyResponse
from palaestra.sdk.models import (
    Action,
    BatchResetResult,
    BatchStepItem,
    BatchStepResult,
    CheckpointResponse,
    EpisodeState,
    FamilyInfo,
    ForkResponse,
    PackInfo,
    PackYankResponse,
    ResetRequest,
    ResetResponse,
    ResumeResponse,
    SamplerReleaseResponse,
    SamplerReport,
    StepResponse,
    TaskInfo,
    TaskList,
    Verdict,
)

ActionLike = Action | dict[str, Any]
StepItemLike = BatchStepItem | tuple[str, ActionLike]
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def as_action(action: ActionLike) -> Action:
    """Accept an `Action` or its dict form `{"tool": ..., "arguments": {...}}`."""
    return action if isinstance(action, Action) else Action.model_validate(action)


def step_item(item: StepItemLike) -> BatchStepItem:
    """Accept a `BatchStepItem` or `(episode_id, action)`."""
    if isinstance(item, BatchStepItem):
        return item
    episode_id, action = item
    return BatchStepItem(episode_id=episode_id, action=as_action(action))


PAGE = 1000  # tasks a page when `all_tasks` pages through a listing


@dataclass(frozen=True)
class TaskQuery:
    """The filters and page of `tasks()` (GET /v1/tasks)."""

    pack: str | None = None
    split: str | None = None
    family: str | None = None
    domain: str | None = None
    limit: int = 1000
    offset: int = 0

    def params(self) -> dict[str, Any]:
        """As query parameters: the filters that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class SamplerQuery:
    """The filters of `sampler()` (GET /v1/sampler)."""

    pack: str | None = None
    split: str | None = None
    domain: str | None = None
    limit: int = 1000

    def params(self) -> dict[str, Any]:
        """As query parameters: the filters that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@runtime_checkable
class AsyncClient(Protocol):
    """The client interface (async). An implementation subclasses it and provides the
    methods with no body here, `_reset` and `_tasks` included (the request, built)."""

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
        """Start an episode of `task` ("org/name[@ver]:task_id"), or of one the sampler draws."""
        request = ResetRequest(
            task=task,
            pack=pack,
            split=split,
            domain=domain,
            seed=seed,
            episode_id=episode_id,
            options=options or {},
        )
        return await self._reset(request)

    async def step(
        self, episode_id: str, action: ActionLike, *, request_id: str | None = None
    ) -> StepResponse: ...

    async def verify(self, episode_id: str) -> Verdict: ...

    async def state(self, episode_id: str) -> EpisodeState: ...

    async def close(self, episode_id: str) -> None: ...

    async def families(self) -> list[FamilyInfo]: ...

    async def packs(self) -> list[PackInfo]: ...

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
        """Tasks (public fields only), filtered, one page."""
        query = TaskQuery(pack, split, family, domain, limit, offset)
        return await self._tasks(query)

    async def all_tasks(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        family: str | None = None,
        domain: str | None = None,
    ) -> list[TaskInfo]:
        """Every task the filters select, a page at a time (a server caps its pages)."""
        out: list[TaskInfo] = []
        while True:
            query = TaskQuery(pack, split, family, domain, PAGE, len(out))
            page = await self._tasks(query)
            out.extend(page.tasks)
            if not page.tasks or len(out) >= page.total:
                return out

    async def _reset(self, request: ResetRequest) -> ResetResponse: ...

    async def _tasks(self, query: TaskQuery) -> TaskList: ...


@runtime_checkable
class AsyncBatchClient(AsyncClient, Protocol):
    """An `AsyncClient` with the batch routes: many episodes' resets or steps in one call.

    Results come back in item order, one `result` or one `error` each; a failed item
    (429, 404, 409, 422…) never fails the others."""

    async def batch_reset(self, requests: Sequence[ResetRequest]) -> list[BatchResetResult]: ...

    async def batch_step(
        self, items: Sequence[StepItemLike], *, wait_s: float | None = None
    ) -> list[BatchStepResult]: ...


@runtime_checkable
class AsyncServerClient(AsyncBatchClient, Protocol):
    """Everything the HTTP and in-process clients serve: the batch routes and the sampler."""

    async def sampler(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
    ) -> SamplerReport:
        """The sampler's weights, probabilities, success rates and quarantine."""
        return await self._sampler(SamplerQuery(pack, split, domain, limit))

    async def release_task(self, task: str) -> SamplerReleaseResponse:
        """Let the sampler draw a quarantined task again (admin)."""
        ...

    async def fork(self, episode_id: str, *, fork_id: str | None = None) -> ForkResponse:
        """A new live episode of this token: a copy of `episode_id`'s sandbox, family state
        and trajectory so far, which goes on unchanged (`fork_id` names the fork: a retry
        with it answers 409 `episode_exists`, never a second fork)."""
        ...

    async def regrade(self, episode_id: str, pack: str) -> Verdict:
        """A new verdict for the ended episode `episode_id`: its kept final state verified
        by `pack`'s (`org/name@version`) version of its task; its own verdict is unchanged."""
        ...

    async def checkpoint(self, episode_id: str) -> CheckpointResponse:
        """Keep the live episode in the server's store (workspace, family state, steps so
        far), to `resume` it after a server restart; the episode goes on."""
        ...

    async def resume(self, episode_id: str) -> ResumeResponse:
        """A `resumable` episode (its server stopped after a checkpoint) live again at its
        checkpoint, same id; steps after the checkpoint are lost (`lost_steps`)."""
        ...

    async def yank(self, ref: str, *, undo: bool = False) -> PackYankResponse:
        """Yank `org/name@version` (its publisher or an admin; `undo`: restore it): `org/name`
        and sampling skip it, exact pins still reach it."""
        ...

    async def verify_group(
        self, episode_ids: Sequence[str], scorer: GroupScorer
    ) -> GroupVerifyResponse:
        """Rewards for a group of ended episodes of one task, judged together by `scorer`
        ("tournament" or "ranking"); the same group again answers its stored result."""
        ...

    async def _sampler(self, query: SamplerQuery) -> SamplerReport: ...


def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, P], R]:
    """The blocking form of an async client method: `Client` calls it on its `_async`
    client and runs the coroutine to its end with `_run`."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        coro: Coroutine[Any, Any, R] = getattr(self._async, name)(*args, **kwargs)
        return self._run(coro)

    return call


class Client(ABC):
    """The client interface, blocking: every `AsyncServerClient` method, run to its end.

    A subclass sets `_async`, the client it wraps, and says how a coroutine runs (`_run`)."""

    _async: AsyncServerClient

    @abstractmethod
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to its end and return its result (or raise its error)."""

    reset = blocking(AsyncServerClient.reset)
    step = blocking(AsyncServerClient.step)
    verify = blocking(AsyncServerClient.verify)
    state = blocking(AsyncServerClient.state)
    close = blocking(AsyncServerClient.close)
    families = blocking(AsyncServerClient.families)
    packs = blocking(AsyncServerClient.packs)
    tasks = blocking(AsyncServerClient.tasks)
    all_tasks = blocking(AsyncServerClient.all_tasks)
    batch_reset = blocking(AsyncServerClient.batch_reset)
    batch_step = blocking(AsyncServerClient.batch_step)
    sampler = blocking(AsyncServerClient.sampler)
    release_task = blocking(AsyncServerClient.release_task)
    fork = blocking(AsyncServerClient.fork)
    checkpoint = blocking(AsyncServerClient.checkpoint)
    resume = blocking(AsyncServerClient.resume)
    regrade = blocking(AsyncServerClient.regrade)
    yank = blocking(AsyncServerClient.yank)
    verify_group = blocking(AsyncServerClient.verify_group)
