"""What one fork-server run receives: a `PythonRun`, sent as a sealed memfd holding a
header, the program, the files for its /work and then the program's stdin (the zygote reads
it in that order)."""

from __future__ import annotations

import fcntl
import json
import os
import posixpath
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from palaestra.sandbox.base import DEFAULT_MAX_OUTPUT, ExecResult, SandboxError, SandboxPathError

PYTHON = "/usr/bin/python3"


class ForkServerUnavailable(SandboxError):
    """The fork server cannot start here (no bwrap, no nested user namespaces…)."""


WORKDIR = "/work"


@dataclass(frozen=True)
class PythonRun:
    """One run of `python3 -I -S -c code` in a fresh sandbox whose /work holds `files` alone
    (the fork server's, or a one-shot sandbox's: `Sandboxes.run_python`)."""

    code: str
    files: Mapping[str, bytes] = field(default_factory=dict)
    stdin: bytes = b""
    timeout: float = 30.0
    max_output: int = DEFAULT_MAX_OUTPUT
    memory_mb: int = 512
    workspace_mb: int = 64


# What runs a `PythonRun` (the fork server, or a fresh sandbox): families get one as
# `EpisodeContext.sandboxes.run_python`.
PythonRunner = Callable[[PythonRun], Awaitable[ExecResult]]


def payload(code: str, files: Mapping[str, bytes], stdin: bytes) -> bytes:
    """The run's memfd: a header, the program, the files, then the program's stdin."""
    names: list[str | None] = [None]
    blobs = [code.encode("utf-8", "surrogateescape")]
    for name, data in files.items():
        names.append(check_name(name))
        blobs.append(bytes(data))
    header = json.dumps({"files": [[n, len(b)] for n, b in zip(names, blobs, strict=True)]})
    raw = header.encode()
    return b"".join([struct.pack(">I", len(raw)), raw, *blobs, stdin])


def check_name(name: str) -> str:
    norm = posixpath.normpath(name)
    if norm.startswith(WORKDIR + "/"):
        norm = norm[len(WORKDIR) + 1 :]
    if (
        "\0" in name
        or not name
        or norm.startswith("/")
        or norm in (".", "..")
        or norm.startswith("../")
    ):
        raise SandboxPathError(f"file name {name!r} must be a relative path inside {WORKDIR}")
    return norm


def sealed_memfd(data: bytes) -> int:
    fd = os.memfd_create("palaestra-run", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return fd
