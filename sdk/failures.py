"""Why an episode failed, in one small vocabulary (docs/failures.md).

Free-text void reasons and per-family failure classes cannot be grouped by a collector, a
metric or a report. Every ended episode carries one `Failure` (None when nothing failed):
a low-cardinality `kind`, the `boundary` it crossed (which component failed), and facts of
the occurrence (exit code, HTTP status, reason). Whether an episode is void or scores 0
follows from the kind alone: a kind the agent's actions can cause scores 0 and is trained
on; any other is infrastructure, void, and masked out of training groups (otherwise a policy
learns to trigger void to escape a sure 0, or a host fault is learnt as the policy's 0).

This module imports nothing else of palaestra, so sdk/models.py can use it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Boundary(StrEnum):
    """The component whose failure ended the episode."""

    MODEL = "model"  # the policy's model endpoint (harness mode's session model)
    HARNESS = "harness"  # the agent harness the server runs (harness mode)
    AGENT = "agent"  # the agent's own actions and code: never infrastructure
    SANDBOX = "sandbox"  # the sandbox, for a host reason
    VERIFIER = "verifier"  # the verifier or the judge it asked
    SERVER = "server"  # the server, its worker, or the family code it hosts


class FailureKind(StrEnum):
    NO_ANSWER = "no_answer"
    BAD_ANSWER = "bad_answer"
    AGENT_TIMEOUT = "agent_timeout"
    AGENT_CRASH = "agent_crash"
    AGENT_RESOURCES = "agent_resources"
    MODEL_FAILED = "model_failed"
    HARNESS_CRASHED = "harness_crashed"
    SANDBOX_FAILED = "sandbox_failed"
    VERIFIER_CRASHED = "verifier_crashed"
    JUDGE_UNAVAILABLE = "judge_unavailable"
    ENV_CRASHED = "env_crashed"
    WORKER_LOST = "worker_lost"
    SERVER_SHUTDOWN = "server_shutdown"
    EXPIRED = "expired"
    RESUME_FAILED = "resume_failed"


K = FailureKind
BOUNDARIES: dict[FailureKind, Boundary] = {
    K.NO_ANSWER: Boundary.AGENT,
    K.BAD_ANSWER: Boundary.AGENT,
    K.AGENT_TIMEOUT: Boundary.AGENT,
    K.AGENT_CRASH: Boundary.AGENT,
    K.AGENT_RESOURCES: Boundary.AGENT,
    K.MODEL_FAILED: Boundary.MODEL,
    K.HARNESS_CRASHED: Boundary.HARNESS,
    K.SANDBOX_FAILED: Boundary.SANDBOX,
    K.VERIFIER_CRASHED: Boundary.VERIFIER,
    K.JUDGE_UNAVAILABLE: Boundary.VERIFIER,
    K.ENV_CRASHED: Boundary.SERVER,
    K.WORKER_LOST: Boundary.SERVER,
    K.SERVER_SHUTDOWN: Boundary.SERVER,
    K.EXPIRED: Boundary.SERVER,
    K.RESUME_FAILED: Boundary.SERVER,
}

# NeMo Gym 0.7's shared names (nemo_gym/failure_kinds.py) for each kind; None where NeMo
# Gym reports no failure (a scored result, reward 0). A kind with no shared name goes out
# namespaced, as NeMo Gym's `<server>:<kind>` extension rule asks.
NEMO_GYM: dict[FailureKind, str | None] = {
    K.NO_ANSWER: None,
    K.BAD_ANSWER: None,
    K.AGENT_TIMEOUT: "agent_timeout",
    K.AGENT_CRASH: "agent_run_error",
    K.AGENT_RESOURCES: "agent_run_error",
    K.MODEL_FAILED: "transport_unreachable",
    K.HARNESS_CRASHED: "agent_request_failed",
    K.SANDBOX_FAILED: "provider_unavailable",
    K.VERIFIER_CRASHED: "verifier_error",
    K.JUDGE_UNAVAILABLE: "judge_failed",
    K.ENV_CRASHED: "palaestra:env_crashed",
    K.WORKER_LOST: "session_lost",
    K.SERVER_SHUTDOWN: "shutdown",
    K.EXPIRED: "session_expired",
    K.RESUME_FAILED: "palaestra:resume_failed",
}

# The shared failure classes of an `ok` verdict (sdk/models.py FAILURE_CLASSES) by kind; a
# family's own class is a BAD_ANSWER.
CLASS_KINDS: dict[str, FailureKind] = {
    "missing_file": K.NO_ANSWER,
    "no_answer": K.NO_ANSWER,
    "not_regular_file": K.BAD_ANSWER,
    "bad_path": K.BAD_ANSWER,
    "too_large": K.BAD_ANSWER,
    "too_deep": K.BAD_ANSWER,
    "load_error": K.BAD_ANSWER,
    "unreadable_workspace": K.BAD_ANSWER,
    "timeout": K.AGENT_TIMEOUT,
    "crash": K.AGENT_CRASH,
    "oom": K.AGENT_RESOURCES,
    "output_limit": K.AGENT_RESOURCES,
    "workspace_full": K.AGENT_RESOURCES,
    "process_limit": K.AGENT_RESOURCES,
}


def boundary_of(kind: FailureKind | str) -> Boundary:
    return BOUNDARIES[FailureKind(kind)]


def is_infrastructure(kind: FailureKind | str) -> bool:
    """Whether `kind` is a fault the policy cannot cause: the episode is void (an expired
    one keeps its own status), never scored 0, and left out of training groups."""
    return boundary_of(kind) is not Boundary.AGENT


def kind_of_class(failure_class: str) -> FailureKind:
    """The kind of an `ok` verdict's failure class (an agent kind, always)."""
    return CLASS_KINDS.get(failure_class, K.BAD_ANSWER)


def nemo_gym_name(kind: FailureKind | str) -> str | None:
    """NeMo Gym's `failure_kind` for `kind` (None: NeMo Gym scores it, no failure)."""
    return NEMO_GYM[FailureKind(kind)]


class Failure(BaseModel):
    """A failure on the wire and in the store: the kind, its boundary, and the facts of the
    occurrence. `reason` is free text (never a metric label); on a sealed split it names
    the class only, never what the verifier wrote."""

    model_config = ConfigDict(extra="forbid")

    kind: FailureKind
    boundary: Boundary
    failure_class: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="an agent kind's finer class (sdk/models.py FAILURE_CLASSES)",
    )
    exit_code: int | None = Field(default=None, description="of the process that failed")
    status: int | None = Field(
        default=None, ge=100, le=599, description="HTTP status of the endpoint that failed"
    )
    reason: str = Field(default="", max_length=2000)

    @model_validator(mode="before")
    @classmethod
    def _fill_boundary(cls, data: Any) -> Any:
        """The boundary follows from the kind; a given one must agree with it."""
        if isinstance(data, dict) and "kind" in data:
            try:
                expected = BOUNDARIES[FailureKind(data["kind"])].value
            except ValueError:
                return data  # the kind's own validation names it
            given = data.get("boundary")
            if given is None:
                return {**data, "boundary": expected}
            if str(given) != expected:
                raise ValueError(f"kind {data['kind']!r} has boundary {expected!r}, not {given!r}")
        return data

    @property
    def infrastructure(self) -> bool:
        return is_infrastructure(self.kind)

    @classmethod
    def of(
        cls,
        kind: FailureKind,
        reason: str = "",
        *,
        failure_class: str | None = None,
        exit_code: int | None = None,
        status: int | None = None,
    ) -> Failure:
        return cls(
            kind=kind,
            boundary=BOUNDARIES[kind],
            failure_class=failure_class,
            exit_code=exit_code,
            status=status,
            reason=reason[:2000],
        )

    @classmethod
    def of_class(cls, failure_class: str) -> Failure:
        """An agent failure from an `ok` verdict's class; the reason names the class only
        (a verdict's feedback may quote a sealed task's tests)."""
        return cls.of(kind_of_class(failure_class), failure_class, failure_class=failure_class)
