"""What a policy is (`Policy`, `Session`, `PolicyError`), and the two scripted ones: the
oracle (the task's reference solution, played server-side) and null (submits at once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from palaestra.sdk.models import Action, ResetResponse, StepResponse


class PolicyError(Exception):
    """The policy could not produce an action (endpoint unreachable, garbage reply, …)."""

    def __init__(self, message: str, error_class: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class Session(Protocol):
    """One episode's worth of a policy's state."""

    async def act(self, last: StepResponse | None) -> Action: ...

    async def aclose(self) -> None: ...


class Policy(Protocol):
    name: str

    def reset_options(self) -> dict[str, Any]: ...

    async def start(self, reset: ResetResponse) -> Session: ...


def session_usage(session: object) -> dict[str, int]:
    """Tokens a session has spent so far (`{}` for sessions that count none)."""
    usage = getattr(session, "usage", None)
    if not isinstance(usage, dict):
        return {}
    return {str(k): int(v) for k, v in usage.items() if isinstance(v, int | float)}


def attempt_seed(reset: ResetResponse) -> int:
    """The evaluator's seed for this attempt (it puts it in `reset.info["seed"]`)."""
    value = reset.info.get("seed", 0)
    return int(value) if isinstance(value, int | float) else 0


class _Scripted:
    def __init__(self, action: Action) -> None:
        self._action = action
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    async def act(self, last: StepResponse | None) -> Action:
        return self._action

    async def aclose(self) -> None:
        return None


@dataclass
class OraclePolicy:
    """Plays the task's reference solution, server-side."""

    name: str = "oracle"

    def reset_options(self) -> dict[str, Any]:
        return {"oracle": True}

    async def start(self, reset: ResetResponse) -> Session:
        return _Scripted(Action(tool="oracle"))


@dataclass
class NullPolicy:
    """Submits at once without doing anything; every verifier must give it 0."""

    name: str = "null"

    def reset_options(self) -> dict[str, Any]:
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        return _Scripted(Action(tool="submit"))
