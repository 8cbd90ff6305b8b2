"""Checkpoint and resume across a cluster's workers (server/checkpoint.py does the work on
the worker that hosts the episode).

A front routes a checkpoint to the episode's worker. A resume (a client's, after a whole
restart; or the front's own, when a worker is lost) places the `resumable` episode on a
worker as a reset is placed (its needs, the workers with room first) and that worker
restores it from the checkpoint: the checkpoint's row and family state are in the shared
store, its workspace snapshot in `checkpoint_dir`, which must then be a folder every node
mounts (else a sandboxed episode's resume finds no snapshot and ends void, naming that).
When a worker is lost, its episodes with a checkpoint become `resumable` instead of void
and are resumed on another worker at once; one that no worker can take stays `resumable`
for its client to resume later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from palaestra.sdk.errors import CapacityError, ConflictError
from palaestra.sdk.models import CheckpointResponse, EpisodeStatus, ResumeResponse
from palaestra.server.auth import ADMIN_PRINCIPAL, Principal
from palaestra.server.checkpoint import resume_refused
from palaestra.server.cluster.channel import WorkerUnreachable
from palaestra.server.cluster.placement import WORKER_FULL, Needs, candidates, cluster_full
from palaestra.server.cluster.worker import principal_json

if TYPE_CHECKING:
    from palaestra.server.cluster.front import ClusterHost, Route

log = logging.getLogger("palaestra.cluster")


def route_to(worker: str, task: str) -> Route:
    from palaestra.server.cluster.front import Route  # the front imports this module

    return Route(worker, task)


class ClusterCheckpoints:
    """A cluster front's `Checkpointing` (server/host.py)."""

    def __init__(self, host: ClusterHost) -> None:
        self.host = host

    async def checkpoint(self, principal: Principal, episode_id: str) -> CheckpointResponse:
        host = self.host
        found = await host._route(principal, episode_id)
        if found is not None:
            args = {"id": episode_id, "principal": principal_json(principal)}
            body = await host._call(found[1], "checkpoint", args)
            if body is not None:
                return CheckpointResponse.model_validate_json(body)
        key = await host.stored.key(principal, episode_id)  # 404: not the caller's
        state = await host.store.load_episode(key, with_trajectory=False)
        status = state.status.value if state is not None else "ended"
        raise ConflictError(
            f"episode {episode_id} is {status}; only a live episode can be checkpointed"
        )

    async def resume(self, principal: Principal, episode_id: str) -> ResumeResponse:
        key = await self.host.stored.key(principal, episode_id)  # 404: not the caller's
        return await self._place(principal, episode_id, key)

    async def _place(self, principal: Principal, episode_id: str, key: str) -> ResumeResponse:
        """The resume on the first worker that takes it (429 when every one is full)."""
        host = self.host
        state = await host.store.load_episode(key, with_trajectory=False)
        if state is None or state.status is not EpisodeStatus.RESUMABLE:
            raise resume_refused(episode_id, state)
        try:  # the task as the front serves it; the worker checks it against the checkpoint
            task = host.services.packs.resolve(state.task)
            needs = Needs.of(host.services.families.get(task.family), task, host.settings)
        except Exception:
            needs = Needs()  # gone: the worker that takes it finds so and voids it
        infos = [w.info for w in host.workers.values()]
        order = candidates(infos, needs, host.settings.ray_overcommit, f"episode {episode_id}")
        args = {
            "id": episode_id,
            "key": key,
            "principal": principal_json(principal),
            "needs": needs.to_json(),
        }
        refusals: list[str] = []
        for info in order:
            worker = host.workers.get(info.name)
            if worker is None:
                continue
            try:
                body = await worker.channel.call("resume", args)
            except CapacityError as exc:
                if exc.code != WORKER_FULL:
                    raise
                refusals.append(exc.message)
                worker.info.live = worker.info.slots
                continue
            except WorkerUnreachable:
                continue
            worker.info.live += 1
            host._remember(key, route_to(worker.info.name, state.task))
            return ResumeResponse.model_validate_json(body)
        raise cluster_full(refusals)

    async def lost(self, keys: list[str]) -> set[str]:
        """A lost worker's episodes: those with a checkpoint become `resumable` (the rest
        the front voids); which did."""
        if not keys:
            return set()
        marks = ",".join("?" * len(keys))

        def mark() -> set[str]:
            with self.host.store.db.transaction() as conn:
                found = conn.all(
                    f"SELECT episode_id FROM checkpoints WHERE episode_id IN ({marks})", keys
                )
                kept = {row[0] for row in found}
                for key in kept:
                    conn.execute(
                        "UPDATE episodes SET status='resumable', updated_at=?"
                        " WHERE id=? AND status='active'",
                        (time.time(), key),
                    )
            return kept

        await self.host.store.commit()
        return await asyncio.to_thread(mark)

    async def resume_lost(self, keys: set[str]) -> list[str]:
        """Resume a lost worker's checkpointed episodes elsewhere; the keys not live again
        (void at restore, or left resumable: no worker could take them, and their client
        may resume them later), which the ledger then counts as ended."""
        left: list[str] = []
        for key in sorted(keys):
            try:
                reply = await self._place(ADMIN_PRINCIPAL, key, key)
                log.info(
                    "episode resumed at step %d after its worker was lost",
                    reply.resumed_at_step,
                    extra={"episode_id": key},
                )
            except ConflictError as exc:  # void at restore (resume_failed), or not resumable
                log.warning("episode not resumed: %s", exc.message, extra={"episode_id": key})
                left.append(key)
            except Exception as exc:
                log.warning("episode left resumable: %s", exc, extra={"episode_id": key})
                left.append(key)
        return left
