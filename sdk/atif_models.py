"""ATIF (Agent Trajectory Interchange Format, Harbor's RFC 0001) as our own pydantic models,
for versions ATIF-v1.7 and ATIF-v1.8, and the check that names what a file gets wrong.

Ours, not the `atif` package's: palaestra writes and reads ATIF without that package at run
time (the tests validate what we write with it). The models follow the RFC's rules as the
package enforces them: unknown fields refused, `step_id` 1, 2, 3…, ISO 8601 timestamps,
agent-only fields (`model_name`, `reasoning_effort`, `reasoning_content`, `tool_calls`,
`metrics`) only on `source: "agent"` steps, no metrics or reasoning on an agent step with
`llm_call_count == 0`, every `source_call_id` naming one of its step's tool calls, content
parts holding text xor a source. v1.8 added audio content parts; a v1.7 file holding one is
refused. A problem is reported by its path, `steps[3].tool_calls[0].function_name: Field
required`, so a refused file says which step and field to fix.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ATIF_V17 = "ATIF-v1.7"
ATIF_V18 = "ATIF-v1.8"
VERSIONS = (ATIF_V17, ATIF_V18)
AUDIO_TYPES = frozenset(
    (
        "audio/wav",
        "audio/mpeg",
        "audio/mp4",
        "audio/aac",
        "audio/ogg",
        "audio/flac",
        "audio/webm",
        "audio/aiff",
        # the aliases the `atif` package normalizes to those
        "audio/mp3",
        "audio/mpga",
        "audio/x-mpeg",
        "audio/x-wav",
        "audio/wave",
        "audio/vnd.wave",
        "audio/x-m4a",
        "audio/m4a",
        "audio/x-aac",
        "audio/x-flac",
        "audio/x-aiff",
    )
)
IMAGE_TYPES = frozenset(("image/jpeg", "image/png", "image/gif", "image/webp"))
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
MAX_PROBLEMS = 20  # a refusal lists at most this many


class AtifModel(BaseModel):
    """Unknown fields are refused, as the RFC's schemas (and the `atif` package) do."""

    model_config = ConfigDict(extra="forbid")


class MediaSource(AtifModel):
    media_type: str
    path: str
    duration_sec: float | None = Field(default=None, ge=0)


class ContentPart(AtifModel):
    type: Literal["text", "image", "audio"]
    text: str | None = None
    source: MediaSource | None = None


class ToolCall(AtifModel):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class SubagentRef(AtifModel):
    trajectory_id: str | None = None
    trajectory_path: str | None = None
    session_id: str | None = None
    extra: dict[str, Any] | None = None


class ObservationResult(AtifModel):
    source_call_id: str | None = None
    content: str | list[ContentPart] | None = None
    subagent_trajectory_ref: list[SubagentRef] | None = None
    extra: dict[str, Any] | None = None


class AtifObservation(AtifModel):
    results: list[ObservationResult]


class Metrics(AtifModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class Step(AtifModel):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str | list[ContentPart]
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: AtifObservation | None = None
    metrics: Metrics | None = None
    extra: dict[str, Any] | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    is_copied_context: bool | None = None


class Agent(AtifModel):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(AtifModel):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = None
    extra: dict[str, Any] | None = None


class Trajectory(AtifModel):
    schema_version: str
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)  # as Harbor's own models ask
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None
    subagent_trajectories: list[Trajectory] | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The document as written: unset fields left out, as ATIF producers do."""
        return self.model_dump(mode="json", exclude_none=True)


class AtifError(ValueError):
    """A document that is not valid ATIF; `problems` name each by path and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        more = "" if len(problems) <= 3 else f" (and {len(problems) - 3} more)"
        super().__init__("; ".join(problems[:3]) + more)


def path_of(loc: tuple[int | str, ...]) -> str:
    """`('steps', 3, 'tool_calls', 0, 'function_name')` → `steps[3].tool_calls[0].function_name`;
    a union's member name (`list[ContentPart]`, `str`) is left out: it is no field."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or part in ("str", "int", "float", "bool"):
            continue
        else:
            out += f".{part}" if out else part
    return out or "(document)"


def validate(document: Any) -> Trajectory:
    """`document` (parsed JSON) as a `Trajectory`, or AtifError naming every problem."""
    if not isinstance(document, dict):
        raise AtifError(
            [f"(document): an ATIF trajectory is a JSON object, not {type(document).__name__}"]
        )
    version = document.get("schema_version")
    if version not in VERSIONS:
        raise AtifError(
            [f"schema_version: {version!r} is not one palaestra reads ({', '.join(VERSIONS)})"]
        )
    try:
        trajectory = Trajectory.model_validate(document)
    except ValidationError as exc:
        problems = [f"{path_of(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]
        raise AtifError(_first(sorted(problems + _step_ids(document), key=_order))) from None
    problems = list(_rules(trajectory, "", version))
    if problems:
        raise AtifError(_first(problems))
    return trajectory


def _step_ids(document: dict[str, Any]) -> list[str]:
    """The step id rule on the raw steps, so a file wrong in shape hears of it too."""
    steps = document.get("steps")
    out = []
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        found = step.get("step_id") if isinstance(step, dict) else None
        if type(found) is int and found != i + 1:
            out.append(
                f"steps[{i}].step_id: is {found}, expected {i + 1} (step ids count 1, 2, 3…)"
            )
    return out


def _order(problem: str) -> tuple[int, str]:
    """Problems by step, then as they came (a stable sort keeps the rest in order)."""
    head = problem.split(":", 1)[0]
    if head.startswith("steps["):
        return (int(head[6 : head.index("]")]), "")
    return (-1, "")


def _first(problems: list[str]) -> list[str]:
    """Each once (a union's members fail alike at one path), at most MAX_PROBLEMS."""
    return list(dict.fromkeys(problems))[:MAX_PROBLEMS]


def _rules(t: Trajectory, at: str, version: str) -> Any:
    """The RFC's rules beyond the shapes, each problem as `path: what`."""
    for i, step in enumerate(t.steps):
        here = f"{at}steps[{i}]"
        if step.step_id != i + 1:
            yield f"{here}.step_id: is {step.step_id}, expected {i + 1} (step ids count 1, 2, 3…)"
        if step.timestamp is not None and not _iso(step.timestamp):
            yield f"{here}.timestamp: {step.timestamp!r} is not ISO 8601"
        if step.source != "agent":
            for name in AGENT_ONLY:
                if getattr(step, name) is not None:
                    yield f"{here}.{name}: only an agent step may have it (source {step.source!r})"
        elif step.llm_call_count == 0:
            for name in ("metrics", "reasoning_content"):
                if getattr(step, name) is not None:
                    yield f"{here}.{name}: must be absent where llm_call_count is 0"
        yield from _content(step.message, f"{here}.message", version)
        calls = {c.tool_call_id for c in step.tool_calls or []}
        for j, result in enumerate(step.observation.results if step.observation else []):
            where = f"{here}.observation.results[{j}]"
            named = result.source_call_id
            if named is not None and step.tool_calls is not None and named not in calls:
                yield (
                    f"{where}.source_call_id: {result.source_call_id!r} names no "
                    f"tool call of step {step.step_id}"
                )
            if result.content is not None:
                yield from _content(result.content, f"{where}.content", version)
            for k, ref in enumerate(result.subagent_trajectory_ref or []):
                if ref.trajectory_id is None and ref.trajectory_path is None:
                    yield (
                        f"{where}.subagent_trajectory_ref[{k}]: needs trajectory_id or "
                        "trajectory_path"
                    )
    seen: set[str] = set()
    for i, sub in enumerate(t.subagent_trajectories or []):
        here = f"{at}subagent_trajectories[{i}]"
        if sub.trajectory_id is None:
            yield f"{here}.trajectory_id: an embedded subagent trajectory must set it"
        elif sub.trajectory_id in seen:
            yield f"{here}.trajectory_id: {sub.trajectory_id!r} is not unique"
        else:
            seen.add(sub.trajectory_id)
        yield from _rules(sub, f"{here}.", version)


def _content(value: str | list[ContentPart], at: str, version: str) -> Any:
    if isinstance(value, str):
        return
    for i, part in enumerate(value):
        here = f"{at}[{i}]"
        if part.type == "text":
            if part.text is None or part.source is not None:
                yield f"{here}: a text part holds `text` and no `source`"
            continue
        if part.source is None or part.text is not None:
            yield f"{here}: an {part.type} part holds a `source` and no `text`"
            continue
        if part.type == "audio" and version == ATIF_V17:
            yield f"{here}.type: audio parts came with ATIF-v1.8; this file says {version}"
        kinds = IMAGE_TYPES if part.type == "image" else AUDIO_TYPES
        if part.source.media_type.strip().lower() not in kinds:
            yield f"{here}.source.media_type: {part.source.media_type!r} is no {part.type} type"
        if part.type == "image" and part.source.duration_sec is not None:
            yield f"{here}.source.duration_sec: an image has no duration"


def _iso(value: str) -> bool:
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True
