"""Regrade (`POST /v1/episodes/{id}/regrade`): an ended episode's kept final state
(server/final_state.py) verified again by another version of its pack, without rerunning
the policy; the episode's own verdict is never touched.

The verifier gets what a normal verify gets, in the same isolation: a fresh sandbox of the
new task's spec that receives the kept workspace (no agent code ever ran in it) and the
family's state as it was kept. The answer is a new `Verdict`, sealed on a sealed split.
Errors: 404 for an episode that is not the caller's (as for an unknown id); 409 when no
final state was kept (never verified, over `final_state_max_mb`, or pruned after
`final_state_retention_days`), naming why; 422 when the pack has no such task or the task
is of another family; 403 where the caller may not run the new task's split; 429 while
the token's live slots are all taken (a regrade holds one as it runs: its sandboxes and
verifier are an episode's) or its CPU-seconds are over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from palaestra.envs.base import EpisodeContext
from palaestra.sandbox import AgentFault, SandboxError
from palaestra.sdk.errors import (
    ConflictError,
    InvalidActionError,
    PalaestraError,
    UnavailableError,
)
from palaestra.sdk.failures import FailureKind, kind_of_class
from palaestra.sdk.models import EpisodeState, RegradeRequest, Verdict
from palaestra.sdk.task import Task
from palaestra.server.auth import Principal
from palaestra.server.episode import agent_fault, unknown_episode, void_verdict
from palaestra.server.final_state import FinalStateRecord, FinalStates
from palaestra.server.sandboxes import SandboxOwner
from palaestra.server.sealed import seal
from palaestra.server.services import Services
from palaestra.server.stored_episodes import StoredEpisodes
from palaestra.verifiers.judge_protocol import JudgeUnavailable

log = logging.getLogger("palaestra.episodes")


def no_final_state(episode_id: str, why: str) -> ConflictError:
    return ConflictError(f"episode {episode_id} cannot be regraded: {why}", code="no_final_state")


class Regrader:
    """Regrades stored episodes of this server. `sandboxes`: where the verifier sandboxes
    are made (None: this server hosts no episodes, 503)."""

    def __init__(self, services: Services, sandboxes: SandboxOwner | None) -> None:
        self.services = services
        self.store = services.store
        self.stored = StoredEpisodes(services.store)
        self.final_states = FinalStates(services.settings, services.store)
        self.sandboxes = None if services.settings.ray else sandboxes
        # a cluster front's: the regrade sent to the worker that kept the final state
        self.remote: Callable[[Principal, str, RegradeRequest], Awaitable[Verdict]] | None = None

    async def regrade(
        self, principal: Principal, episode_id: str, request: RegradeRequest
    ) -> Verdict:
        key = await self.stored.key(principal, episode_id)  # 404: not the caller's
        if self.sandboxes is None and self.remote is not None:
            return await self.remote(principal, episode_id, request)
        if self.sandboxes is None:
            message = "this server hosts no episodes and reaches no worker: it cannot regrade"
            raise UnavailableError(message, code="unsupported", retryable=False)
        stored = await self.store.load_episode(key, with_trajectory=False)
        if stored is None:
            raise unknown_episode(episode_id)
        record = await self._record(key, episode_id, stored)
        task = self._task(stored, request.pack)
        principal.require_episodes(task.sealed, task.split)  # 403: the new split's rule
        document = await self._document(record, episode_id)
        tenancy = self.services.tenancy
        tenancy.hold(principal)  # 429 past its live slots or its CPU-seconds
        started = time.perf_counter()
        try:
            verdict = await self._verify(key, episode_id, task, record, document)
        finally:
            tenancy.charge(principal.token_id, time.perf_counter() - started)
            tenancy.ended(principal.token_id)
        log.info(
            "episode regraded against %s: reward %s",
            task.ref,
            verdict.reward,
            extra={"episode_id": key, "task_digest": task.digest},
        )
        return seal(verdict) if task.sealed else verdict

    async def _record(self, key: str, episode_id: str, stored: EpisodeState) -> FinalStateRecord:
        raw = await self.store.final_state(key)
        if raw is None:
            if stored.verdict is None:
                why = f"it was never verified (status {stored.status.value})"
            else:
                why = "no final state was kept when it was verified"
            raise no_final_state(episode_id, why)
        record = FinalStateRecord.model_validate_json(raw)
        if record.why is not None:
            raise no_final_state(episode_id, record.why)
        return record

    def _task(self, stored: EpisodeState, pack: str) -> Task:
        """The stored episode's task in `pack` (NAME or NAME@VERSION); 422 without it."""
        task_id = stored.task.rpartition(":")[2]
        try:
            task = self.services.packs.resolve(f"{pack}:{task_id}")
        except PalaestraError as exc:
            raise InvalidActionError(
                f"cannot regrade against {pack}: {exc.message}", code="no_such_task"
            ) from None
        if task.family != stored.family:
            raise InvalidActionError(
                f"task {task.ref} is of family {task.family!r}, the episode's of "
                f"{stored.family!r}: a regrade needs the same family",
                code="family_changed",
            )
        return task

    async def _document(self, record: FinalStateRecord, episode_id: str) -> dict[str, Any]:
        """The kept state document; 409 once pruned."""
        kept = self.final_states
        days = self.services.settings.final_state_retention_days
        pruned = f"its final state was pruned (final_state_retention_days is {days:g})"
        if record.state is None:
            raise no_final_state(episode_id, "no family state was kept")
        document = await asyncio.to_thread(kept.document, record.state)
        if document is None:
            raise no_final_state(episode_id, pruned)
        if record.workspace is not None and not kept.path(record.workspace).is_file():
            raise no_final_state(episode_id, pruned)
        return document

    async def _verify(
        self,
        key: str,
        episode_id: str,
        task: Task,
        record: FinalStateRecord,
        document: dict[str, Any],
    ) -> Verdict:
        """The new task's verifier on the kept state, in fresh sandboxes freed after."""
        assert self.sandboxes is not None
        family = self.services.families.get(task.family)
        sandboxes = self.sandboxes.for_episode(family, task)
        spec = family.sandbox_spec(task)
        if spec is not None and record.workspace is None:
            raise no_final_state(episode_id, "no workspace was kept (its episode had none)")
        started = time.perf_counter()
        try:
            await self.sandboxes.start(sandboxes, spec)  # 503 when none can be made
            ctx = EpisodeContext(
                episode_id=key,
                task=task,
                seed=document.get("seed"),
                options=dict(document.get("options") or {}),
                sandboxes=sandboxes,
                state=_state(family.state_model, document.get("state")),
                judges=self.services.judges,
            )
            try:
                box = sandboxes.episode
                if box is not None and record.workspace is not None:
                    with open(self.final_states.path(record.workspace), "rb") as kept:
                        await box.upload_tar_from(kept)
                judged = await family.verify(ctx)
            except AgentFault as exc:  # what the agent left cannot be restored: its 0
                judged = agent_fault(exc)
        except (JudgeUnavailable, SandboxError) as exc:
            kind = (
                FailureKind.JUDGE_UNAVAILABLE
                if isinstance(exc, JudgeUnavailable)
                else FailureKind.SANDBOX_FAILED
            )
            reason = f"regrade failed: {type(exc).__name__}"
            return void_verdict(task.digest, reason, time.perf_counter() - started, kind)
        except PalaestraError:
            raise
        except Exception as exc:
            log.error("verifier crashed while regrading (%s)", type(exc).__name__)
            reason = f"verifier crashed ({type(exc).__name__})"
            duration = time.perf_counter() - started
            return void_verdict(task.digest, reason, duration, FailureKind.VERIFIER_CRASHED)
        finally:
            await self.sandboxes.free(sandboxes)
        return Verdict(
            reward=judged.reward,
            passed=judged.passed,
            failure=judged.failure,
            failure_kind=None if judged.failure is None else kind_of_class(judged.failure),
            components=judged.components,
            feedback=judged.feedback,
            verifier=family.verifier_info(),
            task_digest=task.digest,
            duration_s=time.perf_counter() - started,
        )


def _state(model: Any, values: Any) -> Any:
    """The family's state as kept; a fresh one where it no longer validates (a newer
    family's state model) or was not data."""
    if model is None:
        return values if values is not None else {}
    try:
        return model.model_validate(values or {})
    except ValidationError:
        return model()
