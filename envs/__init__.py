"""palaestra.envs: the families, and everything a family author needs in one import.

    from palaestra.envs import Family, State, tool, ToolArgs, PublicFields, Observation, ...

The names are `palaestra.envs.base`'s (the family contract, with the wire models, errors,
sandbox types and judge endpoints a family names; docs/writing-a-family.md), plus the
judge verifier's helpers, loaded on first use (they cost more to import than a family that
never asks a judge should pay). Nothing here loads a sandbox backend or a server module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from palaestra.envs.base import (
    BASE_PATH,
    DEFAULT_MAX_OUTPUT,
    PYTHON,
    Action,
    AgentFault,
    Assessment,
    CheatSurface,
    EpisodeContext,
    ExecResult,
    Family,
    FamilySettings,
    InvalidActionError,
    JudgeChat,
    Judges,
    JudgeSampling,
    JudgeUnavailable,
    Limits,
    NoArgs,
    Observation,
    PrivateFields,
    PublicFields,
    PythonRun,
    Sandbox,
    SandboxError,
    Sandboxes,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    SandboxSpecError,
    ServerPaths,
    ShellSession,
    State,
    StepOutcome,
    Task,
    TaskFields,
    TaskFieldsError,
    Tool,
    ToolArgs,
    ToolSpec,
    Verdict,
    VerifierInfo,
    WorkspaceFault,
    tool,
    workspace_abspath,
    workspace_relpath,
)

if TYPE_CHECKING:
    from palaestra.verifiers.judge import (
        JudgeConfig,
        JudgedSubject,
        Rubric,
        RubricVerdict,
        Subject,
        score_rubric,
    )

# name: the module that holds it, imported when the name is first read
_LAZY = {
    name: "palaestra.verifiers.judge"
    for name in (
        "JudgeConfig",
        "JudgedSubject",
        "Rubric",
        "RubricVerdict",
        "Subject",
        "score_rubric",
    )
}

__all__ = [
    "BASE_PATH",
    "DEFAULT_MAX_OUTPUT",
    "PYTHON",
    "Action",
    "AgentFault",
    "Assessment",
    "CheatSurface",
    "EpisodeContext",
    "ExecResult",
    "Family",
    "FamilySettings",
    "InvalidActionError",
    "JudgeChat",
    "JudgeConfig",
    "JudgeSampling",
    "JudgeUnavailable",
    "JudgedSubject",
    "Judges",
    "Limits",
    "NoArgs",
    "Observation",
    "PrivateFields",
    "PublicFields",
    "PythonRun",
    "Rubric",
    "RubricVerdict",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "SandboxPathError",
    "SandboxSpec",
    "SandboxSpecError",
    "Sandboxes",
    "ServerPaths",
    "ShellSession",
    "State",
    "StepOutcome",
    "Subject",
    "Task",
    "TaskFields",
    "TaskFieldsError",
    "Tool",
    "ToolArgs",
    "ToolSpec",
    "Verdict",
    "VerifierInfo",
    "WorkspaceFault",
    "score_rubric",
    "tool",
    "workspace_abspath",
    "workspace_relpath",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
