"""What every backend does before it runs a command, written once.

An exec's argv (a string runs under ``/bin/sh -c``), its whole environment (`sandbox_env`:
a fixed base, the spec's variables, the exec's own), its cwd (under the workdir), its stdin
as bytes and its timeout (the spec's default), the rlimits a command runs under, and how a
result is read back (a trailing ``MemoryError`` counts as an out-of-memory kill; -9 is the
exit code of a timed-out exec).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from palaestra.sandbox.base import SandboxSpec, command_argv, sandbox_env

# The unprivileged user every backend runs the sandboxed code as.
SANDBOX_UID = 1000
SANDBOX_GID = 1000
# A timed-out exec's exit code: we SIGKILL it, and -9 cannot be confused with a status the
# program chose (0..255).
TIMEOUT_EXIT_CODE = -9
NOFILE = 1024


@dataclass(frozen=True)
class PreparedExec:
    """One exec, resolved: what the backend runs, where, with what, for how long."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdin: bytes | None
    timeout: float


def prepare_exec(
    spec: SandboxSpec,
    workdir: str,
    cmd: list[str] | str,
    *,
    timeout: float | None,
    cwd: str | None,
    env: dict[str, str] | None,
    stdin: bytes | str | None,
) -> PreparedExec:
    """Resolve `Sandbox.exec`'s arguments the way every backend does."""
    return PreparedExec(
        argv=command_argv(cmd),
        env=sandbox_env(spec, workdir, env),
        cwd=posixpath.normpath(posixpath.join(workdir, cwd or ".")),
        stdin=stdin.encode() if isinstance(stdin, str) else stdin,
        timeout=spec.default_timeout_s if timeout is None else timeout,
    )


def rlimits(spec: SandboxSpec, *, memory_cgroup: bool) -> dict[str, int]:
    """The rlimits (bytes, or a count) of a command in a sandbox of `spec`: file size =
    workspace, no core files, NOFILE descriptors, and an address space of memory_mb only
    where no memory cgroup bounds the sandbox (an address-space limit breaks runtimes that
    reserve more than they use: the JVM, Go, some BLAS builds)."""
    limits = {"fsize": spec.workspace_mb << 20, "core": 0, "nofile": NOFILE}
    if not memory_cgroup:
        limits["as"] = spec.memory_mb << 20
    return limits


def append_capped(buf: bytearray, chunk: bytes | bytearray, max_output: int) -> bool:
    """Append to `buf` what of `chunk` fits in `max_output` bytes; True if any was dropped."""
    room = max_output - len(buf)
    if len(chunk) > room:
        if room > 0:
            buf += chunk[:room]
        return True
    buf += chunk
    return False


def memory_error(stderr: str) -> bool:
    """Whether the command's last stderr line is a Python ``MemoryError``."""
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith("MemoryError") or tail.endswith("MemoryError")
