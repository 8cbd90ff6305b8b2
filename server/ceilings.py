"""Operator ceilings (DESIGN §5b): every limit a client or a task asks for is checked here.

A limit is a JSON number (never a string or a bool), finite, positive, whole where it counts
things, and at most the operator's ceiling in Settings (`ceiling_*`). Anything else is a 422
that names the limit, the value and the ceiling, so a client learns what to send and no odd
number (NaN, infinity, 10**400) reaches `int()`, a sandbox or a timer as a 500.

Three places ask: a reset's `options` (the client), a task's own fields (the pack author:
`memory_mb`, `pids`, `workspace_mb`, timeouts, in `public` or `private`) and every sandbox
spec a family builds (defence in depth: the spec is what reaches the backend).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from palaestra.sandbox import SandboxSpec
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Limits
from palaestra.sdk.task import Task
from palaestra.server.config import Settings


@dataclass(frozen=True)
class LimitRule:
    ceiling: str  # the Settings field that caps it
    whole: bool  # counts things (steps, bytes, pids): an integer


# Reset options a client may set, and what caps each (families read their own from options).
OPTION_LIMITS: dict[str, LimitRule] = {
    "max_steps": LimitRule("ceiling_steps", True),
    "max_wall_s": LimitRule("ceiling_wall_s", False),
    "step_timeout_s": LimitRule("ceiling_step_timeout_s", False),
    "max_output_bytes": LimitRule("ceiling_output_bytes", True),
    "max_episode_output_bytes": LimitRule("ceiling_episode_output_bytes", True),
}
# Task fields (top level of `public` or `private`) that size a sandbox or a timer.
TASK_LIMITS: dict[str, LimitRule] = {
    "memory_mb": LimitRule("ceiling_memory_mb", True),
    "cpus": LimitRule("ceiling_cpus", False),
    "pids": LimitRule("ceiling_pids", True),
    "workspace_mb": LimitRule("ceiling_workspace_mb", True),
    "timeout_s": LimitRule("ceiling_task_timeout_s", False),
    "setup_timeout_s": LimitRule("ceiling_task_timeout_s", False),
    "verifier_timeout_s": LimitRule("ceiling_task_timeout_s", False),
    "agent_timeout_s": LimitRule("ceiling_wall_s", False),
}


def check_limit(name: str, value: Any, rule: LimitRule, settings: Settings, fix: str) -> float:
    """`value` as a number within its ceiling, or InvalidActionError (422) naming `name`."""
    ceiling = getattr(settings, rule.ceiling)
    env = f"PALAESTRA_{rule.ceiling.upper()}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidActionError(
            f"{name} must be a JSON number, got {type(value).__name__} {_show(value)}; {fix}",
            code="invalid_limit",
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidActionError(
            f"{name} must be a finite number, got {value}; {fix}", code="invalid_limit"
        )
    if value <= 0:
        raise InvalidActionError(
            f"{name} must be positive, got {_show(value)}; {fix}", code="invalid_limit"
        )
    if rule.whole and value != int(value):
        raise InvalidActionError(
            f"{name} must be a whole number, got {_show(value)}; {fix}", code="invalid_limit"
        )
    if value > ceiling:
        raise InvalidActionError(
            f"{name}={_show(value)} is over this server's ceiling {rule.ceiling}={ceiling:g}; "
            f"{fix} (at most {ceiling:g}), or ask the operator to raise {env}",
            code="limit_over_ceiling",
        )
    return float(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def client_limits(options: dict[str, Any], settings: Settings) -> Limits:
    """The episode's limits from a reset's `options`, every limit option checked."""
    checked: dict[str, float] = {}
    for key, rule in OPTION_LIMITS.items():
        if key in options:
            checked[key] = check_limit(
                f"options.{key}", options[key], rule, settings, "send a smaller positive number"
            )
    return Limits(
        max_steps=int(checked.get("max_steps", settings.max_steps)),
        max_wall_s=checked.get("max_wall_s", settings.max_wall_s),
    )


def check_task(task: Task, settings: Settings) -> None:
    """A task's own limit fields (a pack author's), before any family reads them."""
    for side, fields in (("public", task.public), ("private", task.private)):
        for key, rule in TASK_LIMITS.items():
            if key in fields:
                check_limit(
                    f"task {task.ref}: {side}.{key}",
                    fields[key],
                    rule,
                    settings,
                    f"fix the task's {key}",
                )


def check_spec(spec: SandboxSpec, settings: Settings, where: str) -> None:
    """A sandbox spec a family built, before it reaches the backend."""
    for key in ("memory_mb", "cpus", "pids", "workspace_mb"):
        check_limit(
            f"{where}: sandbox {key}",
            getattr(spec, key),
            TASK_LIMITS[key],
            settings,
            f"lower the task's {key}",
        )
    check_limit(
        f"{where}: sandbox default_timeout_s",
        spec.default_timeout_s,
        TASK_LIMITS["timeout_s"],
        settings,
        "lower the task's timeout",
    )
