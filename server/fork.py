"""Fork (`POST /v1/episodes/{id}/fork`): a live episode copied into a new one of the same
token, for tree search and reward-hack search from a mid-trajectory state.

The fork gets a copy of the parent's sandbox (`Backend.fork`: bwrap copies the workspace
folder on the host, with reflinks where the filesystem has them; other backends move it
through a tar), of the family's state (`Family.fork_state`, a deep copy by default) and
of the trajectory so far (`Store.copy_steps`, in the database). It is made under the
parent's lock, so no step of the parent runs meanwhile; the parent goes on unchanged.
What it keeps of its parent: the task (a sealed split stays sealed, its verdicts sealed
as every one of the split's), the limits and the start time (a fork has what is left of
its parent's wall time: forking never buys time), the step count, the request ids (a
retried request id answers what the parent's step answered) and the oracle's remaining
actions. The front counts a fork as a reset in the token's quota (server/manager.py).
"""

from __future__ import annotations

import copy
import logging
import time
from typing import TYPE_CHECKING, Any

from palaestra.envs.base import EpisodeContext, Sandboxes
from palaestra.sandbox import AgentFault, SandboxError
from palaestra.sdk.errors import (
    ConflictError,
    InvalidActionError,
    PalaestraError,
    UnavailableError,
)
from palaestra.sdk.models import EpisodeStatus, ForkResponse
from palaestra.server.episode import Episode, id_taken, task_info
from palaestra.server.host import ForkOrder
from palaestra.server.store import Store

if TYPE_CHECKING:
    from palaestra.server.local_host import LocalHost

log = logging.getLogger("palaestra.episodes")


def ended(episode_id: str, status: str) -> ConflictError:
    return ConflictError(
        f"episode {episode_id} has ended ({status}); only a live episode can be forked"
    )


async def stored_ended(store: Store, key: str, episode_id: str) -> ConflictError:
    """The 409 of a fork of an episode only the store holds (it ended, or went void)."""
    state = await store.load_episode(key, with_trajectory=False)
    return ended(episode_id, state.status.value if state is not None else "ended")


def refuse_retired(host: LocalHost, ref: str) -> None:
    """A fork is a new episode: none of a task whose held-out draw was retired since its
    parent started (server/draws.py; the parent itself finishes). 404 `draw_retired`."""
    try:
        host.checkpoints.packs.resolve(ref)
    except PalaestraError as exc:
        if exc.code == "draw_retired":
            raise
        # a pack no longer served otherwise: the parent's task is forked as it was


async def fork_episode(host: LocalHost, parent: Episode, order: ForkOrder) -> Episode:
    """The fork of `parent` under `order.key`, made (its sandbox, state and stored row) but
    not yet live: the host registers it. Nothing is left behind when it fails."""
    if order.request.episode_id and await host.store.owners((order.key,)):
        raise id_taken(order.request.episode_id)  # stored by this or an earlier server
    async with parent.lock:
        if parent.state.status is not EpisodeStatus.ACTIVE:
            raise ended(order.parent_id, parent.state.status.value)
        if parent.harness is not None:
            raise ConflictError(
                f"episode {order.parent_id} is driven by its harness; a harness episode "
                "cannot be forked",
                code="harness_episode",
            )
        task, family = parent.task, parent.family
        refuse_retired(host, task.ref)
        try:
            sandboxes = await host.sandboxes.fork(parent.ctx.sandboxes, family, task)
        except AgentFault as exc:  # what the agent left cannot be copied (a sparse giant)
            raise InvalidActionError(
                f"the workspace cannot be copied: {exc}", code=exc.failure
            ) from None
        except SandboxError as exc:
            raise UnavailableError(
                f"the sandbox could not be forked: {exc}", code="sandbox_failed"
            ) from None
        try:
            state = family.fork_state(parent.ctx.state)
        except BaseException:
            await host.sandboxes.free(sandboxes)
            raise
        return _child(host, parent, order, sandboxes, state)


def _child(
    host: LocalHost, parent: Episode, order: ForkOrder, sandboxes: Sandboxes, state: Any
) -> Episode:
    """The fork's episode and its stored row, its trajectory a copy of the parent's."""
    source = parent.ctx
    ctx = EpisodeContext(
        episode_id=order.key,
        task=source.task,
        seed=source.seed,
        options=dict(source.options),
        sandboxes=sandboxes,
        state=state,
        judges=source.judges,
    )
    now, mono = time.time(), time.monotonic()
    steps = parent.state.step_count
    record = parent.settled_state().model_copy(
        update={
            "episode_id": order.key,
            "created_at": now,
            "updated_at": now,
            "timings": {},
            "trajectory": [],
            "harness": None,
            "sealed_feedback": None,
        },
        deep=True,
    )
    owner = order.principal.token_id
    task = parent.task
    row = host.store.create_episode(record, task.digest, task.sealed, owner=owner)
    host.store.copy_steps(parent.number, row.number, steps)
    host.store.update_episode(record)  # its step count
    child = Episode(
        number=row.number,
        step_timer=parent.step_timer,
        task=task,
        family=parent.family,
        ctx=ctx,
        limits=parent.limits,
        state=record,
        started=parent.started,
        last_active=mono,
        oracle=list(parent.oracle) if parent.oracle is not None else None,
        owner=owner,
    )
    child.tally = copy.deepcopy(parent.tally)
    child.request_ids = set(parent.request_ids)
    child.replies = copy.copy(parent.replies)  # replies are never changed once made
    host.metrics.episodes_started.labels(family=task.family).inc()
    log.info(
        "episode forked from %s",
        parent.id,
        extra={"episode_id": order.key, "task_digest": task.digest},
    )
    return child


def fork_reply(child: Episode, order: ForkOrder) -> ForkResponse:
    return ForkResponse(
        episode_id=order.request.episode_id or child.id,
        parent_id=order.parent_id,
        step_count=child.state.step_count,
        tools=child.family.tool_specs(),
        limits=child.limits,
        info={**task_info(child.task), "forked_from": order.parent_id},
    )
