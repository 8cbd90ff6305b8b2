"""What every adversarial test shares: the backends, the attack spec and the containment checks.

An attack is contained when, besides its own expectation:

* no host process carries its marker once `exec` returned (DESIGN §5: an exec returns only
  when every process it started is dead), and the server side reaped what it started;
* a neighbouring sandbox, created before the attack, still runs `echo ok` quickly;
* the attacked sandbox itself still runs `echo ok` (nothing it did breaks later execs);
* the server side (this test process) is fine: its event loop never stalled, its memory did
  not balloon, and none of its secrets showed in the sandbox's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import resource
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from palaestra.sandbox.base import Backend, ExecResult, Sandbox, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sandbox.bwrap.launch import cgroup_manager

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("bwrap", "docker")
# Small limits, so an attack reaches them fast; the checks below are written against them.
ATTACK_SPEC = SandboxSpec(workspace_mb=16, memory_mb=256, pids=64, default_timeout_s=10.0)
SECRET_NAME = "PALAESTRA_ADVERSARIAL_SECRET"

# Reasons for the marks, one per missing defence (so they can be removed when it lands).
NEEDS_PIDS = "needs cgroup pids limit (sandbox hardening in progress)"
NEEDS_MEMORY = "needs cgroup memory limit (sandbox hardening in progress)"
NEEDS_DEV_LIMIT = (
    "/dev and /dev/shm are bwrap's --dev tmpfs with no size limit (half of host RAM): "
    "needs the cgroup memory limit (which charges tmpfs pages) or a size-limited /dev/shm"
)
NEEDS_TMP_INODES = (
    "/tmp is bwrap's --tmpfs: --size caps bytes, not inodes: needs the cgroup memory limit "
    "(which charges inodes and dentries) or an nr_inodes limit"
)


@functools.cache
def bwrap_cgroups() -> bool:
    """Whether the bwrap backend puts each sandbox in a cgroup here (memory + pids limits)."""
    manager, _ = cgroup_manager()
    return manager is not None


def unless_cgroups(reason: str) -> dict[str, str]:
    """An xfail for bwrap where its sandboxes get no cgroup (not root, none mounted)."""
    return {} if bwrap_cgroups() else {"bwrap": reason}


def _run(argv: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@functools.cache
def backend_unavailable(name: str) -> str | None:
    """Why the backend cannot run here (None: it can). Cached for the session."""
    if name == "bwrap":
        ok, why = bwrap_available()
        return None if ok else f"bwrap unusable: {why}"
    if name == "docker":
        try:
            mod = importlib.import_module("palaestra.sandbox.docker")
            cls = mod.DockerBackend
        except Exception as e:  # the module is written by another helper; absent is a skip
            return f"palaestra.sandbox.docker.DockerBackend not importable: {e!r}"
        probe = getattr(cls, "available", None)
        if callable(probe):
            try:
                res = probe()
            except Exception as e:
                return f"docker engine unavailable: {e!r}"
            if isinstance(res, tuple):
                return None if res[0] else f"docker engine unavailable: {res[1]}"
            if not res:
                return "docker engine unavailable: DockerBackend.available() is false"
            return None
        try:
            info = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
        except (OSError, subprocess.SubprocessError) as e:
            return f"docker engine unavailable: {e!r}"
        if info.returncode != 0:
            lines = (info.stderr or info.stdout).strip().splitlines() or ["docker info failed"]
            return f"docker engine unavailable: {lines[-1]}"
        return None
    return f"unknown backend {name}"


def make_backend(name: str) -> Backend:
    reason = backend_unavailable(name)
    if reason is not None:
        pytest.skip(reason)
    if name == "bwrap":
        return BwrapBackend()
    mod = importlib.import_module("palaestra.sandbox.docker")
    backend: Backend = mod.DockerBackend()
    return backend


def on_backends(xfail: dict[str, str] | None = None) -> list[Any]:
    """pytest params, one per backend, with an xfail(strict=False) where a defence is missing."""
    xfail = xfail or {}
    out = []
    for name in BACKENDS:
        marks = [pytest.mark.xfail(strict=False, reason=xfail[name])] if name in xfail else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def cases(items: Iterable[Any]) -> list[Any]:
    """(backend, item) params for a table whose items carry `.name` and `.xfail`."""
    out = []
    for item in items:
        for name in BACKENDS:
            reason = item.xfail.get(name)
            marks = [pytest.mark.xfail(strict=False, reason=reason)] if reason else []
            out.append(pytest.param(name, item, marks=marks, id=f"{name}-{item.name}"))
    return out


def new_marker() -> str:
    """Eight digits, so it also fits in a `sleep 99<marker>` argument that pgrep -f finds."""
    return f"77{secrets.randbelow(10**6):06d}"


def host_processes(marker: str) -> list[str]:
    """Host processes whose command line holds `marker` (pgrep never lists itself)."""
    found = _run(["pgrep", "-a", "-f", marker])
    return [line for line in found.stdout.splitlines() if line.strip()]


def our_zombies() -> list[int]:
    """Zombies whose parent is this process (the server side failing to reap an exec)."""
    me, out = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and fields[1] == me:
            out.append(int(entry))
    return out


async def settle_zombies(deadline_s: float = 1.0) -> list[int]:
    """Our zombies left after the child watcher had `deadline_s` to reap them."""
    end = time.monotonic() + deadline_s
    while (left := our_zombies()) and time.monotonic() < end:
        await asyncio.sleep(0.02)
    return left


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class LoopWatch:
    """Measures how long this event loop stalls (a blocking call in the server path)."""

    def __init__(self, tick: float = 0.02) -> None:
        self.tick = tick
        self.max_lag = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(self.tick)
            self.max_lag = max(self.max_lag, time.monotonic() - t - self.tick)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class Guard:
    """The containment checks around one attack (see the module docstring)."""

    backend_name: str
    box: Sandbox
    neighbour: Sandbox
    marker: str
    secret: str
    watch: LoopWatch = field(default_factory=LoopWatch)
    rss_before: float = 0.0
    maxrss_before: int = 0

    def start(self) -> None:
        self.rss_before = rss_mb()
        self.maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.watch.start()

    async def check(self, *outputs: str, box_usable: bool = True) -> None:
        await self.watch.stop()
        leftovers = host_processes(self.marker)
        assert not leftovers, f"processes outlived the exec: {leftovers}"
        for text in outputs:
            assert self.secret not in text, "a server secret leaked into the sandbox output"
        assert not await settle_zombies(), "the server side left zombies"
        t0 = time.monotonic()
        r = await self.neighbour.exec("echo ok", timeout=10)
        took = time.monotonic() - t0
        assert r.stdout == "ok\n" and r.exit_code == 0, f"neighbour broken: {r}"
        assert took < 3.0, f"neighbour slow after the attack: {took:.2f} s"
        if box_usable:
            r = await self.box.exec("echo ok", timeout=10)
            assert r.stdout == "ok\n" and r.exit_code == 0, f"attacked sandbox unusable: {r}"
        assert self.watch.max_lag < 1.0, f"server event loop stalled {self.watch.max_lag:.2f} s"
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.maxrss_before) / 1024
        assert grew < 256, f"server memory grew by {grew:.0f} MB"
        assert _run(["true"]).returncode == 0, "the host cannot start a process"


def check_result(r: ExecResult, max_output: int) -> None:
    """What holds for every exec result, whatever the attack."""
    assert len(r.stdout) <= max_output and len(r.stderr) <= max_output, "output cap exceeded"


@contextlib.asynccontextmanager
async def sandbox(backend: Backend, spec: SandboxSpec = ATTACK_SPEC) -> AsyncIterator[Sandbox]:
    box = await backend.create(spec)
    try:
        yield box
    finally:
        await box.close()
