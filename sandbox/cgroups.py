"""One cgroup per sandbox: memory, pids and CPU limits, exact OOM reports, reliable kill.

Layout: ``<hierarchy>/palaestra/<server pid>/<sandbox id>``, in every hierarchy used
(cgroup v2: the one unified hierarchy; cgroup v1: the ``memory``, ``pids`` and, when
mounted, ``cpu`` hierarchies).  The per-server-pid level lets a new server find the
cgroups of a dead one (`CgroupManager.reap_stale`), kill what still runs there and remove them.

* v2: ``memory.max`` (+ ``memory.swap.max = 0``), ``pids.max``, ``cpu.max``; kill with
  ``cgroup.kill`` (5.14+, else SIGKILL per pid until empty); OOM kills counted by
  ``memory.events`` ``oom_kill``.  The controllers are enabled in ``cgroup.subtree_control``
  of every level; that fails (EBUSY) where the level above ``palaestra`` holds processes
  and is not the root (the no-internal-processes rule) -- then cgroups are reported
  unavailable, never half-used.
* v1: ``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes`` where swap accounting
  exists), ``pids.max``, ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; kill by SIGKILLing
  every pid in ``cgroup.procs`` until it stays empty (``pids.max`` bounds a fork bomb's
  growth, so this converges); OOM kills counted by ``memory.oom_control`` ``oom_kill``
  (4.13+).

`detect()` prefers v2 when the unified hierarchy has the memory and pids controllers
(pure v2 or a hybrid host that moved them there), else v1; it proves the choice by
creating this server's folder and a probe cgroup with limits.  When neither works it
returns ``None`` and the reason; callers degrade to rlimits and say so.

Joining a cgroup is the caller's job (`Cgroup.procs_files` are the files to write a pid
into); the bwrap backend does it from a shell that writes its own pid and then execs the
sandbox, so nothing it starts ever runs outside the cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger("palaestra.sandbox.cgroups")

PARENT = "palaestra"
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu")


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_procs(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def _counter(path: Path, key: str) -> int:
    """The value of ``key N`` in a flat-keyed cgroup file (0 when absent)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class Cgroup:
    """One sandbox's cgroup (one folder per hierarchy used)."""

    name: str
    version: Literal[1, 2]
    dirs: list[Path]  # v1: memory first; v2: one
    memory_dir: Path
    _removed: bool = field(default=False, repr=False)

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def exists(self) -> bool:
        return all(d.is_dir() for d in self.dirs)

    def add(self, pid: int) -> None:
        for f in self.procs_files:
            _write(f, str(pid))

    def procs(self) -> list[int]:
        seen: set[int] = set()
        for f in self.procs_files:
            seen.update(_read_procs(f))
        return sorted(seen)

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this cgroup so far."""
        if self.version == 2:
            return _counter(self.memory_dir / "memory.events", "oom_kill")
        return _counter(self.memory_dir / "memory.oom_control", "oom_kill")

    def oom_killed(self) -> bool:
        return self.oom_kills() > 0

    def pids_exhausted(self) -> bool:
        """Whether a fork here failed at ``pids.max`` and the processes in it still fill
        most of it: a fork bomb of the sandbox's own, not a fault of ours."""
        for d in self.dirs:
            try:
                limit = (d / "pids.max").read_text().strip()
                current = int((d / "pids.current").read_text())
            except (OSError, ValueError):
                continue
            if limit == "max":
                return False
            return _counter(d / "pids.events", "max") > 0 and current * 4 >= int(limit) * 3
        return False

    def cpu_seconds(self) -> float | None:
        """CPU time used in this cgroup so far: v2 ``cpu.stat`` usage_usec, v1
        ``cpuacct.usage`` where cpuacct shares a hierarchy used here; None without one."""
        if self.version == 2:
            path = self.dirs[0] / "cpu.stat"
            return _counter(path, "usage_usec") / 1e6 if path.exists() else None
        for d in self.dirs:
            try:
                return int((d / "cpuacct.usage").read_text()) / 1e9
            except (OSError, ValueError):
                continue
        return None

    def kill_all(self, timeout: float = 2.0) -> bool:
        """SIGKILL every process in the cgroup; True once none is left."""
        if self.version == 2:
            kill = self.dirs[0] / "cgroup.kill"
            with contextlib.suppress(OSError):
                _write(kill, "1")
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            pids = self.procs()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def remove(self, timeout: float = 2.0) -> bool:
        """Kill what runs in it and remove its folders; True when all are gone."""
        if self._removed:
            return True
        self.kill_all(timeout)
        ok = all(_rmdir(d, timeout) for d in self.dirs)
        self._removed = ok
        return ok


def _rmdir(d: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(d)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s", d, e)
                return False
            time.sleep(0.005)


def _cgroup_mounts() -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount and the v1 mounts by controller, from /proc/self/mounts."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        target, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(target)
        elif fstype == "cgroup":
            for ctl in V1_CONTROLLERS:
                if ctl in opts and ctl not in v1:
                    v1[ctl] = Path(target)
    return v2, v1


class CgroupManager:
    """This server process's cgroups: ``<hierarchy>/palaestra/<pid>/`` in each hierarchy."""

    def __init__(self, version: Literal[1, 2], roots: dict[str, Path], pid: int | None = None):
        # roots: controller ("unified" for v2) -> hierarchy mount point
        self.version: Literal[1, 2] = version
        self.roots = roots
        self.pid = os.getpid() if pid is None else pid
        self.has_cpu = version == 2 or "cpu" in roots

    def __repr__(self) -> str:
        return f"CgroupManager(v{self.version}, {self.describe()})"

    def describe(self) -> str:
        where = ", ".join(str(self._parent(r)) for r in self.roots.values())
        ctls = "memory, pids" + (", cpu" if self.has_cpu else "")
        return f"cgroup v{self.version} ({ctls}) under {where}"

    @staticmethod
    def _parent(root: Path) -> Path:
        return root / PARENT

    def server_dirs(self) -> list[Path]:
        return [self._parent(r) / str(self.pid) for r in self.roots.values()]

    def _ensure_parents(self) -> None:
        for root in self.roots.values():
            parent = self._parent(root)
            if self.version == 2:
                self._enable_controllers(root)
                parent.mkdir(exist_ok=True)
                self._enable_controllers(parent)
                (parent / str(self.pid)).mkdir(exist_ok=True)
                self._enable_controllers(parent / str(self.pid))
            else:
                (parent / str(self.pid)).mkdir(parents=True, exist_ok=True)

    def _enable_controllers(self, d: Path) -> None:
        have = set((d / "cgroup.controllers").read_text().split())
        on = set((d / "cgroup.subtree_control").read_text().split())
        want = {"memory", "pids"} | ({"cpu"} & have)
        missing = want - on
        if missing:
            _write(d / "cgroup.subtree_control", " ".join("+" + c for c in sorted(missing)))

    def create(
        self, name: str, memory_bytes: int, pids_max: int, cpu_quota: float | None
    ) -> Cgroup:
        """A new cgroup with these limits (cpu_quota in CPUs, None: unlimited). Raises OSError."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad cgroup name {name!r}")
        self._ensure_parents()
        if self.version == 2:
            d = self._parent(self.roots["unified"]) / str(self.pid) / name
            cg = Cgroup(name, 2, [d], d)
        else:
            dirs = [self._parent(self.roots[c]) / str(self.pid) / name for c in self.roots]
            cg = Cgroup(name, 1, dirs, dirs[0])
        made: list[Path] = []
        try:
            for d in cg.dirs:
                d.mkdir()
                made.append(d)
            self._limit(cg, memory_bytes, pids_max, cpu_quota)
        except BaseException:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        return cg

    def _limit(self, cg: Cgroup, memory_bytes: int, pids_max: int, cpu_quota: float | None) -> None:
        if self.version == 2:
            d = cg.dirs[0]
            _write(d / "memory.max", str(memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(pids_max))
            if cpu_quota is not None and (d / "cpu.max").exists():
                quota = max(1000, int(cpu_quota * CPU_PERIOD_US))
                _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            return
        by_ctl = dict(zip(self.roots, cg.dirs, strict=True))
        mem = by_ctl["memory"]
        _write(mem / "memory.limit_in_bytes", str(memory_bytes))
        if (mem / "memory.memsw.limit_in_bytes").exists():
            _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
        _write(by_ctl["pids"] / "pids.max", str(pids_max))
        if cpu_quota is not None and "cpu" in by_ctl:
            cpu = by_ctl["cpu"]
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(cpu_quota * CPU_PERIOD_US))))

    def release(self) -> None:
        """Remove this server's own folders once they are empty (at shutdown, after every
        sandbox's cgroup is gone); a folder still in use stays, and is recreated on demand."""
        for d in self.server_dirs():
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def reap_stale(self) -> tuple[int, int]:
        """Kill the processes in, and remove, the cgroups of server pids that are gone.

        Returns (cgroups removed, processes killed)."""
        removed = killed = 0
        for root in self.roots.values():
            parent = self._parent(root)
            try:
                servers = [p for p in parent.iterdir() if p.is_dir() and p.name.isdigit()]
            except OSError:
                continue
            for server in servers:
                if Path(f"/proc/{server.name}").exists():
                    continue
                for box in sorted(_subdirs(server), key=lambda p: -len(p.parts)):
                    cg = Cgroup(box.name, self.version, [box], box)
                    killed += len(cg.procs())
                    if cg.remove():
                        removed += 1
                if _rmdir(server, 1.0):
                    log.info("reaped the cgroups of dead server %s under %s", server.name, parent)
        return removed, killed


def _subdirs(d: Path) -> list[Path]:
    out: list[Path] = []
    with contextlib.suppress(OSError):
        for p in d.iterdir():
            if p.is_dir():
                out.append(p)
                out.extend(_subdirs(p))
    return out


def detect(pid: int | None = None) -> tuple[CgroupManager | None, str]:
    """A working CgroupManager for this server and a one-line description, or None and why."""
    v2, v1 = _cgroup_mounts()
    reasons: list[str] = []
    candidates: list[CgroupManager] = []
    if v2 is not None:
        try:
            ctls = set((v2 / "cgroup.controllers").read_text().split())
        except OSError as e:
            ctls = set()
            reasons.append(f"v2 at {v2}: {e}")
        if {"memory", "pids"} <= ctls:
            candidates.append(CgroupManager(2, {"unified": v2}, pid))
        elif not reasons:
            reasons.append(f"v2 at {v2} lacks memory/pids controllers ({sorted(ctls)})")
    if "memory" in v1 and "pids" in v1:
        candidates.append(CgroupManager(1, {c: v1[c] for c in V1_CONTROLLERS if c in v1}, pid))
    elif v1:
        reasons.append(f"v1 lacks memory or pids hierarchies (have {sorted(v1)})")
    if v2 is None and not v1:
        reasons.append("no cgroup filesystem is mounted")
    for mgr in candidates:
        probe = f"probe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            cg = mgr.create(probe, 64 << 20, 16, 0.5)
        except OSError as e:
            reasons.append(f"v{mgr.version}: {e}")
            continue
        cg.remove()
        return mgr, mgr.describe()
    return None, "; ".join(reasons) or "no usable cgroup hierarchy"


def reap_all_stale() -> tuple[int, int]:
    """`CgroupManager.reap_stale` over every hierarchy mounted here, whichever is in use."""
    v2, v1 = _cgroup_mounts()
    removed = killed = 0
    mgrs: list[CgroupManager] = []
    if v2 is not None:
        mgrs.append(CgroupManager(2, {"unified": v2}))
    for ctl, root in v1.items():
        mgrs.append(CgroupManager(1, {ctl: root}))
    for mgr in mgrs:
        r, k = mgr.reap_stale()
        removed += r
        killed += k
    return removed, killed
