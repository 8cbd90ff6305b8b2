"""One attempt's record (`Attempt`), the limits it is held to, and its stored observation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from palaestra.sdk.models import Observation

OBSERVATION_CHARS = 8000  # an observation's text kept in a stored trajectory


@dataclass(frozen=True)
class AttemptLimits:
    """Per-attempt limits; 0 tokens means no token limit."""

    max_steps: int = 30
    max_tokens: int = 0
    max_wall_s: float = 600.0

    @property
    def hard_timeout_s(self) -> float:
        """The client's own deadline: the server truncates at max_wall_s; this catches a
        policy that hangs between steps."""
        return self.max_wall_s + min(30.0, max(1.0, self.max_wall_s / 4))


@dataclass
class Attempt:
    task: str
    family: str
    domain: str
    difficulty: str
    attempt: int
    seed: int
    episode_id: str = ""
    task_digest: str = ""
    status: str = "ok"  # ok | void | error
    reward: float = 0.0
    passed: bool = False
    error_class: str = ""
    error: str = ""
    stop: str = ""  # terminated | truncated | timeout | token_limit | error | void
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tokens_prompt: int = 0
    tokens_completion: int = 0
    duration_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # reset_s policy_s env_s verify_s
    feedback: str = ""
    components: dict[str, float] = field(default_factory=dict)
    verifier: dict[str, str] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)  # the server's metrics, if any
    options: dict[str, Any] = field(default_factory=dict)  # the reset options (for replay)
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    finished_at: float = 0.0
    regraded: dict[str, Any] = field(default_factory=dict)  # set by `eval report`, not stored
    draw: int | None = None  # the held-out draw of a sealed generated task (server/draws.py)

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.attempt)

    @property
    def tokens(self) -> int:
        return self.tokens_prompt + self.tokens_completion

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        """Tolerant of fields added later (ignored) and missing ones (defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


ProgressCallback = Callable[[Attempt], None]


def observation_json(observation: Observation) -> dict[str, Any]:
    """An observation as a stored trajectory keeps it: the text cut to OBSERVATION_CHARS."""
    text = observation.text
    if len(text) > OBSERVATION_CHARS:
        text = text[:OBSERVATION_CHARS] + f"\n[… {len(observation.text) - OBSERVATION_CHARS} chars]"
    return {"text": text, "images": len(observation.images)}
