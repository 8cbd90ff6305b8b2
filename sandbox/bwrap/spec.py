"""What a bwrap sandbox may ask for (`check_spec`), the environment rule (`check_env`) and
which rootfs an image name gives (`resolve_image`)."""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from palaestra.sandbox.base import SandboxSpec, SandboxSpecError, check_ro_binds
from palaestra.sandbox.bwrap.host import host_cpus, host_memory_mb

# Spec bounds (check_spec); the host's RAM and CPU count bound memory_mb and cpus too.
MIN_MEMORY_MB = 16
MIN_PIDS = 4  # bwrap itself uses two: its outer process and the namespace's init
MAX_PIDS = 65536
MAX_WORKSPACE_MB = 16384  # a tmpfs: RAM (or swap), charged to whoever writes it
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_ENV_BYTES = 256 * 1024
_IMAGE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")


def check_env(env: dict[str, str] | tuple[tuple[str, str], ...], what: str = "env") -> None:
    """The environment allow-list rule; raises ValueError naming the offending variable.

    Names match ``[A-Za-z_][A-Za-z0-9_]*`` and do not start with ``LD_`` (LD_PRELOAD,
    LD_LIBRARY_PATH, LD_AUDIT…: never needed by a task, and a way to hijack the programs
    the server itself runs in the sandbox, such as a verifier's test runner); values hold
    no NUL; all of it fits in MAX_ENV_BYTES."""
    items = env.items() if isinstance(env, dict) else env
    total = 0
    for k, v in items:
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise ValueError(f"{what}: variable name {k!r} must match [A-Za-z_][A-Za-z0-9_]*")
        if k.startswith("LD_"):
            raise ValueError(f"{what}: loader variable {k} is not allowed in a sandbox")
        if not isinstance(v, str) or "\0" in v:
            raise ValueError(f"{what}: the value of {k} must be a string without NUL")
        total += len(k) + len(v) + 2
    if total > MAX_ENV_BYTES:
        raise ValueError(f"{what}: {total} bytes, over the limit of {MAX_ENV_BYTES}")


def resolve_image(image: str, images_dir: Path) -> Path:
    """The rootfs directory `image` names: a name under `images_dir`, or an absolute path
    that resolves (symlinks followed) strictly inside it. Never the host root, never a
    directory outside the operator's images dir: an image is the sandbox's whole view."""
    base = images_dir
    if image.startswith("/"):
        root = Path(image)
    elif _IMAGE_NAME.match(image):
        root = base / image / "rootfs"
    else:
        raise SandboxSpecError(
            f"image {image!r}: the bwrap backend takes a rootfs directory path or an image"
            f" name under {base} ([a-z0-9._-]), not a registry reference"
        )
    real, real_base = Path(os.path.realpath(root)), Path(os.path.realpath(base))
    if real == Path("/") or real_base == Path("/") or not real.is_relative_to(real_base):
        raise SandboxSpecError(
            f"image {image!r}: resolves to {real}, outside the images dir {base}"
            " (the images_dir setting); the bwrap backend runs only rootfs directories built"
            " there, never a host directory"
        )
    if real == real_base:
        raise SandboxSpecError(f"image {image!r}: is the images dir {base} itself, not a rootfs")
    if not root.is_dir():
        raise SandboxSpecError(f"image {image!r}: no rootfs directory at {root}")
    if not (root / "usr").is_dir():
        raise SandboxSpecError(f"image {image!r}: {root} has no usr/, not a rootfs")
    return real  # resolved: what was checked is what gets bound


def check_spec(spec: SandboxSpec, images_dir: Path) -> None:
    """Raise SandboxSpecError, naming the limit, if this host cannot give `spec`."""
    if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) == "/":
        raise SandboxSpecError(f"workdir must be an absolute path below /: {spec.workdir!r}")
    mem = host_memory_mb()
    if not MIN_MEMORY_MB <= spec.memory_mb <= mem:
        raise SandboxSpecError(
            f"memory_mb={spec.memory_mb}: must be between {MIN_MEMORY_MB} and the host's"
            f" RAM ({mem} MB)"
        )
    cpus = host_cpus()
    if not 0 < spec.cpus <= cpus:
        raise SandboxSpecError(f"cpus={spec.cpus}: must be > 0 and at most the host's {cpus}")
    if not MIN_PIDS <= spec.pids <= MAX_PIDS:
        raise SandboxSpecError(
            f"pids={spec.pids}: must be between {MIN_PIDS} (bwrap itself needs 2) and {MAX_PIDS}"
        )
    ws_max = min(MAX_WORKSPACE_MB, mem)
    if not 1 <= spec.workspace_mb <= ws_max:
        raise SandboxSpecError(
            f"workspace_mb={spec.workspace_mb}: must be between 1 and {ws_max}"
            f" (MAX_WORKSPACE_MB={MAX_WORKSPACE_MB}, host RAM {mem} MB)"
        )
    if not spec.default_timeout_s > 0:
        raise SandboxSpecError(f"default_timeout_s={spec.default_timeout_s}: must be > 0")
    try:
        check_env(spec.env, "spec.env")
    except ValueError as e:
        raise SandboxSpecError(str(e)) from e
    if spec.image is not None:
        resolve_image(spec.image, images_dir)
    check_ro_binds(spec)
