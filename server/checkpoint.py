"""Checkpoint and resume (`POST /v1/episodes/{id}/checkpoint`, `.../resume`): a live
episode kept in the store so that it outlives its server (a restart, a SIGKILL, a
preemption) and goes on from there.

A checkpoint is taken under the episode's lock, no step running: the sandbox's workdir
streamed into a spool file and kept as a content-addressed snapshot (server/snapshots.py),
the family's state as JSON (`Family.checkpoint_state`), and what the host keeps of the
episode (limits, tally, wall time used, the oracle's remaining actions, request ids). It
is one row of `checkpoints` (an episode keeps its last), written after every step record
queued before it is committed, so the trajectory up to it is on disk too. The episode
goes on. A harness episode's process cannot be frozen: its checkpoint is its start
workspace and its recorded model calls, and its resume replays them
(server/harness_resume.py, server/harness/replay.py).

At start, an episode a previous server left `active` becomes `resumable` when it has a
checkpoint (the rest are void as before); a graceful stop parks checkpointed episodes the
same way. A resume restores one into a fresh sandbox under the same id: the trajectory is
cut back to the checkpoint's step (later steps are lost, and the reply says how many), the
wall time used is the checkpoint's (time spent down is not counted). A checkpoint that can
no longer be restored (its pack version gone or changed, its image missing, its snapshot
gone) ends the episode void with failure kind `resume_failed`, naming why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from palaestra.envs.base import EpisodeContext
from palaestra.sandbox import AgentFault, SandboxError
from palaestra.sandbox.base import spool_file
from palaestra.sdk.errors import (
    CapacityError,
    ConflictError,
    InvalidActionError,
    PalaestraError,
    UnavailableError,
)
from palaestra.sdk.failures import Failure, FailureKind
from palaestra.sdk.models import (
    Action,
    CheckpointResponse,
    EpisodeState,
    EpisodeStatus,
    Limits,
    ResumeResponse,
)
from palaestra.server.auth import Principal
from palaestra.server.checkpoint_retention import EXPIRED_BY, expire_stale, expired_error
from palaestra.server.db import Connection
from palaestra.server.episode import Episode, task_info, void_verdict
from palaestra.server.harness.replay import HarnessCapture
from palaestra.server.harness_resume import CaptureBroken, capture_of, load_replay, reopen
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.snapshots import SnapshotMissing, Snapshots
from palaestra.server.tally import StepTally

if TYPE_CHECKING:
    from palaestra.server.local_host import LocalHost

log = logging.getLogger("palaestra.episodes")

MAX_REQUEST_IDS = 10_000  # request ids kept in a checkpoint (a retry of an older one re-steps)
HOUR_S = 3600.0


class CheckpointRecord(BaseModel):
    """What a checkpoint keeps besides the workspace (never sent to a client: it may hold
    a sealed task's oracle actions and the family's private state)."""

    task: str
    task_digest: str
    family: str
    image: str | None = None  # the episode sandbox's image (None: the host's)
    seed: int | None = None
    options: dict[str, Any] = {}
    limits: Limits
    elapsed_s: float  # wall time the episode had used
    state: Any = None  # Family.checkpoint_state
    tally: dict[str, int] = {}
    oracle: list[Action] | None = None
    request_ids: list[str] = []
    harness: HarnessCapture | None = None  # a harness episode's (its workspace: the start)


class Unrestorable(Exception):
    """The checkpoint cannot be made live again: the episode ends void, naming why."""


def not_resumable(episode_id: str, status: str) -> ConflictError:
    return ConflictError(
        f"episode {episode_id} is {status}; only an episode left `resumable` by a stopped "
        "server (one with a checkpoint) can be resumed",
        code="not_resumable",
    )


def resume_refused(episode_id: str, state: EpisodeState | None) -> ConflictError:
    """The 409 of a resume of an episode that is not `resumable`: `checkpoint_expired`
    when the retention deleted its checkpoint, else `not_resumable`."""
    failure = state.failure if state is not None else None
    if failure is not None and EXPIRED_BY in failure.reason:
        return expired_error(episode_id, failure.reason)
    return not_resumable(episode_id, state.status.value if state is not None else "unknown")


class Checkpoints:
    """A local host's checkpoints (server/local_host.py holds one)."""

    def __init__(self, host: LocalHost, packs: PackCatalog) -> None:
        self.host = host
        self.packs = packs
        self.store = host.store
        folder = host.settings.checkpoint_dir or host.settings.data_dir / "snapshots"
        self.snapshots = Snapshots(folder)
        self._made: dict[str, deque[float]] = {}  # token id -> checkpoint times this hour
        self._held: set[str] = set()  # keys of live episodes with a checkpoint row
        self._putting: set[str] = set()  # snapshot digests stored, their row not yet written
        self._starts: dict[str, tuple[str, int]] = {}  # live harness episodes' start snapshots
        self._started: dict[str, tuple[float, float | None]] = {}  # put at, harness start
        self._keeping = 0  # starts being archived: their digests are not in _starts yet
        self._dropping = asyncio.Lock()  # no start is archived while ended ones are dropped
        self._auto: dict[str, bool] = {}  # automatic checkpoints running: another one due?

    # -- checkpoint -----------------------------------------------------------------------
    async def checkpoint(self, principal: Principal, episode_id: str) -> CheckpointResponse:
        host = self.host
        episode, key = await host.owned(principal, episode_id)  # 404: not the caller's
        if episode is None or episode.state.status is not EpisodeStatus.ACTIVE:
            state = episode.state if episode is not None else await self._stored(key)
            status = state.status.value if state is not None else "ended"
            raise ConflictError(
                f"episode {episode_id} is {status}; only a live episode can be checkpointed"
            )
        self._admit(principal)
        return await self._take(episode, episode_id)

    def auto(self, episode: Episode) -> None:
        """After a step: every `checkpoint_every_steps` steps, a checkpoint taken in the
        background (the step's reply does not wait for it; one at a time an episode: one
        due while another runs is taken again after it, so none is lost)."""
        every = self.host.settings.checkpoint_every_steps
        steps = episode.state.step_count
        if not every or steps % every or episode.state.status is not EpisodeStatus.ACTIVE:
            return
        if episode.id in self._auto:
            self._auto[episode.id] = True
            return
        self._auto[episode.id] = False
        self.host._keep(asyncio.ensure_future(self._take_auto(episode)))

    async def _take_auto(self, episode: Episode) -> None:
        key = episode.id
        try:
            again = True
            while again and episode.state.status is EpisodeStatus.ACTIVE:
                self._auto[key] = False
                await self._take(episode, key)
                again = self._auto[key]
        except PalaestraError as exc:  # ended meanwhile, or its workspace cannot be kept
            log.info("no automatic checkpoint: %s", exc.message, extra={"episode_id": key})
        except Exception:
            log.exception("automatic checkpoint failed", extra={"episode_id": key})
        finally:
            self._auto.pop(key, None)

    async def _take(self, episode: Episode, episode_id: str) -> CheckpointResponse:
        """Checkpoint a live episode (under its lock: no step runs meanwhile)."""
        key = episode.id
        async with episode.lock:
            if episode.state.status is not EpisodeStatus.ACTIVE:
                raise ConflictError(f"episode {episode_id} has ended")
            record = self._record(episode)
            steps = episode.state.step_count  # a harness records calls across the awaits
            if episode.harness is not None:  # its start, replayed at resume
                start = self._starts.get(key)
                record.harness = capture_of(episode, episode.harness, start)
                record.harness.started_s = self._started.get(key, (0.0, None))[1]
                digest, size = start or (None, 0)
            else:
                digest, size = await self._snapshot(episode)
            if digest is not None:
                self._putting.add(digest)
            try:
                checkpoint_id, now = uuid.uuid4().hex, time.time()
                await self.store.commit()  # the trajectory up to here is on disk first
                row = (key, checkpoint_id, now, steps, digest, size, record.model_dump_json())
                replaced = await asyncio.to_thread(self._write, row)
            finally:
                self._putting.discard(digest or "")
            if replaced is not None and replaced[0] not in (None, digest):
                await asyncio.to_thread(self._drop, replaced[0], replaced[1])
        self._held.add(key)
        log.info("episode checkpointed at step %d", steps, extra={"episode_id": key})
        return CheckpointResponse(
            episode_id=episode_id,
            checkpoint_id=checkpoint_id,
            step_count=steps,
            created_at=now,
            workspace_bytes=size,
        )

    def _admit(self, principal: Principal) -> None:
        """429 past the token's checkpoints per hour (each writes a workspace archive)."""
        cap = self.host.settings.token_max_checkpoints_per_hour
        now = time.monotonic()
        made = self._made.setdefault(principal.token_id, deque())
        while made and made[0] < now - HOUR_S:
            made.popleft()
        if len(made) >= cap:
            retry = max(1.0, made[0] + HOUR_S - now) if made else HOUR_S
            raise CapacityError(
                f"this token is over its quota of {cap} checkpoints per hour "
                f"(token_max_checkpoints_per_hour); retry after {retry:.0f} s",
                retry_after=retry,
                code="quota_checkpoints",
            )
        made.append(now)

    def _record(self, episode: Episode) -> CheckpointRecord:
        ctx = episode.ctx
        try:
            state = episode.family.checkpoint_state(ctx.state)
        except (TypeError, ValueError) as exc:
            raise ConflictError(
                f"family {episode.family.name}'s state cannot be checkpointed "
                f"({type(exc).__name__}: {exc})",
                code="not_checkpointable",
            ) from None
        box = ctx.sandboxes.episode
        return CheckpointRecord(
            task=episode.task.ref,
            task_digest=episode.task.digest,
            family=episode.family.name,
            image=box.spec.image if box is not None else None,
            seed=ctx.seed,
            options=ctx.options,
            limits=episode.limits,
            elapsed_s=time.monotonic() - episode.started,
            state=state,
            tally=dataclasses.asdict(episode.tally),
            oracle=episode.oracle,
            request_ids=sorted(episode.request_ids)[:MAX_REQUEST_IDS],
        )

    async def keep_start(self, episode: Episode) -> None:
        """A harness episode's workspace as its harness is about to find it, kept so that
        it can be checkpointed (server/harness_resume.py); a failure only logs (its
        checkpoint is then refused, saying so)."""
        if not self.host.settings.checkpoint_harness or episode.id in self._starts:
            return
        async with self._dropping:
            self._keeping += 1
        began = time.monotonic() - episode.started  # where a resume's clock restarts
        try:
            digest, size = await self._snapshot(episode)
        except Exception as exc:  # e.g. a full disk: the harness runs on, uncheckpointable
            why = exc.message if isinstance(exc, PalaestraError) else repr(exc)
            log.warning("harness start not kept: %s", why, extra={"episode_id": episode.id})
            return
        finally:
            self._keeping -= 1
        if digest is not None:
            self._starts[episode.id] = (digest, size)
            self._started[episode.id] = (time.time(), began)  # after its put: drop's bound

    async def _snapshot(self, episode: Episode) -> tuple[str | None, int]:
        """The workdir as a stored snapshot (digest, bytes); (None, 0) without a sandbox."""
        box = episode.ctx.sandboxes.episode
        if box is None:
            return None, 0
        try:
            with spool_file(self.host.sandboxes.spool_dir) as f:
                await box.download_tar_to(f)
                return await self.snapshots.put(f)
        except AgentFault as exc:  # what the agent left cannot be archived (a sparse giant)
            raise InvalidActionError(
                f"the workspace cannot be checkpointed: {exc}", code=exc.failure
            ) from None
        except SandboxError as exc:
            raise UnavailableError(
                f"the workspace could not be read: {exc}", code="sandbox_failed"
            ) from None

    def _write(self, row: tuple[Any, ...]) -> tuple[str | None, float] | None:
        """Write the episode's checkpoint row; the (snapshot, time) of the one it replaced."""
        with self.store.db.transaction() as conn:
            old = conn.one(
                "SELECT workspace, created_at FROM checkpoints WHERE episode_id=?", (row[0],)
            )
            conn.execute(
                "INSERT INTO checkpoints (episode_id, id, created_at, step_count, workspace,"
                " workspace_bytes, record) VALUES (?,?,?,?,?,?,?) ON CONFLICT (episode_id)"
                " DO UPDATE SET id=excluded.id, created_at=excluded.created_at,"
                " step_count=excluded.step_count, workspace=excluded.workspace,"
                " workspace_bytes=excluded.workspace_bytes, record=excluded.record",
                row,
            )
        return None if old is None else (old[0], float(old[1]))

    def _drop(self, digest: str, put_by: float) -> None:
        """A replaced checkpoint's snapshot goes at once unless another checkpoint refers to
        it or is storing it (content-addressed: equal workspaces share one); otherwise one
        episode checkpointed over and over would keep every archive until a prune."""
        if digest in self._putting:
            return
        if self.store.db.one("SELECT 1 FROM checkpoints WHERE workspace=? LIMIT 1", (digest,)):
            return
        self.snapshots.drop(digest, put_by)

    async def _stored(self, key: str) -> EpisodeState | None:
        return await self.store.load_episode(key, with_trajectory=False)

    # -- start, stop, sweep ---------------------------------------------------------------
    async def at_start(self) -> int:
        """Before episodes left active are voided: those with a checkpoint become
        `resumable`; checkpoints of episodes that can never resume are dropped."""

        def mark() -> int:
            with self.store.db.transaction() as conn:
                n = conn.execute(
                    "UPDATE episodes SET status='resumable', updated_at=? WHERE status='active'"
                    " AND id IN (SELECT episode_id FROM checkpoints)",
                    (time.time(),),
                ).rowcount
                conn.execute(
                    "DELETE FROM checkpoints WHERE episode_id NOT IN (SELECT id FROM episodes"
                    " WHERE status IN ('active', 'resumable'))"
                )
            return int(n or 0)

        await self.store.commit()
        resumable = await asyncio.to_thread(mark)
        if resumable:
            log.warning("%d episodes left active with a checkpoint are resumable", resumable)
        await self._expire()
        await self._prune()
        return resumable

    async def _expire(self) -> None:
        """Resumable episodes past `checkpoint_retention_hours` expire, their checkpoints
        and snapshots deleted (server/checkpoint_retention.py)."""
        hours = self.host.settings.checkpoint_retention_hours
        dropped = await asyncio.to_thread(expire_stale, self.store.db, hours)
        for digest, created in dropped:
            await asyncio.to_thread(self._drop, digest, created)
        if dropped:
            log.warning("%d resumable episodes expired (checkpoint_retention_hours)", len(dropped))

    async def park(self, episode: Episode) -> bool:
        """At a graceful stop: a checkpointed episode becomes `resumable` (its sandbox
        freed) instead of void. False when it has no checkpoint."""
        if episode.id not in self._held or episode.state.status is not EpisodeStatus.ACTIVE:
            return False
        # not under its lock: the stop ends live episodes as they are (as `_end` does)
        episode.state.status = EpisodeStatus.RESUMABLE
        episode.state.updated_at = time.time()
        self.store.update_episode(episode.settled_state())
        self.host._live.pop(episode.id, None)
        await self.host.sandboxes.free(episode.ctx.sandboxes)
        await self.store.commit()
        return True

    async def sweep(self) -> None:
        """The reaper's: drop the checkpoints of episodes that ended here, then the
        snapshots nobody refers to."""
        await self._drop_starts()
        await self._expire()
        gone = [key for key in self._held if key not in self.host._live]
        if not gone:
            return
        self._held.difference_update(gone)

        def drop(conn: Connection) -> None:
            for key in gone:
                conn.execute("DELETE FROM checkpoints WHERE episode_id=?", (key,))

        await self._in_transaction(drop)
        await self._prune()

    async def _drop_starts(self) -> None:
        """Ended harness episodes' start snapshots go at once unless still referred to (a
        server whose clients never checkpoint kept each start workspace until a restart).
        Not in a `checkpoint_dir` other nodes may share: their live starts are unknown here."""
        async with self._dropping:
            ended = [key for key in self._starts if key not in self.host._live]
            if not ended or self._keeping:  # one being kept may share bytes: next sweep
                return
            dropped = [(self._starts.pop(k)[0], self._started.pop(k)[0]) for k in ended]
            live = {digest for digest, _ in self._starts.values()}
            for digest, put_by in dropped:
                if digest not in live and self.host.settings.checkpoint_dir is None:
                    await asyncio.to_thread(self._drop, digest, put_by)

    async def _prune(self) -> None:
        rows = await asyncio.to_thread(
            self.store.db.all, "SELECT workspace FROM checkpoints WHERE workspace IS NOT NULL"
        )
        keep = [row[0] for row in rows] + [digest for digest, _ in self._starts.values()]
        gone = await self.snapshots.prune(keep)
        if gone:
            log.info("pruned %d workspace snapshots", gone)

    async def _in_transaction(self, work: Any) -> None:
        await self.store.commit()

        def run() -> None:
            with self.store.db.transaction() as conn:
                work(conn)

        await asyncio.to_thread(run)

    # -- resume ---------------------------------------------------------------------------
    async def resume(self, principal: Principal, episode_id: str) -> ResumeResponse:
        host = self.host
        live = host._find(episode_id, principal)
        if live is not None:
            raise not_resumable(episode_id, live.state.status.value)
        key = await host.stored.key(principal, episode_id)  # 404: not the caller's
        if key in host._reserved or key in host._live:
            raise ConflictError(f"episode {episode_id} is being resumed", code="not_resumable")
        if len(host._live) + host._pending >= host.settings.max_episodes:
            raise CapacityError("the server holds its limit of live episodes", retry_after=1.0)
        host._reserved.add(key)
        host._pending += 1
        try:
            episode, reply = await self._resume(key, episode_id, principal)
        finally:
            host._pending -= 1
            host._reserved.discard(key)
        host._live[key] = episode
        self._held.add(key)
        await self.store.commit()  # a resume a client was told of survives a crash
        if episode.harness is not None:  # it replays its capture, then goes on live
            host.launch_harness(episode, episode.harness.instruction)
        host.metrics.episodes_started.labels(family=episode.task.family).inc()
        log.info("episode resumed at step %d", reply.resumed_at_step, extra={"episode_id": key})
        return reply

    async def _resume(
        self, key: str, episode_id: str, principal: Principal
    ) -> tuple[Episode, ResumeResponse]:
        state = await self._stored(key)
        if state is None or state.status is not EpisodeStatus.RESUMABLE:
            raise resume_refused(episode_id, state)
        row = await asyncio.to_thread(
            self.store.db.one,
            "SELECT c.id, c.step_count, c.workspace, c.record, e.number, e.owner, e.task_digest,"
            " c.workspace_bytes FROM checkpoints c JOIN episodes e ON e.id = c.episode_id"
            " WHERE c.episode_id=?",
            (key,),
        )
        if row is None:
            raise not_resumable(episode_id, "without a checkpoint")
        checkpoint_id, steps, digest, raw, number, owner, task_digest, size = row
        record = CheckpointRecord.model_validate_json(raw)
        try:
            where = (int(number), owner or "", int(steps), principal)
            episode = await self._restore(key, state, record, digest, where)
        except Unrestorable as exc:
            reason = f"the checkpoint cannot be restored: {exc}"
            await self._void_stored(key, task_digest, reason)
            message = f"episode {episode_id}: {reason}; it is void"
            raise ConflictError(message, code="resume_failed") from None
        if episode.harness is not None and digest is not None:  # its start, for its next one
            self._starts[key] = (digest, int(size or 0))
            began = record.harness.started_s if record.harness is not None else None
            self._started[key] = (time.time(), began)
        lost = await self._cut(int(number), int(steps))
        episode.state.step_count = int(steps)
        self.store.update_episode(episode.settled_state())
        info = task_info(episode.task)
        return episode, ResumeResponse(
            episode_id=episode_id,
            checkpoint_id=checkpoint_id,
            resumed_at_step=int(steps),
            lost_steps=lost,
            tools=episode.family.tool_specs(),
            limits=episode.limits,
            info=info,
        )

    async def _restore(
        self,
        key: str,
        state: EpisodeState,
        record: CheckpointRecord,
        digest: str | None,
        where: tuple[int, str, int, Principal],
    ) -> Episode:
        """The episode live again, its sandbox filled from the snapshot; Unrestorable when
        the task, its pack version, the image or the snapshot is gone (or a harness
        episode's capture cannot be replayed)."""
        host = self.host
        number, owner, steps, principal = where
        try:
            task = self.packs.resolve(record.task)
        except PalaestraError as exc:
            raise Unrestorable(f"task {record.task} is no longer served ({exc.message})") from None
        if task.digest != record.task_digest:
            raise Unrestorable(
                f"task {record.task} changed (digest {task.digest[:19]}, the checkpoint's "
                f"{record.task_digest[:19]}): its pack version was replaced"
            )
        try:
            family = host.families.get(task.family)
        except Exception as exc:
            raise Unrestorable(f"family {task.family} is not served ({exc})") from None
        run, spec = None, family.sandbox_spec(task)
        if record.harness is not None:
            try:
                replay = await load_replay(host, key, record.harness, steps)
                run, spec = await reopen(
                    host, principal, record.options, family, task, key, owner, replay
                )
            except CaptureBroken as exc:
                raise Unrestorable(f"its harness capture: {exc}") from None
            run.instruction = record.harness.instruction
        sandboxes = host.sandboxes.for_episode(family, task)
        try:
            if spec is not None and record.image is not None:
                spec = dataclasses.replace(spec, image=record.image)
            await sandboxes.start(spec)
            box = sandboxes.episode
            if box is not None and digest is not None:
                with await asyncio.to_thread(self.snapshots.open, digest) as f:
                    await box.restore_workspace(f)
            restored = family.restore_state(record.state)
        except BaseException as exc:
            await host.sandboxes.free(sandboxes)
            if run is not None:
                await host.harness.abort(run)
            if isinstance(exc, SandboxError | AgentFault):
                image = record.image or "the host's"
                raise Unrestorable(f"the sandbox (image {image}) failed: {exc}") from None
            if isinstance(exc, SnapshotMissing):
                raise Unrestorable(f"its workspace snapshot is gone ({exc})") from None
            if isinstance(exc, ValueError | TypeError | KeyError):
                raise Unrestorable(f"the family's state does not load ({exc})") from None
            raise
        ctx = EpisodeContext(
            episode_id=key,
            task=task,
            seed=record.seed,
            options=dict(record.options),
            sandboxes=sandboxes,
            state=restored,
            judges=host.judges,
        )
        now, mono = time.time(), time.monotonic()
        live = state.model_copy(
            update={
                "status": EpisodeStatus.ACTIVE,
                "updated_at": now,
                "ended_at": None,
                "void_reason": None,
                "failure": None,
                "verdict": None,
                "trajectory": [],
            }
        )
        episode = Episode(
            number=number,
            step_timer=host.metrics.step_seconds.labels(task.family),
            task=task,
            family=family,
            ctx=ctx,
            limits=record.limits,
            state=live,
            started=mono - HarnessCapture.spent(record.harness, record.elapsed_s),
            last_active=mono,
            oracle=record.oracle,
            owner=owner,
            harness=run,
        )
        episode.tally = StepTally(**record.tally)
        episode.request_ids = set(record.request_ids)
        return episode

    async def _cut(self, number: int, steps: int) -> int:
        """Drop the stored steps after the checkpoint's; how many there were."""
        box: list[int] = [0]

        def cut(conn: Connection) -> None:
            last = conn.one(
                "SELECT idx, request_id, record FROM step_records WHERE episode=?"
                " ORDER BY idx DESC LIMIT 1",
                (number,),
            )
            if last is None:
                return
            end = last[0] + (len(json.loads(last[2])) if last[2].startswith("[") else 1)
            box[0] = max(0, end - steps)
            conn.execute("DELETE FROM step_records WHERE episode=? AND idx>=?", (number, steps))
            head = conn.one(
                "SELECT idx, request_id, record FROM step_records WHERE episode=? AND idx<?"
                " ORDER BY idx DESC LIMIT 1",
                (number, steps),
            )
            if head is None or not head[2].startswith("["):
                return
            chunk = json.loads(head[2])
            keep = steps - head[0]
            if len(chunk) <= keep:
                return  # a chunk of steps before the checkpoint only
            ids = head[1].split("\n")[:keep] if head[1] is not None else None
            conn.execute(
                "UPDATE step_records SET request_id=?, record=? WHERE episode=? AND idx=?",
                (
                    None if ids is None else "\n".join(ids),
                    json.dumps(chunk[:keep], separators=(",", ":")),
                    number,
                    head[0],
                ),
            )

        await self._in_transaction(cut)
        return box[0]

    async def _void_stored(self, key: str, task_digest: str, reason: str) -> None:
        """The episode void in the store (it is live nowhere), its verdict void."""
        failure = Failure.of(FailureKind.RESUME_FAILED, reason)
        verdict = void_verdict(task_digest, reason, 0.0, FailureKind.RESUME_FAILED)
        now = time.time()

        def void(conn: Connection) -> None:
            conn.execute(
                "UPDATE episodes SET status='void', void_reason=?, ended_at=?, updated_at=?,"
                " failure=? WHERE id=? AND status='resumable'",
                (reason, now, now, failure.model_dump_json(), key),
            )
            conn.execute(
                "INSERT INTO verdicts (episode_id, verdict) VALUES (?,?) ON CONFLICT"
                " (episode_id) DO UPDATE SET verdict=excluded.verdict",
                (key, verdict.model_dump_json()),
            )
            conn.execute("DELETE FROM checkpoints WHERE episode_id=?", (key,))

        await self._in_transaction(void)
        log.warning("episode void at resume: %s", reason, extra={"episode_id": key})
