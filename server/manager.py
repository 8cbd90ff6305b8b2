"""The one front: every route, door and in-process client starts and drives episodes here.

Whatever hosts the episodes (server/host.py: this process, or a cluster's workers), the
front does once: resolve or sample the task, the sealed-split and oracle checks, the
operator's ceilings and the episode's limits, the store key, the token's quota (admitted
before the host starts the episode, refunded when it fails), and the reply's annotations.
It also owns the background work its callers detach (batch steps answered
`still_running`, group judgings) and the reaper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from palaestra.sdk.errors import PermissionDeniedError
from palaestra.sdk.models import (
    CheckpointResponse,
    EpisodeState,
    ForkRequest,
    ForkResponse,
    RegradeRequest,
    ResetRequest,
    ResetResponse,
    ResumeResponse,
    StepRequest,
    StepResponse,
    Verdict,
)
from palaestra.sdk.task import Task
from palaestra.server.auth import ADMIN_PRINCIPAL, Principal
from palaestra.server.ceilings import check_task, client_limits
from palaestra.server.episode import task_info
from palaestra.server.groups import GroupVerifier
from palaestra.server.host import Ending, EpisodeHost, ForkOrder, Quota, StartOrder
from palaestra.server.regrade import Regrader
from palaestra.server.sampler import Sampler
from palaestra.server.services import Services
from palaestra.server.tenancy import Tenancy, episode_key

if TYPE_CHECKING:
    from palaestra.server.episode import Episode

log = logging.getLogger("palaestra.episodes")


class FrontAccounts:
    """The `Accounting` of a front's own counters: the token's CPU and live episodes, and
    the sampler's record of how each task's episodes end."""

    def __init__(self, tenancy: Tenancy, sampler: Sampler) -> None:
        self.tenancy = tenancy
        self.sampler = sampler

    def before_step(self, principal: Principal) -> None:
        self.tenancy.check_cpu(principal)  # 429 while over its CPU-seconds per hour

    def charged(self, owner: str, seconds: float) -> None:
        self.tenancy.charge(owner, seconds)

    def ended(self, ended: Ending) -> None:
        self.tenancy.ended(ended.owner)
        if ended.task:
            self.sampler.record(
                ended.task,
                ended.status,
                ended.reward,
                ended.passed,
                reason=ended.reason,
                at=ended.at,
            )


class EpisodeManager:
    """The front over one `EpisodeHost`; `quota` admits new episodes (server/tenancy.py's
    `LocalQuota`, or a cluster's ledger)."""

    def __init__(self, services: Services, host: EpisodeHost, quota: Quota) -> None:
        self.services = services
        self.settings = services.settings
        self.store = services.store
        self.families = services.families
        self.packs = services.packs
        self.registry = services.registry
        self.sampler = services.sampler
        self.catalog = services.catalog
        self.metrics = services.metrics
        self.judges = services.judges
        self.tenancy = services.tenancy
        self.host = host
        self.quota = quota
        self.groups = GroupVerifier(self)  # POST /v1/groups/verify (server/groups.py)
        self.regrader = Regrader(services, services.catalog.sandboxes)  # server/regrade.py
        self._reaper: asyncio.Task[None] | None = None
        self._detached: set[asyncio.Future[Any]] = set()
        self.metrics.bind_sampler(self.sampler.quarantined_count)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        history = await self.store.sampler_history(self.settings.sampler_history)
        self.sampler.replay(history)
        self.sampler.refresh()
        await self.quota.restore(await self.store.starts_since(time.time() - 3600.0))
        await self.host.open()
        self._reaper = asyncio.create_task(self._reap_forever(), name="palaestra-reaper")
        if self.packs.warmer is not None:  # packs not cached: generated in the background
            self.packs.warmer.start()
        if self.services.draws is not None:  # held-out draws: in step with the store
            self.services.draws.start()

    async def shutdown(self) -> None:
        if self.packs.warmer is not None:
            await self.packs.warmer.aclose()
        if self.services.draws is not None:
            await self.services.draws.aclose()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for work in list(self._detached):
            work.cancel()
        await asyncio.gather(*self._detached, return_exceptions=True)
        await self.host.aclose()
        await self.services.judges.aclose()  # the judge endpoints' pooled client
        await self.store.aclose()

    def detach(self, work: asyncio.Future[Any], owner: str | None = None, size: int = 0) -> None:
        """Let `work` run on after its caller stopped waiting (a batch step answered
        `still_running`): referenced until it is done, cancelled at shutdown, and counted
        (with the `size` request bytes it holds) against `owner`'s pending quota while it
        runs."""
        self._detached.add(work)
        work.add_done_callback(self._detached.discard)
        if owner is not None:
            self.tenancy.pending(owner, +1, size)
            work.add_done_callback(lambda _: self.tenancy.pending(owner, -1, -size))

    def may_detach(self, principal: Principal, size: int = 0) -> None:
        """429 while the token has its cap of detached steps running, or of the bytes they
        hold (before a batch or stream step of `size` request bytes that may be detached)."""
        self.tenancy.check_pending(principal, size)

    @property
    def ready(self) -> bool:
        return self._reaper is not None and not self._reaper.done() and self.host.ready

    @property
    def live_count(self) -> int:
        """Live episodes, and those being started."""
        return self.host.live_count

    async def render_metrics(self) -> bytes:
        """The Prometheus exposition (a cluster's host adds its workers')."""
        return await self.host.exposition(self.metrics.render())

    # -- episodes -------------------------------------------------------------------------
    async def reset(
        self, request: ResetRequest, principal: Principal = ADMIN_PRINCIPAL
    ) -> ResetResponse:
        probability: float | None = None
        if request.task:
            task = self.packs.resolve(request.task)
        else:
            task, probability = self.sampler.sample(
                request.seed, pack=request.pack, split=request.split, domain=request.domain
            )
        principal.require_episodes(task.sealed, task.split)
        wants_oracle = bool(request.options.get("oracle"))
        if wants_oracle and not self.settings.allow_oracle:
            raise PermissionDeniedError("this server does not allow oracle-driven episodes")
        if wants_oracle and task.sealed and not principal.is_admin:
            raise PermissionDeniedError(
                f"the oracle on sealed split {task.split!r} needs a token with the 'admin' scope",
                code="missing_scope",
            )
        family = self.families.get(task.family)
        check_task(task, self.settings)  # 422 over an operator ceiling (server/ceilings.py)
        limits = client_limits(request.options, self.settings)
        limits = family.episode_limits(task, request.options, limits)  # a family's own caps
        key = episode_key(principal.token_id, request.episode_id, uuid.uuid4().hex)
        order = StartOrder(
            task=task,
            request=request.model_copy(update={"task": task.ref}),
            principal=principal,
            key=key,
            limits=limits,
            oracle=wants_oracle,
        )
        ticket = await self.quota.admit(principal, key)  # 429 over the token's quota
        try:
            reply = await self.host.start(order)
        except BaseException:
            await self.quota.refund(principal, key, ticket)
            raise
        reply.info = {**task_info(task), **reply.info, **self._notes(task, probability)}
        return reply

    def _notes(self, task: Task, probability: float | None) -> dict[str, Any]:
        """What a reset's reply says of how its task was chosen."""
        notes: dict[str, Any] = {}
        if probability is not None:
            notes["sampled"] = {"probability": probability}
        elif (note := self.sampler.quarantine_note(task.ref)) is not None:
            notes["quarantined"] = f"run on request; the sampler holds it back: {note}"
        if self.packs.is_yanked(task.pack, task.version):  # an exact pin reached it
            notes["yanked"] = f"{task.pack}@{task.version} is yanked by its publisher"
        return notes

    async def step(
        self, episode_id: str, request: StepRequest, principal: Principal = ADMIN_PRINCIPAL
    ) -> StepResponse:
        return await self.host.step(principal, episode_id, request)

    async def verify(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> Verdict:
        """Verify now (ending the episode if it is still active), or return the stored verdict."""
        return await self.host.verify(principal, episode_id)

    async def state(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> EpisodeState:
        return await self.host.state(principal, episode_id)

    async def close(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> None:
        await self.host.close(principal, episode_id)

    async def fork(
        self,
        episode_id: str,
        request: ForkRequest | None = None,
        principal: Principal = ADMIN_PRINCIPAL,
    ) -> ForkResponse:
        """A copy of a live episode (server/fork.py), admitted like a reset: a fork counts
        in the token's live episodes and starts per hour, and is refunded when it fails."""
        request = request or ForkRequest()
        key = episode_key(principal.token_id, request.episode_id, uuid.uuid4().hex)
        order = ForkOrder(principal=principal, parent_id=episode_id, request=request, key=key)
        ticket = await self.quota.admit(principal, key)  # 429 over the token's quota
        try:
            return await self.host.fork(order)
        except BaseException:
            await self.quota.refund(principal, key, ticket)
            raise

    async def regrade(
        self, episode_id: str, request: RegradeRequest, principal: Principal = ADMIN_PRINCIPAL
    ) -> Verdict:
        """The ended episode's kept final state verified by `request.pack`'s version of its
        task (server/regrade.py); the episode's own verdict is unchanged."""
        return await self.regrader.regrade(principal, episode_id, request)

    async def checkpoint(
        self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL
    ) -> CheckpointResponse:
        """Keep the live episode in the store to resume later (server/checkpoint.py)."""
        return await self.host.checkpoints.checkpoint(principal, episode_id)

    async def resume(
        self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL
    ) -> ResumeResponse:
        """A `resumable` episode live again at its checkpoint (server/checkpoint.py),
        admitted like a reset: it counts in the token's live episodes and starts per hour."""
        _, key = await self.host.owned(principal, episode_id)  # 404: not the caller's
        ticket = await self.quota.admit(principal, key)  # 429 over the token's quota
        try:
            return await self.host.checkpoints.resume(principal, episode_id)
        except BaseException:
            await self.quota.refund(principal, key, ticket)
            raise

    async def owned(self, principal: Principal, episode_id: str) -> tuple[Episode | None, str]:
        """The held episode `episode_id` names for `principal` (None when its host holds it
        no more) and its store key; 404 when it names none the principal owns (DESIGN §3).
        The one ownership check of every route and of groups (server/groups.py)."""
        return await self.host.owned(principal, episode_id)

    # -- the reaper -----------------------------------------------------------------------
    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            await self.reap()

    async def reap(self) -> int:
        """Expire idle episodes; returns how many."""
        expired = await self.host.reap()
        self.tenancy.prune()
        return expired
