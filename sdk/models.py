"""Wire models (DESIGN §3–4): what crosses HTTP, and what the in-process client returns too."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class WireModel(BaseModel):
    """Base for wire models: unknown fields are refused, so typos surface as 422s."""

    model_config = ConfigDict(extra="forbid")


class Action(WireModel):
    """A tool call, in the OpenAI function-call shape."""

    tool: str = Field(min_length=1, max_length=128)
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
    max_output_bytes: int = 64 * 1024


class ResetRequest(WireModel):
    task: str | None = Field(default=None, description='"org/name[@ver]:task_id"')
    pack: str | None = None
    split: str | None = None
    domain: str | None = None
    seed: int | None = None
    episode_id: str | None = Field(default=None, max_length=128)
    options: dict[str, Any] = Field(default_factory=dict)


class ResetResponse(WireModel):
    episode_id: str
    observation: Observation
    tools: list[ToolSpec]
    limits: Limits
    info: dict[str, Any] = Field(default_factory=dict)


class StepRequest(WireModel):
    action: Action
    request_id: str | None = Field(default=None, max_length=128)


class StepResponse(WireModel):
    observation: Observation
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class VerifierInfo(WireModel):
    name: str
    version: str


class Verdict(WireModel):
    reward: float = Field(ge=0.0, le=1.0)
    passed: bool
    status: Literal["ok", "void"] = "ok"
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
    void_reason: str | None = None
    verdict: Verdict | None = None
    trajectory: list[StepRecord] = Field(default_factory=list)


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


class SplitInfo(WireModel):
    name: str
    sealed: bool
    tasks: int


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
    task: str = Field(description='"org/name[@ver]:task_id"')


class SamplerReleaseResponse(WireModel):
    task: str
    released: bool = Field(description="false when the task was not quarantined")
