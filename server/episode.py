"""One live episode as the manager keeps it, and the verdicts the manager makes for it.

A family's verify returns an `Assessment` (what it decided); `verdict_of` adds what every
verdict shares. A void verdict (an infrastructure fault) and an agent fault's 0 are made
here too, as are the errors that name an episode.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from palaestra.envs.base import Assessment, EpisodeContext, Family, StepOutcome
from palaestra.sandbox import AgentFault, SandboxError, WorkspaceFault
from palaestra.sdk.errors import ConflictError, InvalidActionError, NotFoundError
from palaestra.sdk.failures import Failure, FailureKind, kind_of_class
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    EpisodeStatus,
    Limits,
    StepResponse,
    Verdict,
    VerifierInfo,
)
from palaestra.sdk.task import Task
from palaestra.server.sealed import seal
from palaestra.server.steplock import EpisodeLock
from palaestra.server.tally import StepTally
from palaestra.verifiers.judge_protocol import JudgeUnavailable

if TYPE_CHECKING:
    from palaestra.server.harness.runner import HarnessRun

log = logging.getLogger("palaestra.episodes")

ORACLE_TOOL = "oracle"
# The last replies of a live episode kept whole, for retried request ids; older ones come
# back from the store (a terminal step's reply can be 64 KiB, and there may be thousands of
# live episodes).
REPLAY_CACHE = 16
VOID = EpisodeStatus.VOID


@dataclass
class Episode:
    number: int  # what its steps are stored under (Store.create_episode)
    task: Task
    family: Family
    ctx: EpisodeContext
    limits: Limits
    state: EpisodeState
    started: float
    last_active: float
    lock: EpisodeLock = field(default_factory=EpisodeLock)
    replies: OrderedDict[str, StepResponse] = field(default_factory=OrderedDict)
    request_ids: set[str] = field(default_factory=set)  # every request id this episode stepped
    oracle: list[Action] | None = None
    step_timer: Any = None  # the family's step-latency histogram child, looked up once
    tally: StepTally = field(default_factory=StepTally)
    full_feedback: str | None = None  # a sealed verdict's own feedback: admin tokens only
    owner: str = ""  # the token id that started it (server/tenancy.py)
    cpu_mark: float | None = None  # the sandbox's CPU counter at the last reading
    harness: HarnessRun | None = None  # a harness episode's run (server/harness/runner.py)

    @property
    def id(self) -> str:
        """The store key (a client-chosen id is scoped by its owner: tenancy.episode_key)."""
        return self.state.episode_id

    def settled_state(self) -> EpisodeState:
        """The state with its metrics brought up to date (before it is read or stored)."""
        self.state.metrics = self.tally.model()
        return self.state

    def resolve_action(self, action: Action) -> tuple[Action, Action]:
        """The action to run and the one to record (an oracle's answer on a sealed split is not)."""
        if action.tool != ORACLE_TOOL or self.oracle is None:
            return action, action
        if not self.oracle:
            raise InvalidActionError("the oracle has no actions left for this episode")
        real = self.oracle.pop(0)
        shown = Action(tool=real.tool, arguments={"oracle": True}) if self.task.sealed else real
        return real, shown

    def remember(self, request_id: str, reply: StepResponse) -> None:
        """A stepped request id, and its reply while it is among the last REPLAY_CACHE."""
        self.request_ids.add(request_id)
        self.replies[request_id] = reply
        if len(self.replies) > REPLAY_CACHE:
            self.replies.popitem(last=False)

    def count_step(self, reply: StepResponse, outcome: StepOutcome | None) -> None:
        """Count a stepped action in the metrics: what the family's outcome says; without
        one (a limit ended the episode, or it went void), a call that ran unless void."""
        if outcome is None:
            ok, timed_out, size = self.state.status is not EpisodeStatus.VOID, False, None
        else:
            ok, timed_out, size = outcome.tool_ok, outcome.timed_out, outcome.output_bytes
        if size is None:
            size = len(reply.observation.text.encode("utf-8", errors="replace"))
        self.tally.add_step(tool_ok=ok, timed_out=timed_out, output_bytes=size)

    def meter(self) -> float | None:
        """CPU-seconds the episode's sandbox used since the last reading, from its cgroup;
        None when it has no counter (then a step is billed its wall time)."""
        total = self.ctx.sandboxes.episode_cpu_seconds()
        if total is None:
            return 0.0 if self.cpu_mark is not None else None  # metered, now freed
        used = float(total) - (self.cpu_mark or 0.0)
        self.cpu_mark = float(total)
        return max(0.0, used)


def task_info(task: Task) -> dict[str, Any]:
    """What a reset reply's `info` says of its task (a sealed generated task's held-out
    draw too: an eval run records which draw it measured, server/draws.py)."""
    info: dict[str, Any] = {
        "task": task.ref,
        "task_digest": task.digest,
        "family": task.family,
        "domain": task.domain,
        "split": task.split,
        "difficulty": task.difficulty,
    }
    if task.draw is not None:
        info["heldout_draw"] = task.draw
    return info


def void_verdict(
    task_digest: str, reason: str, duration: float, kind: FailureKind | None = None
) -> Verdict:
    return Verdict(
        reward=0.0,
        passed=False,
        status="void",
        failure_kind=kind,
        feedback=reason,
        verifier=VerifierInfo(name="none", version="0"),
        task_digest=task_digest,
        duration_s=duration,
    )


def verdict_of(episode: Episode, judged: Assessment, duration: float) -> Verdict:
    """The wire verdict: what the family decided, and what every verdict shares."""
    return Verdict(
        reward=judged.reward,
        passed=judged.passed,
        failure=judged.failure,
        failure_kind=None if judged.failure is None else kind_of_class(judged.failure),
        components=judged.components,
        feedback=judged.feedback,
        verifier=episode.family.verifier_info(),
        task_digest=episode.task.digest,
        duration_s=duration,
    )


def agent_fault(exc: AgentFault) -> Assessment:
    return Assessment(
        reward=0.0, passed=False, failure=exc.failure, feedback=f"{exc.failure}: {exc}"[:2000]
    )


async def sandbox_fault(episode: Episode) -> WorkspaceFault | None:
    """After a SandboxError: the agent fault the episode's sandbox state explains it by
    (its processes fill the pids limit, its workspace is full), else None (ours: void).
    The rule (docs/reference/episodes.md, "The agent cannot void its episode"): what the agent's
    processes did to their own sandbox is the agent's, never void."""
    box = episode.ctx.sandboxes.episode
    if box is None or not box.alive:
        return None
    try:
        return await box.agent_fault()
    except Exception:  # a diagnosis that fails diagnoses nothing
        log.warning("sandbox diagnosis failed", exc_info=True, extra={"episode_id": episode.id})
        return None


async def judge(episode: Episode) -> Assessment:
    """The family's verify, with a fault of the agent's (raised, or a SandboxError its
    sandbox's state explains) made its 0 with the failure class."""
    try:
        return await episode.family.verify(episode.ctx)
    except AgentFault as exc:
        return agent_fault(exc)
    except SandboxError:
        fault = await sandbox_fault(episode)
        if fault is None:
            raise
        return agent_fault(fault)


async def assess(episode: Episode) -> tuple[Verdict, EpisodeStatus, Failure | None]:
    """Run the family's verify: the verdict, the status it ends the episode with, and the
    failure (sdk/failures.py; its reason is the void reason). An agent fault is a 0, never
    void (a void would let a policy escape a sure 0, docs/reference/episodes.md); a judge
    that gave no verdict, a sandbox or verifier failure is void. A sealed verdict is made
    servable here, and only here."""
    started = time.perf_counter()
    try:
        judged = await judge(episode)
    except JudgeUnavailable as exc:
        reason = f"judge unavailable ({exc.endpoint}: {exc.reason})"
        kind = FailureKind.JUDGE_UNAVAILABLE
        log.warning("%s", reason, extra={"episode_id": episode.id})
    except Exception as exc:
        sandbox = isinstance(exc, SandboxError)
        what = "sandbox failed" if sandbox else "verifier crashed"
        kind = FailureKind.SANDBOX_FAILED if sandbox else FailureKind.VERIFIER_CRASHED
        log_crash(episode, f"{what} while verifying", exc)
        reason = f"{what} ({type(exc).__name__})"
    else:
        verdict = verdict_of(episode, judged, time.perf_counter() - started)
        if episode.task.sealed:
            episode.full_feedback = verdict.feedback  # admin tokens only, never stored
            verdict = seal(verdict)
        return verdict, EpisodeStatus.DONE, verdict_failure(verdict)
    duration = time.perf_counter() - started
    return void_verdict(episode.task.digest, reason, duration, kind), VOID, Failure.of(kind, reason)


def verdict_failure(verdict: Verdict) -> Failure | None:
    """An `ok` verdict's failure: its class's agent kind (None: no failure class)."""
    return None if verdict.failure is None else Failure.of_class(verdict.failure)


def log_crash(episode: Episode, what: str, exc: BaseException) -> None:
    """A traceback on a public split; on a sealed one only the exception's type, since its
    message and frames may quote private fields (the log is no way around the seal)."""
    extra = {"episode_id": episode.id, "task_digest": episode.task.digest}
    if episode.task.sealed:
        log.error("%s (%s; sealed split: details withheld)", what, type(exc).__name__, extra=extra)
    else:
        log.error("%s", what, exc_info=exc, extra=extra)


def unknown_episode(episode_id: str) -> NotFoundError:
    """The one answer for an id the caller does not own, whether or not it exists."""
    return NotFoundError(f"unknown episode {episode_id!r}")


def id_taken(episode_id: str) -> ConflictError:
    return ConflictError(
        f"episode id {episode_id!r} is already in use by this token (live, ended or being "
        "started); choose another episode_id, or omit it to get a fresh one",
        code="episode_exists",
    )
