"""What a task may name (DESIGN §5b): nothing in a published task names a host path.

A task's sandbox comes from the operator's configuration only: its `image` is one of the
server's image names (`Settings.images`), its `toolchain` one of `Settings.toolchains`,
and it binds nothing of the host. The paths a task does name are paths inside the sandbox
or inside the task (file maps), and they are plain: no `..`, no system directory, no
absolute file-map keys. These checks run when a pack is loaded (at publish and at every
start), so a bad task is refused with a message naming the pack, the task and the field
before any sandbox is made; the backends check again (`resolve_image`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from palaestra.server.config import Settings

# Keys that would name host directories to bind or mount: no family reads them from a
# task, and none may (toolchains come from the server's configuration).
HOST_KEYS = frozenset(
    {"ro_binds", "rw_binds", "binds", "bind", "mounts", "mount", "volumes", "rootfs", "devices"}
)
# File maps {relative path: text}: written into the sandbox or the verifier's copy.
FILE_MAPS = frozenset({"environment", "assets", "verifier", "solution", "files", "tests", "build"})
# Top-level sandbox directories a workdir may not be, or be under (the sandbox is built from
# them, or the kernel owns them).
SYSTEM_DIRS = frozenset(
    {
        "proc", "dev", "sys", "etc", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
        "run", "boot", "tmp", "var",
    }
)  # fmt: skip
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ENV_BYTES = 32 * 1024


@dataclass(frozen=True)
class HostPolicy:
    """The operator's configuration a task's sandbox fields must come from."""

    images: frozenset[str]
    toolchains: frozenset[str]
    # A pack's binary files (server/packs/blobs.py): one, and all together.
    max_blob_bytes: int = 64 * 1024 * 1024
    max_blobs_bytes: int = 512 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> HostPolicy:
        return cls(
            frozenset(settings.images),
            frozenset(settings.toolchains),
            settings.max_pack_blob_bytes,
            settings.max_pack_blobs_bytes,
        )

    @classmethod
    def default(cls) -> HostPolicy:
        """The defaults of Settings (a pack checked away from any server)."""
        return cls.from_settings(Settings())


def _names(values: Iterable[str]) -> str:
    return ", ".join(sorted(values)) or "(none configured)"


def check_image(value: Any, images: frozenset[str]) -> str | None:
    """Why `value` is not an image name of this server, or None."""
    if not isinstance(value, str) or value not in images:
        return (
            f"{value!r} is not an image this server has; a task names one of its images "
            f"({_names(images)}), never a path or a registry reference"
        )
    return None


def check_sandbox_dir(value: Any) -> str | None:
    """Why `value` is not a plain absolute directory inside the sandbox, or None."""
    if not isinstance(value, str) or not value.startswith("/") or value == "/":
        return f"{value!r} must be an absolute directory below / (e.g. '/work')"
    parts = value[1:].split("/")
    if any(p in ("", ".", "..") for p in parts) or posixpath.normpath(value) != value:
        return f"{value!r} must be a normalized path: no '..', '.', '//' or trailing '/'"
    bad = [p for p in parts if not _COMPONENT.match(p)]
    if bad:
        return f"{value!r}: component {bad[0]!r} must use letters, digits, '.', '_', '-'"
    if parts[0] in SYSTEM_DIRS:
        return f"{value!r} is under /{parts[0]}, which the sandbox is built from; use e.g. /work"
    return None


def check_relative(value: Any) -> str | None:
    """Why `value` is not a plain relative path (a file map key), or None."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\\" in value:
        return f"{value!r} must be a relative path inside the task"
    if any(p in ("", ".", "..") for p in value.split("/")) or "\0" in value:
        return f"{value!r} must be a plain relative path: no '..', '.', '//' or NUL"
    return None


def check_env(value: Any) -> str | None:
    """Why `value` is not a task environment ({NAME: text}, no loader variables), or None."""
    if not isinstance(value, Mapping):
        return "must be a table of NAME = 'value'"
    total = 0
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            return f"variable name {k!r} must match [A-Za-z_][A-Za-z0-9_]*"
        if k.startswith("LD_"):
            return f"loader variable {k} is not allowed in a sandbox"
        if not isinstance(v, str | int | float) or "\0" in str(v):
            return f"the value of {k} must be text without NUL"
        total += len(k) + len(str(v)) + 2
    if total > MAX_ENV_BYTES:
        return f"{total} bytes, over the limit of {MAX_ENV_BYTES}"
    return None


def _side_problems(side: str, fields: Mapping[str, Any], policy: HostPolicy) -> list[str]:
    problems: list[str] = []
    for key, value in fields.items():
        field = f"{side}.{key}"
        why: str | None = None
        if key in HOST_KEYS:
            why = (
                "a task cannot bind or mount host directories; toolchains and images come "
                "from the server's configuration (remove the field)"
            )
        elif key == "image":
            why = check_image(value, policy.images)
        elif key in ("toolchain", "toolchains"):
            chains = [value] if key == "toolchain" else value
            if not isinstance(chains, list) or not all(isinstance(c, str) for c in chains):
                why = "must name toolchains (text)"
            else:
                unknown = [c for c in chains if c not in policy.toolchains]
                if unknown:
                    why = (
                        f"{unknown[0]!r} is not a toolchain this server has "
                        f"({_names(policy.toolchains)})"
                    )
        elif key == "workdir":
            why = check_sandbox_dir(value)
        elif key == "env":
            why = check_env(value)
        elif key in FILE_MAPS and isinstance(value, Mapping):
            for rel in value:
                why = check_relative(rel)
                if why:
                    field = f"{side}.{key}[{rel!r}]"
                    break
        if why:
            problems.append(f"{field}: {why}")
    return problems


def task_field_problems(
    public: Mapping[str, Any], private: Mapping[str, Any], policy: HostPolicy
) -> list[str]:
    """Every field of a task that names the host, as 'side.field: what to fix'."""
    return _side_problems("public", public, policy) + _side_problems("private", private, policy)
