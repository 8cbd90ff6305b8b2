"""In-process clients: the client interface over an embedded manager, no HTTP.

`AsyncInProcessClient` runs on the caller's event loop. `InProcessClient` is the
synchronous one: it owns an embedded server on a private event-loop thread, for
scripts, notebooks and tests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any, TypeVar

from pydantic import ValidationError

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
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.groups import GroupScorer, GroupVerifyRequest, GroupVerifyResponse
from palaestra.sdk.models import (
    Action,
    BatchResetRequest,
    BatchResetResult,
    BatchStepItem,
    BatchStepRequest,
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
from palaestra.server import batch
from palaestra.server.auth import ADMIN_PRINCIPAL
from palaestra.server.config import Settings, load_settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager

T = TypeVar("T")


def _action(action: ActionLike) -> Action:
    try:
        return as_action(action)
    except ValidationError as exc:
        raise InvalidActionError(f"malformed action: {exc.errors()[0]['msg']}") from None


def _episode_id(item: StepItemLike) -> str:
    return item.episode_id if isinstance(item, BatchStepItem) else str(item[0]) or "-"


class AsyncInProcessClient(AsyncServerClient):
    """The `AsyncClient` interface straight onto an `EpisodeManager`."""

    def __init__(self, manager: EpisodeManager) -> None:
        self.manager = manager

    async def _reset(self, request: ResetRequest) -> ResetResponse:
        return await self.manager.reset(request)

    async def step(
        self, episode_id: str, action: ActionLike, *, request_id: str | None = None
    ) -> StepResponse:
        request = StepRequest(action=_action(action), request_id=request_id)
        return await self.manager.step(episode_id, request)

    async def batch_reset(self, requests: Sequence[ResetRequest]) -> list[BatchResetResult]:
        """Many resets at once; per-item results and errors, as the HTTP route answers."""
        request = BatchResetRequest(items=list(requests))
        return (await batch.batch_reset(self.manager, request, ADMIN_PRINCIPAL)).items

    async def batch_step(
        self, items: Sequence[StepItemLike], *, wait_s: float | None = None
    ) -> list[BatchStepResult]:
        """Many steps at once (`(episode_id, action)` or `BatchStepItem`), in order; with
        `wait_s`, items still running then answer `still_running` (resend them)."""
        parsed: list[BatchStepItem] = []
        problems: list[str | None] = []
        for item in items:
            try:
                parsed.append(step_item(item))
                problems.append(None)
            except ValidationError as exc:
                parsed.append(BatchStepItem(episode_id=_episode_id(item), action=Action(tool="-")))
                problems.append(f"malformed action: {exc.errors()[0]['msg']}")
        request = BatchStepRequest(items=parsed, wait_s=wait_s)
        return (await batch.batch_step(self.manager, request, ADMIN_PRINCIPAL, problems)).items

    async def verify(self, episode_id: str) -> Verdict:
        return await self.manager.verify(episode_id)

    async def state(self, episode_id: str) -> EpisodeState:
        return await self.manager.state(episode_id)

    async def close(self, episode_id: str) -> None:
        await self.manager.close(episode_id)

    async def fork(self, episode_id: str, *, fork_id: str | None = None) -> ForkResponse:
        return await self.manager.fork(episode_id, ForkRequest(episode_id=fork_id))

    async def regrade(self, episode_id: str, pack: str) -> Verdict:
        return await self.manager.regrade(episode_id, RegradeRequest(pack=pack))

    async def checkpoint(self, episode_id: str) -> CheckpointResponse:
        return await self.manager.checkpoint(episode_id)

    async def resume(self, episode_id: str) -> ResumeResponse:
        return await self.manager.resume(episode_id)

    async def families(self) -> list[FamilyInfo]:
        return self.manager.catalog.family_infos()

    async def packs(self) -> list[PackInfo]:
        return self.manager.catalog.pack_infos()

    async def _tasks(self, query: TaskQuery) -> TaskList:
        return self.manager.catalog.task_list(query)

    async def _sampler(self, query: SamplerQuery) -> SamplerReport:
        return self.manager.catalog.sampler_report(**asdict(query))

    async def release_task(self, task: str) -> SamplerReleaseResponse:
        return self.manager.catalog.sampler_release(task)

    async def yank(self, ref: str, *, undo: bool = False) -> PackYankResponse:
        return await self.manager.catalog.yank_pack(ref, undo=undo)

    async def verify_group(
        self, episode_ids: Sequence[str], scorer: GroupScorer
    ) -> GroupVerifyResponse:
        request = GroupVerifyRequest(episode_ids=list(episode_ids), scorer=scorer)
        return await self.manager.groups.verify(request)


class InProcessClient(Client):
    """The synchronous `Client` interface over an embedded server on its own loop thread.

    Use as a context manager: `with InProcessClient(settings) as client: ...`.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="palaestra-embedded", daemon=True
        )
        self._thread.start()
        self.manager = self._run(self._start(settings or load_settings()))
        self._async = AsyncInProcessClient(self.manager)
        self._closed = False

    @staticmethod
    async def _start(settings: Settings) -> EpisodeManager:
        manager = await asyncio.to_thread(build_manager, settings)
        await manager.start()
        return manager

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def shutdown(self) -> None:
        """Void live episodes, free their sandboxes, flush the store, stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        self._run(self.manager.shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> InProcessClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
