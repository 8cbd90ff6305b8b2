"""Wire models (DESIGN §3–4): what crosses HTTP, and what the in-process client returns too."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter
from typing_extensions import TypedDict

from palaestra.sdk.failures import Failure, FailureKind
from palaestra.sdk.harness import HarnessStatus

# What no id may hold: C0/C1 control characters (NUL above all: PostgreSQL's text cannot hold
# it, SQLite's can, so the same id would answer differently by engine) and lone surrogates
# (no UTF-8: neither engine can store them).
UNSTORABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def plain_text(value: str) -> str:
    """`value` when it holds no control character or lone surrogate; ValueError otherwise,
    so an id is refused alike on every engine (422 naming the field), never stored."""
    found = UNSTORABLE.search(value)
    if found is not None:
        raise ValueError(
            f"must not contain control characters or lone surrogates ({found.group()!r} at "
            f"position {found.start()})"
        )
    return value


# An id or name a client chooses (episode ids, request ids, task refs, token names).
PlainStr = Annotated[str, AfterValidator(plain_text)]


class WireModel(BaseModel):
    """Base for wire models: unknown fields are refused, so typos surface as 422s."""

    model_config = ConfigDict(extra="forbid")


class Action(WireModel):
    """A tool call, in the OpenAI function-call shape."""

    tool: PlainStr = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Observation(WireModel):
    text: str = ""
    images: list[str] = Field(default_factory=list, description="PNG images, base64")
    data: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(WireModel):
    """A tool as the OpenAI function shape lists it; maps one to one onto MCP tools."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Limits(WireModel):
    max_steps: int = 50
    max_wall_s: float = 600.0
    max_output_bytes: int = Field(default=64 * 1024, description="per step, where it applies")
    max_step_s: float | None = Field(default=None, description="longest a step may run")
    max_episode_output_bytes: int | None = Field(
        default=None, description="output over the whole episode, where the family caps it"
    )


class ResetRequest(WireModel):
    task: PlainStr | None = Field(default=None, description='"org/name[@ver]:task_id"')
    pack: PlainStr | None = None
    split: PlainStr | None = None
    domain: PlainStr | None = None
    seed: int | None = None
    episode_id: PlainStr | None = Field(default=None, max_length=128)
    options: dict[str, Any] = Field(default_factory=dict)


class ResetResponse(WireModel):
    episode_id: str
    observation: Observation
    tools: list[ToolSpec]
    limits: Limits
    info: dict[str, Any] = Field(default_factory=dict)


class ForkRequest(WireModel):
    """`POST /v1/episodes/{id}/fork`: `episode_id` names the fork (as a reset's does; a
    retried fork with the same id answers 409 `episode_exists`, never a second fork)."""

    episode_id: PlainStr | None = Field(default=None, max_length=128)


class ForkResponse(WireModel):
    """A fork: a new live episode of the same token, its sandbox, family state and
    trajectory a copy of its parent's at `step_count` steps; the parent goes on unchanged.
    No observation: the caller has the parent's last one, which the fork starts from."""

    episode_id: str
    parent_id: str
    step_count: int
    tools: list[ToolSpec]
    limits: Limits
    info: dict[str, Any] = Field(default_factory=dict)


class RegradeRequest(WireModel):
    """`POST /v1/episodes/{id}/regrade`: verify the ended episode's kept final state with
    the same task of `pack` (`org/name@version`, or `org/name` for its newest version)."""

    pack: PlainStr = Field(min_length=3, max_length=256, pattern=r"^[^@:\s]+/[^@:\s]+(@[^:\s]+)?$")


class CheckpointResponse(WireModel):
    """A checkpoint (`POST /v1/episodes/{id}/checkpoint`): the episode's workspace, family
    state and step count kept in the store; the episode goes on. A later checkpoint of
    the same episode replaces it. What was stored is never sent back."""

    episode_id: str
    checkpoint_id: str
    step_count: int
    created_at: float
    workspace_bytes: int = 0


class ResumeResponse(WireModel):
    """A resume (`POST /v1/episodes/{id}/resume`): the episode live again in a fresh sandbox
    at its checkpoint, under the same id. Steps taken after the checkpoint are lost: the
    trajectory and step count are the checkpoint's (`resumed_at_step`), and `lost_steps`
    says how many were dropped. No observation: the caller's last one at that step is it."""

    episode_id: str
    checkpoint_id: str
    resumed_at_step: int
    lost_steps: int
    tools: list[ToolSpec]
    limits: Limits
    info: dict[str, Any] = Field(default_factory=dict)


class StepRequest(WireModel):
    action: Action
    request_id: PlainStr | None = Field(default=None, max_length=128)


class StepResponse(WireModel):
    observation: Observation
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class VerifierInfo(WireModel):
    name: str
    version: str


# Failure classes of an `ok` verdict the agent's own actions caused (DESIGN §3: reward 0,
# never void). A family may add its own; these are the shared ones (docs/reference/episodes.md).
FAILURE_CLASSES = (
    "missing_file",  # the answer file does not exist
    "not_regular_file",  # it is a directory, symlink, fifo, socket or device
    "bad_path",  # a path the agent chose escapes the workspace or goes through a symlink
    "too_large",  # a file or the workspace is over the size the verifier reads
    "too_deep",  # the workspace tree is nested deeper than the verifier walks
    "load_error",  # the answer does not load (syntax error, import error, no such function)
    "timeout",  # the agent's code ran past its time limit
    "crash",  # the agent's code ended the process that checks it
    "oom",  # the agent's code ran out of memory
    "output_limit",  # the agent's code printed more than the limit
    "no_answer",  # the episode ended with no answer submitted
    "workspace_full",  # the agent's files fill its workspace (or would, copied for the tests)
    "process_limit",  # the agent's own processes fill its sandbox's process limit
    "unreadable_workspace",  # permissions the agent set keep its workspace from being read
)


class Verdict(WireModel):
    reward: float = Field(ge=0.0, le=1.0)
    passed: bool
    status: Literal["ok", "void"] = "ok"
    failure: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="on an `ok` verdict, why the agent's attempt failed as a whole "
        "(FAILURE_CLASSES: missing_file, not_regular_file, timeout, crash, ...); None otherwise",
    )
    failure_kind: FailureKind | None = Field(
        default=None,
        description="the failure's kind (sdk/failures.py): an agent kind on an `ok` verdict "
        "with a failure class, an infrastructure kind on a `void` one; None otherwise",
    )
    components: dict[str, float] = Field(default_factory=dict)
    feedback: str = ""
    verifier: VerifierInfo
    task_digest: str = ""
    duration_s: float = 0.0


class EpisodeStatus(StrEnum):
    """`active` until the agent ends it; `done` once verified; `void` on an infrastructure fault."""

    ACTIVE = "active"
    DONE = "done"
    VOID = "void"
    CLOSED = "closed"
    EXPIRED = "expired"
    # left active by a server that stopped, with a checkpoint: `POST .../resume` continues it
    RESUMABLE = "resumable"


class StepRecord(WireModel):
    index: int
    request_id: str | None = None
    action: Action
    observation: Observation
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0
    at: float = 0.0


class _StepRecordFields(TypedDict):
    """StepRecord's fields, typed, so that its JSON is written by one typed serializer (no
    per-value type inference, no model); tests/server/test_step_storage.py keeps the text
    the same as `StepRecord.model_dump_json`."""

    index: int
    request_id: str | None
    action: Action
    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    duration_s: float
    at: float


_STEP_RECORD = TypeAdapter(_StepRecordFields).serializer


def step_record_json(
    *,
    index: int,
    request_id: str | None,
    action: Action,
    observation: Observation,
    reward: float,
    terminated: bool,
    truncated: bool,
    info: dict[str, Any],
    duration_s: float,
    at: float,
) -> str:
    """`StepRecord(...).model_dump_json()`, the same text, without building the model:
    every step of every episode is stored, and the model costs more than the step."""
    return _STEP_RECORD.to_json(
        {
            "index": index,
            "request_id": request_id,
            "action": action,
            "observation": observation,
            "reward": float(reward),
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
            "duration_s": float(duration_s),
            "at": float(at),
        }
    ).decode()


class EpisodeMetrics(WireModel):
    """Process metrics of one episode, kept by the manager for every family.

    A family reports per step in its typed `StepOutcome` (envs/base.py): `tool_ok` (did the
    tool call do what was asked: for a command, exit 0 and no timeout), `timed_out` and
    `output_bytes`; a refused (422) action counts as a failed call."""

    steps: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    invalid_actions: int = 0
    tool_success_rate: float | None = None
    timed_out: int = 0
    output_bytes: int = 0


class GroupReward(WireModel):
    """An episode's reward from a group judge (POST /v1/groups/verify), beside its verdict."""

    reward: float = Field(ge=0.0, le=1.0)
    scorer: str
    method: str
    group_digest: str


class EpisodeState(WireModel):
    episode_id: str
    task: str
    family: str
    domain: str = ""
    split: str = ""
    status: EpisodeStatus
    step_count: int
    created_at: float
    updated_at: float
    ended_at: float | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    metrics: EpisodeMetrics = Field(default_factory=EpisodeMetrics)
    void_reason: str | None = None
    failure: Failure | None = Field(
        default=None,
        description="why an ended episode failed (sdk/failures.py: kind, boundary, facts); "
        "None while active and when it ended with no failure",
    )
    verdict: Verdict | None = None
    trajectory: list[StepRecord] = Field(default_factory=list)
    harness: HarnessStatus | None = Field(
        default=None,
        description="a harness episode's harness while the server holds it (the final step "
        "record keeps how it ended)",
    )
    sealed_feedback: str | None = Field(
        default=None,
        description="admin tokens only, while the server holds the episode: a sealed "
        "verdict's own feedback (every verdict of a sealed split carries pass/fail only)",
    )
    group_reward: GroupReward | None = Field(
        default=None,
        description="the reward a group judge gave it with the other episodes of its "
        "group (POST /v1/groups/verify); `verdict` keeps its own",
    )


class ErrorBody(WireModel):
    code: str
    message: str
    retryable: bool = False


class ErrorResponse(WireModel):
    error: ErrorBody


class FamilyInfo(WireModel):
    name: str
    description: str
    tools: list[ToolSpec]
    domains: list[str] = Field(default_factory=list, description="domains of the served packs")
    error: str | None = Field(
        default=None, description="why an installed family failed to import (no tools then)"
    )


class SplitInfo(WireModel):
    name: str
    sealed: bool
    tasks: int
    draw: int | None = Field(
        default=None,
        description="a sealed generated split's held-out draw now served (0: the first); "
        "earlier draws are retired, never served again",
    )


class PackInfo(WireModel):
    name: str
    version: str
    digest: str
    description: str = ""
    license: str = ""
    families: list[str] = Field(default_factory=list)
    splits: list[SplitInfo] = Field(default_factory=list)
    versions: list[str] = Field(
        default_factory=list, description="every version of this pack the server serves"
    )
    yanked: str | None = Field(
        default=None,
        description=(
            "set when this version is yanked (withdrawn by its publisher): why it is still "
            "served (an exact pin); `name` alone resolves to the newest version not yanked"
        ),
    )


class TaskInfo(WireModel):
    """A task as discovery shows it: public fields only, whatever the split."""

    id: str = Field(description='"org/name@ver:task_id"')
    family: str
    domain: str
    split: str
    difficulty: str = ""
    public: dict[str, Any] = Field(default_factory=dict)


class TaskList(WireModel):
    tasks: list[TaskInfo]
    total: int


class SamplerDomainInfo(WireModel):
    domain: str
    weight: float = Field(description="mixture weight of the domain within its pack")
    probability: float = Field(description="chance a draw (with the report's filters) lands here")
    tasks: int
    seen: int = Field(description="tasks with a recorded outcome")
    quarantined: int


class SamplerPackInfo(WireModel):
    pack: str = Field(description='"org/name@version"')
    weight: float = Field(description="mixture weight of the pack")
    probability: float
    domains: list[SamplerDomainInfo]


class SamplerTaskInfo(WireModel):
    task: str
    domain: str
    split: str
    n: int = Field(description="verified episodes in the running window")
    passes: int = Field(description="passed episodes in the running window")
    success_rate: float = Field(description="(passes + 1) / (n + 2): Beta(1, 1) posterior mean")
    mean_reward: float | None = None
    episodes: int = Field(description="verified episodes counted since the server started")
    voids: int = Field(description="void episodes among the last void_window")
    weight: float = Field(description="curriculum weight (0 while quarantined)")
    probability: float
    quarantined: bool = False


class QuarantinedTask(WireModel):
    task: str
    reason: str
    voids: int
    since: float
    until: float | None = Field(default=None, description="released then; null: by an admin")


class SamplerReport(WireModel):
    """`GET /v1/sampler`: mixture weights, effective probabilities, success rates, quarantine."""

    curriculum: bool
    rule: str
    alpha: float
    floor: float
    window: int
    void_limit: int
    void_window: int
    quarantine_s: float
    filters: dict[str, str] = Field(default_factory=dict)
    packs: list[SamplerPackInfo]
    tasks: list[SamplerTaskInfo] = Field(description="tasks with a recorded outcome")
    tasks_seen: int
    quarantined: list[QuarantinedTask]
    unmatched_weights: list[str] = Field(
        default_factory=list, description="sampler_weights keys that match no pack or domain"
    )


class SamplerReleaseRequest(WireModel):
    task: PlainStr = Field(description='"org/name[@ver]:task_id"')


class PackYankResponse(WireModel):
    name: str
    version: str
    yanked: bool = Field(description="whether the version is yanked now")
    changed: bool = Field(description="false if it already was (or was not)")


class SamplerReleaseResponse(WireModel):
    task: str
    released: bool = Field(description="false when the task was not quarantined")


# -- publishing and tokens (`palaestra pack publish`, `palaestra token`) ---------------------
class PublishResponse(WireModel):
    name: str
    version: str
    digest: str
    created: bool


class PackEnableResponse(WireModel):
    name: str
    enabled: bool = True
    changed: bool = Field(description="false if unfiltered sampling already drew the pack")


class TokenRequest(WireModel):
    scopes: list[PlainStr]
    name: PlainStr | None = None
    orgs: list[PlainStr] = Field(default_factory=list, description="orgs a publish token may use")
    max_live: int | None = Field(default=None, ge=0, le=10**9)
    max_episodes_per_hour: int | None = Field(default=None, ge=0, le=10**9)
    max_cpu_s_per_hour: float | None = Field(default=None, ge=0, le=1e12, allow_inf_nan=False)


class TokenRecord(WireModel):
    id: str
    name: str
    scopes: list[str]
    created_at: float
    revoked: bool
    orgs: list[str] = Field(default_factory=list)
    max_live: int | None = None
    max_episodes_per_hour: int | None = None
    max_cpu_s_per_hour: float | None = None


class TokenCreated(TokenRecord):
    token: str


# -- batch routes (the trainer's hot path): many episodes in one call -----------------------
BATCH_MAX_ITEMS = 1024


class BatchResetRequest(WireModel):
    """`POST /v1/batch/reset`: each item is a `ResetRequest`; items run concurrently."""

    items: list[ResetRequest] = Field(min_length=1, max_length=BATCH_MAX_ITEMS)


class BatchItemError(WireModel):
    """Why one item failed: the error JSON of the single route, its status, its Retry-After."""

    status: int
    code: str
    message: str
    retryable: bool = False
    retry_after: float | None = None


class BatchResetResult(WireModel):
    """One item of a batch reset: `result` on success, `error` otherwise (never both)."""

    result: ResetResponse | None = None
    error: BatchItemError | None = None


class BatchResetResponse(WireModel):
    items: list[BatchResetResult] = Field(description="one per request item, in order")


class BatchStepItem(StepRequest):
    """A step request for one episode of a batch (it is a `StepRequest`, so the manager
    takes it as one)."""

    episode_id: PlainStr = Field(min_length=1, max_length=128)


class BatchStepRequest(WireModel):
    """`POST /v1/batch/step`: items of different episodes run concurrently; items of one
    episode run in the order given."""

    items: list[BatchStepItem] = Field(min_length=1, max_length=BATCH_MAX_ITEMS)
    wait_s: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "answer after this long (once at least one item has finished) even if some "
            "are still running: those answer the retryable error `still_running` and go "
            "on; resend them with the same request_id to join them and get their result "
            "(null: wait for every item)"
        ),
    )


class BatchStepResult(WireModel):
    episode_id: str
    result: StepResponse | None = None
    error: BatchItemError | None = None


class BatchStepResponse(WireModel):
    items: list[BatchStepResult] = Field(description="one per request item, in order")
