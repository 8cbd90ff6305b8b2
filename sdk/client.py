"""The client interface: one shape for HTTP (sync, async) and in-process use.

Code written against `Client` or `AsyncClient` runs unchanged against a remote
server, or an embedded one in the same process (the server's in-process clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from palaestra.sdk.models import (
    Action,
    BatchResetResult,
    BatchStepItem,
    BatchStepResult,
    EpisodeState,
    FamilyInfo,
    PackInfo,
    ResetRequest,
    ResetResponse,
    StepResponse,
    TaskList,
    Verdict,
)

ActionLike = Action | dict[str, Any]
StepItemLike = BatchStepItem | tuple[str, ActionLike]


def as_action(action: ActionLike) -> Action:
    """Accept an `Action` or its dict form `{"tool": ..., "arguments": {...}}`."""
    return action if isinstance(action, Action) else Action.model_validate(action)


def reset_request(
    task: str | None = None,
    *,
    pack: str | None = None,
    split: str | None = None,
    domain: str | None = None,
    seed: int | None = None,
    episode_id: str | None = None,
    options: dict[str, Any] | None = None,
) -> ResetRequest:
    return ResetRequest(
        task=task,
        pack=pack,
        split=split,
        domain=domain,
        seed=seed,
        episode_id=episode_id,
        options=options or {},
    )


@runtime_checkable
class Client(Protocol):
    """Synchronous client interface."""

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
    ) -> ResetResponse: ...

    def step(
        self, episode_id: str, action: ActionLike, *, request_id: str | None = None
    ) -> StepResponse: ...

    def verify(self, episode_id: str) -> Verdict: ...

    def state(self, episode_id: str) -> EpisodeState: ...

    def close(self, episode_id: str) -> None: ...

    def families(self) -> list[FamilyInfo]: ...

    def packs(self) -> list[PackInfo]: ...

    def tasks(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        family: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> TaskList: ...


@runtime_checkable
class AsyncClient(Protocol):
    """Asynchronous client interface: the same methods, awaited."""

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
    ) -> ResetResponse: ...

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
    ) -> TaskList: ...


def step_item(item: StepItemLike) -> BatchStepItem:
    """Accept a `BatchStepItem` or `(episode_id, action)`."""
    if isinstance(item, BatchStepItem):
        return item
    episode_id, action = item
    return BatchStepItem(episode_id=episode_id, action=as_action(action))


@runtime_checkable
class AsyncBatchClient(AsyncClient, Protocol):
    """An `AsyncClient` with the batch routes: many episodes' resets or steps in one call.

    Results come back in item order, one `result` or one `error` each; a failed item
    (429, 404, 409, 422…) never fails the others."""

    async def batch_reset(self, requests: Sequence[ResetRequest]) -> list[BatchResetResult]: ...

    async def batch_step(
        self, items: Sequence[StepItemLike], *, wait_s: float | None = None
    ) -> list[BatchStepResult]: ...
