"""palaestra.sandbox: the sandbox interface and its backends (DESIGN §5)."""

from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    AgentFault,
    Backend,
    ExecResult,
    Sandbox,
    SandboxCreateError,
    SandboxError,
    SandboxFileTooLarge,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    SandboxSpecError,
    SandboxTreeTooDeep,
    ShellResult,
    ShellSession,
    WorkspaceFault,
)

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "AgentFault",
    "Backend",
    "ExecResult",
    "Sandbox",
    "SandboxCreateError",
    "SandboxError",
    "SandboxFileTooLarge",
    "SandboxGone",
    "SandboxPathError",
    "SandboxSpec",
    "SandboxSpecError",
    "SandboxTreeTooDeep",
    "ShellResult",
    "ShellSession",
    "WorkspaceFault",
]
