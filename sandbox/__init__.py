"""palaestra.sandbox: the sandbox interface and its backends (DESIGN §5)."""

from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    Backend,
    ExecResult,
    Sandbox,
    SandboxCreateError,
    SandboxDeadError,
    SandboxError,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    SandboxSpecError,
    ShellResult,
    ShellSession,
)

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "Backend",
    "ExecResult",
    "Sandbox",
    "SandboxCreateError",
    "SandboxDeadError",
    "SandboxError",
    "SandboxGone",
    "SandboxPathError",
    "SandboxSpec",
    "SandboxSpecError",
    "ShellResult",
    "ShellSession",
]
