"""1,000 bwrap sandboxes created, used once and closed: nothing may accumulate.

Leaks it looks for: host processes (the exec's setpriv/prlimit/bwrap chain, found by the
runtime dir on their command lines), children of this process (unreaped zombies included),
file descriptors of this process, mounts under the runtime dir, per-sandbox cgroups (when a
``/sys/fs/cgroup/*/palaestra*`` hierarchy exists), and folders under the runtime dir.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sandbox.bwrap.host import default_runtime_base

_OK, _WHY = bwrap_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")]

CYCLES = 1000


def _mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:  # field 4, after the comm "(...)"
            out.append(int(entry))
    return out


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _cgroup_dirs(ids: set[str]) -> list[str]:
    """Cgroup folders below any palaestra hierarchy whose name holds one of `ids`."""
    found = []
    roots = [*Path("/sys/fs/cgroup").glob("*palaestra*")]
    roots += Path("/sys/fs/cgroup").glob("*/palaestra*")
    for root in roots:
        # os.walk skips folders that vanish under it (other servers' sandboxes come and go)
        for top, dirs, _ in os.walk(root):
            found += [os.path.join(top, d) for d in dirs if any(i in d for i in ids)]
    return found


async def test_soak_create_exec_close() -> None:
    runtime = default_runtime_base() / str(os.getpid()) / f"soak-{secrets.token_hex(4)}"
    backend = BwrapBackend(runtime)
    spec = SandboxSpec(workspace_mb=8)
    ids: set[str] = set()
    # One warm-up cycle, so lazily created state (the /etc folder, asyncio's child watcher)
    # is not counted as a leak.
    async with await backend.create(spec) as box:
        assert (await box.exec(["true"])).ok
        cgroup = getattr(box, "cgroup", None)
    fds0, children0 = _fds(), _children()
    t0 = time.monotonic()
    for i in range(CYCLES):
        box = await backend.create(spec)
        ids.add(box.id)
        r = await box.exec(["echo", str(i)], timeout=10)
        assert r.ok and r.stdout == f"{i}\n", r
        await box.close()
    elapsed = time.monotonic() - t0
    print(f"\nsoak: {CYCLES} create/exec/close cycles in {elapsed:.1f} s (cgroup: {cgroup})")
    await asyncio.sleep(0.1)  # let the child watcher reap the last exec's processes
    try:
        assert backend.live_count == 0
        procs = subprocess.run(
            ["pgrep", "-a", "-f", str(runtime)], capture_output=True, text=True, check=False
        ).stdout
        assert procs == "", f"leaked processes: {procs}"
        assert _children() == children0, "leaked (or unreaped) child processes"
        assert _fds() == fds0, f"leaked file descriptors: {_fds() - fds0}"
        assert _mounts_under(str(runtime) + "/") == [], "leaked mounts"
        assert _cgroup_dirs(ids) == [], "leaked cgroups"
        left = sorted(p.name for p in runtime.iterdir()) if runtime.exists() else []
        assert all(not any(i in name for i in ids) for name in left), f"leaked folders: {left}"
        # the /etc folder and the exec helper's copy are the backend's, shared by its sandboxes
        shared = ("etc-", "palaestra-exec-")
        assert all(name.startswith(shared) for name in left), f"unexpected entries: {left}"
    finally:
        await backend.aclose()
        shutil.rmtree(runtime, ignore_errors=True)
