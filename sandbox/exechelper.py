"""The bwrap backend's exec helper: one small static C program, built from this file.

Why: a bwrap exec used to be ``sh`` (joins the cgroup, sets rlimits) → ``setpriv`` (host
uid 1000) → ``bwrap`` → the command, about 0.8 ms a hop, all of it after the caller asked
for the exec.  This helper replaces the first two hops with one and lets the bwrap jail be
started *before* the command is known:

``palaestra-exec launch [--cg FILE]... [--rl NAME=N]... [--ids UID:GID] -- PROG ARGS...``
    on the host, as the server's user: write its own pid into each cgroup ``FILE`` (so
    nothing it starts ever runs outside the sandbox's cgroup), set the rlimits (both soft
    and hard; NAME is fsize, core, nofile or as), drop to ``UID:GID`` with no supplementary
    groups, then exec ``PROG`` (bwrap).  Any failure exits 125 with a message on stderr.

``palaestra-exec stub FD``
    inside the jail (bwrap's command, already uid 1000, no capabilities, seccomp filter and
    rlimits applied): write one byte ``R`` to the socket ``FD`` (ready), read one request
    (its header carries, by SCM_RIGHTS, the command's stdout and stderr pipes, and its stdin
    pipe unless stdin is /dev/null: bwrap itself never holds them), write ``S`` (taken:
    whatever happens next is the command's outcome, so the host retries only a jail that
    died before this), put those pipes on 0/1/2, close ``FD`` and every other descriptor
    above 2, then become the command: ``chdir``, a fresh environment, ``execvp``.  A failed
    ``chdir`` exits 1 ("can't chdir"), a failed exec 127 (126 for an argument list too
    long), as a shell would; those are data, not faults.  If the socket closes without a
    request, it exits 0.

Request: ``PXR1``, a 4-byte little-endian body length, then NUL-terminated fields:
``stdin_null("0"|"1")``, ``cwd``, ``envc``, envc ``NAME=VALUE``, ``argc``, argc arguments.

The C source is ``palaestra/sandbox/programs/exec_helper.c``.  The binary is compiled
once (``cc -O2 -static``) into a root-only cache folder (``<cache>/helpers``) named by
the source's hash and copied into each backend's runtime folder; where no C compiler (or
no static libc) is found, `helper_binary` says why and the backend keeps the old launcher.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import shutil
import socket
import struct
import subprocess
import tempfile
from pathlib import Path

from palaestra.sandbox import programs

MAGIC = b"PXR1"
# Where the helper is bound, read-only, inside every jail.
INSIDE_PATH = "/.palaestra/exec"
LAUNCH_FAILED = 125

C_SOURCE = programs.text("exec_helper.c")


def source_tag() -> str:
    return hashlib.sha256(C_SOURCE.encode()).hexdigest()[:16]


def helpers_dir(cache: Path) -> Path:
    """Where the helper is built, under the operator's cache folder `cache`."""
    return cache / "helpers"


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@functools.cache
def helper_binary(cache: Path) -> tuple[Path | None, str]:
    """The helper built under `cache` (compiling it on first use) and "", or None and why
    not (cached)."""
    dest = helpers_dir(cache) / f"palaestra-exec-{source_tag()}"
    if dest.exists() and _trusted(dest) and _usable(dest):
        return dest, ""
    if dest.parent.exists() and not _trusted(dest.parent):
        # Someone else could swap what we would run as root: build a private copy instead.
        dest = Path(tempfile.mkdtemp(prefix="palaestra-helper-")) / dest.name
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc, clang) to build the exec helper"
    try:
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            src = Path(tmp) / "palaestra_exec.c"
            src.write_text(C_SOURCE)
            out = Path(tmp) / "palaestra-exec"
            argv = [cc, "-O2", "-static", "-o", str(out), str(src)]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            if proc.returncode != 0:
                return None, f"building the exec helper failed: {proc.stderr.strip()[-500:]}"
            os.chmod(out, 0o755)
            os.replace(out, dest)  # atomic: a concurrent build wins or loses whole
        for old in dest.parent.glob("palaestra-exec-*"):  # earlier versions' builds
            if old != dest:
                with contextlib.suppress(OSError):
                    old.unlink()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building the exec helper failed: {e}"
    if not _usable(dest):
        return None, f"the exec helper at {dest} does not run"
    return dest, ""


def _trusted(path: Path) -> bool:
    """Whether only we (or root) can change `path` and the folder holding it: the helper
    runs as the server's user, root included."""
    for p in (path, path.parent):
        try:
            st = os.stat(p, follow_symlinks=False)
        except OSError:
            return False
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return False
    return True


def _usable(path: Path) -> bool:
    try:
        proc = subprocess.run([str(path)], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 2 and b"usage: palaestra-exec" in proc.stderr


def install(dest_dir: Path, cache: Path) -> Path | None:
    """A root-owned copy of the helper (built under `cache`) in `dest_dir` (reachable by the
    sandbox uid, which bwrap needs to bind it); None when there is no helper."""
    src, _ = helper_binary(cache)
    if src is None:
        return None
    dest = dest_dir / src.name
    if dest.exists() and _trusted(dest):
        return dest
    dest_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    tmp = dest_dir / f"{src.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest


def send(ctl: socket.socket, req: bytes, fds: list[int]) -> bytes:
    """Send a request's header with the command's stdio `fds`; returns what is left to send."""
    sent = socket.send_fds(ctl, [req[:8]], fds)
    return req[sent:]


def request(cwd: str, env: dict[str, str], argv: list[str], stdin_null: bool) -> bytes:
    """One exec request for a stub (see the module docstring)."""
    if any("\0" in a for a in argv) or "\0" in cwd:
        raise ValueError("embedded null byte in the command or cwd")
    fields = ["1" if stdin_null else "0", cwd, str(len(env))]
    fields += [f"{k}={v}" for k, v in env.items()]
    fields += [str(len(argv)), *argv]
    body = b"".join(os.fsencode(f) + b"\0" for f in fields)
    return MAGIC + struct.pack("<I", len(body)) + body


__all__ = ["INSIDE_PATH", "LAUNCH_FAILED", "helper_binary", "install", "request"]
