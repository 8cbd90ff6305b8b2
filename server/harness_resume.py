"""A harness episode's checkpoint and resume (server/checkpoint.py does the rest; the
replay itself is server/harness/replay.py).

Its checkpoint holds the workspace as the harness found it at its start (kept then, in a
thread of the harness's own start, never on a reset's path; `checkpoint_harness` turns it
off), its family state, and the capture: the digests of the model calls recorded so far
(the calls themselves are the trajectory up to the checkpoint). A resume checks the
trajectory against those digests, opens the model session again as the reset asked it
(the same harness, endpoint and limits, checked against today's settings) answering the
capture first, and starts the harness from that start workspace.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from palaestra.envs.base import Family
from palaestra.sandbox import SandboxSpec
from palaestra.sdk.errors import ConflictError, PalaestraError, UnavailableError
from palaestra.sdk.harness import LLM_CALL_TOOL, LlmCall
from palaestra.sdk.task import Task
from palaestra.server.auth import Principal
from palaestra.server.episode import Episode
from palaestra.server.harness.replay import HarnessCapture, Replay, call_digest
from palaestra.server.harness.runner import HarnessRun

if TYPE_CHECKING:
    from palaestra.server.local_host import LocalHost

log = logging.getLogger("palaestra.episodes")


class CaptureBroken(Exception):
    """The checkpoint's capture cannot be replayed (altered, or its harness is refused
    now): the episode ends void, `resume_failed`, naming why."""


def capture_of(episode: Episode, run: HarnessRun, start: tuple[str, int] | None) -> HarnessCapture:
    """The capture of a running harness episode, under its lock; 409 when it has none to
    give (its start was not kept, or its harness has stopped: verify it instead)."""
    if not run.running:
        raise ConflictError(
            f"episode {episode.id}'s harness has stopped; its verdict is being made (POST "
            "…/verify waits for it)",
            code="harness_episode",
        )
    if start is None:
        raise ConflictError(
            f"episode {episode.id} is driven by its harness, and its start workspace was not "
            "kept (checkpoint_harness is off, or the harness has not started yet, or the "
            "workspace could not be archived then); it cannot be checkpointed",
            code="harness_episode",
        )
    steps = episode.state.step_count
    if len(run.captured) != steps:  # a call is being recorded this instant
        raise ConflictError(
            f"episode {episode.id} is recording a model call; retry the checkpoint",
            code="harness_episode",
        )
    return HarnessCapture(instruction=run.instruction, calls=list(run.captured))


async def load_replay(host: LocalHost, key: str, capture: HarnessCapture, steps: int) -> Replay:
    """The captured calls, from the trajectory, checked against the checkpoint's digests."""
    if len(capture.calls) != steps:
        raise CaptureBroken(f"it names {len(capture.calls)} model calls for {steps} steps")
    records = await host.store.load_steps(key, steps)
    if len(records) != steps:
        raise CaptureBroken(f"the trajectory holds {len(records)} of its {steps} steps")
    calls: list[LlmCall] = []
    for record, digest in zip(records, capture.calls, strict=True):
        raw = record.info.get("llm_call")
        if record.action.tool != LLM_CALL_TOOL or not isinstance(raw, dict):
            raise CaptureBroken(f"step {record.index} is no recorded model call")
        if call_digest(raw) != digest:
            raise CaptureBroken(
                f"the recorded model call of step {record.index} was altered since the "
                "checkpoint (its digest differs)"
            )
        calls.append(LlmCall.model_validate(raw))
    return Replay(calls)


async def reopen(
    host: LocalHost,
    principal: Principal,
    options: dict[str, object],
    family: Family,
    task: Task,
    key: str,
    owner: str,
    replay: Replay,
) -> tuple[HarnessRun, SandboxSpec]:
    """The harness run again (its session answering `replay` first) and the sandbox spec;
    503 while its endpoint or harness is unavailable (the episode stays resumable),
    CaptureBroken when today's settings refuse what the reset asked."""
    try:
        plan = await host.harness.plan(dict(options), principal, family, task)
        if plan is None:
            raise CaptureBroken("its reset options name no harness")
        return host.harness.reopen(plan, family.sandbox_spec(task), key, owner, replay)
    except UnavailableError:
        raise
    except PalaestraError as exc:
        raise CaptureBroken(f"its harness is refused now: {exc.message}") from None
