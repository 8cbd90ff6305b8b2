"""What the bwrap backend needs of the host: bwrap itself, its RAM and CPUs, mounts, and
the runtime folders (one per server process) it reaps when their server is gone."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from palaestra.sandbox import cgroups as cgroups_mod
from palaestra.sandbox.bwrap.mounts import unmount, usr_symlinks
from palaestra.sandbox.preamble import SANDBOX_GID, SANDBOX_UID

log = logging.getLogger("palaestra.sandbox.bwrap")

_logged: set[str] = set()


def log_once(level: int, msg: str) -> None:
    """Log `msg` the first time this process sees it (a host condition, said once)."""
    if msg not in _logged:
        _logged.add(msg)
        log.log(level, msg)


def is_root() -> bool:
    return os.geteuid() == 0


def _bwrap_path() -> str | None:
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None
    )


@functools.cache
def bwrap_available() -> tuple[bool, str]:
    """Whether bwrap is installed and can create the namespaces we need (cached)."""
    path = _bwrap_path()
    if path is None:
        return False, "bwrap not found on PATH"
    argv = [path, "--ro-bind", "/usr", "/usr", *usr_symlinks(), "--unshare-all"]
    argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    argv += ["--die-with-parent", "--", "/usr/bin/true"]
    kwargs: dict[str, Any] = {}
    if is_root():
        kwargs = {"user": SANDBOX_UID, "group": SANDBOX_GID, "extra_groups": []}
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=10, check=False, cwd="/", **kwargs)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"bwrap probe failed: {e}"
    if proc.returncode != 0:
        return (
            False,
            f"bwrap probe exited {proc.returncode}: {proc.stderr.decode(errors='replace')}",
        )
    return True, path


@functools.cache
def host_memory_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // (1 << 20)


def host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def raise_nofile(want: int = 65536) -> None:
    """Lift this process's soft RLIMIT_NOFILE towards its hard limit (jails hold descriptors)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def default_runtime_base() -> Path:
    if is_root():
        return Path("/run/palaestra/sandboxes")
    return Path(tempfile.gettempdir()) / f"palaestra-{os.getuid()}" / "sandboxes"


def reap_stale(base: Path, *, cgroups: bool = False) -> int:
    """Clean up after server processes that are gone (kill -9): with `cgroups`, kill the
    processes still running in their cgroups and remove those; then unmount and remove
    their sandbox folders.

    Folders (and cgroups) are named by the pid of the server that owns them; returns how
    many sandbox folders were reaped.  (A dead server's pid reused by another process
    hides its leftovers until that process is gone too.)
    """
    if cgroups:
        try:
            removed, killed = cgroups_mod.reap_all_stale()
        except OSError as e:
            log.warning("reaping stale cgroups failed: %s", e)
        else:
            if removed or killed:
                log.warning(
                    "reaped %d cgroups of dead servers, killing %d processes", removed, killed
                )
    try:
        entries = [p for p in base.iterdir() if p.name.isdigit()]
    except OSError:
        return 0
    stale = [p for p in entries if not Path(f"/proc/{p.name}").exists()]
    if not stale:
        return 0
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        mounts = []
    for folder in stale:
        prefix = str(folder) + "/"
        for target in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            unmount(Path(target))
        shutil.rmtree(folder, ignore_errors=True)
    return len(stale)
