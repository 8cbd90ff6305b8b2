"""How a bwrap process starts confined: it joins the sandbox's cgroup, takes the rlimits,
drops to the host uid and gets the seccomp filter, before bwrap sets anything up.

With the exec helper (`palaestra.sandbox.exechelper`) that is one ``launch`` exec in front
of bwrap; without it ``/bin/sh -c 'echo $$ > cgroup.procs…; ulimit …; exec setpriv … bwrap
…'`` (the shell puts *itself* into the cgroup before it execs anything, so no process of the
sandbox ever runs outside it), or util-linux ``prlimit`` / a ``preexec_fn`` for the rlimits.
"""

from __future__ import annotations

import functools
import resource
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from palaestra.sandbox import cgroups, seccomp
from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.bwrap.host import is_root
from palaestra.sandbox.cgroups import Cgroup, CgroupManager
from palaestra.sandbox.preamble import rlimits

LimitMode = Literal["auto", "shell", "preexec", "prlimit", "none"]
CgroupMode = Literal["auto", "off"]

# Marker the launcher shell prints when it cannot join the sandbox's cgroup.
JOIN_FAILED = "palaestra: cannot join the sandbox cgroup"
LAUNCH_FAILED = 125

_RESOURCES = {
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
    "nofile": resource.RLIMIT_NOFILE,
}
# `ulimit` flags and units (bytes divided by): file size in 512-byte blocks, memory in KiB.
_ULIMIT = {"fsize": ("f", 512), "core": ("c", 1), "nofile": ("n", 1), "as": ("v", 1024)}


@functools.cache
def cgroup_manager() -> tuple[CgroupManager | None, str]:
    """This process's cgroup manager (detected once: it creates palaestra/<pid>/)."""
    if not is_root():
        return None, "cgroups unused: not running as root"
    return cgroups.detect()


def resolve_cgroups(mode: CgroupMode | CgroupManager) -> tuple[CgroupManager | None, str]:
    """The cgroup manager a backend's `cgroups` argument asks for, and its status line."""
    if isinstance(mode, CgroupManager):
        return mode, mode.describe()
    if mode == "off":
        return None, "cgroups off (rlimits only): cgroups='off'"
    manager, why = cgroup_manager()
    return manager, why if manager else f"cgroups unavailable (rlimits only): {why}"


def seccomp_status(enabled: bool) -> tuple[bool, str]:
    """Whether the seccomp filter can be used here, and the status line that says so."""
    if not enabled:
        return False, "seccomp off: seccomp_filter=False"
    try:
        seccomp.filter_bytes()
    except seccomp.SeccompUnsupported as e:
        return False, f"seccomp unavailable: {e}"
    return True, (
        f"seccomp: {len(seccomp.DENIED)} syscalls denied, {len(seccomp.UNAVAILABLE)} unavailable"
    )


@functools.cache
def shell_ulimit_ok() -> bool:
    """Whether /bin/sh's ulimit sets both limits in POSIX units (dash, bash --posix, ash)."""
    script = "ulimit -f 2048 && ulimit -v 1048576 && ulimit -n 64 && exec cat /proc/self/limits"
    try:
        out = subprocess.run(
            ["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    want = {"Max file size": "1048576", "Max address space": "1073741824", "Max open files": "64"}
    seen = 0
    for line in out.splitlines():
        for key, val in want.items():
            if line.startswith(key):
                if line[len(key) :].split()[:2] != [val, val]:
                    return False
                seen += 1
    return seen == len(want)


def resolve_limits(mode: LimitMode) -> LimitMode:
    """`mode`, with "auto" made the best this host has: the shell's ulimit, else prlimit."""
    if mode != "auto":
        return mode
    if shell_ulimit_ok():
        return "shell"
    import shutil

    return "prlimit" if shutil.which("prlimit") else "preexec"


def launcher_script(procs_files: list[Path], ulimits: list[tuple[str, int]]) -> str:
    """The shell that joins the cgroup, sets rlimits, then execs its arguments."""
    s = ""
    if procs_files:
        joins = " && ".join(f"echo $$ >{shlex.quote(str(f))}" for f in procs_files)
        fail = f"{{ echo '{JOIN_FAILED}' >&2; exit {LAUNCH_FAILED}; }}"
        s += f"{{ {joins}; }} 2>/dev/null || {fail}; "
    if ulimits:
        sets = " && ".join(f"ulimit -{flag} {val}" for flag, val in ulimits)
        s += f"{sets} || exit {LAUNCH_FAILED}; "
    return s + 'exec "$@"'


def _make_preexec(limits: list[tuple[int, int]]) -> Callable[[], None]:
    def preexec() -> None:
        for res, val in limits:
            resource.setrlimit(res, (val, val))

    return preexec


@dataclass
class Launcher:
    """How every bwrap of one sandbox is started (see the module docstring).

    `limits` is resolved (never "auto"); `host_uid` None runs bwrap as ourselves."""

    spec: SandboxSpec
    limits: LimitMode
    cgroup: Cgroup | None
    host_uid: int | None
    helper: Path | None
    seccomp_filter: bool
    netns: str | None = None  # a network namespace every bwrap joins (``nsenter --net``)

    def __post_init__(self) -> None:
        self.enter = ["nsenter", f"--net={self.netns}"] if self.netns is not None else []
        self.rlimits = rlimits(self.spec, memory_cgroup=self.cgroup is not None)
        procs_files = self.cgroup.procs_files if self.cgroup is not None else []
        ulimits: list[tuple[str, int]] = []
        if self.limits == "shell":
            ulimits = [(_ULIMIT[k][0], v // _ULIMIT[k][1]) for k, v in self.rlimits.items()]
        self.script = launcher_script(procs_files, ulimits) if procs_files or ulimits else None
        # The exec helper's ``launch`` argv up to ``--``: cgroup join, rlimits, host uid.
        self.prefix: list[str] = []
        if self.helper is not None:
            a = [str(self.helper), "launch"]
            for f in procs_files:
                a += ["--cg", str(f)]
            for k, v in self.rlimits.items():
                a += ["--rl", f"{k}={v}"]
            if self.host_uid is not None:
                a += ["--ids", f"{self.host_uid}:{self.host_uid}"]
            self.prefix = [*self.enter, *a, "--"]

    def wrap(self, args: list[str]) -> tuple[list[str], dict[str, Any]]:
        """Put the rlimits, the host uid and the cgroup join around a bwrap argv without
        the exec helper.

        Returns the argv to spawn and extra keyword arguments for the spawn (a preexec_fn
        in "preexec" mode).  Spawn it with ``env={"PATH": BASE_PATH}`` and ``cwd="/"``."""
        kwargs: dict[str, Any] = {}
        rl = [(_RESOURCES[k], v) for k, v in self.rlimits.items()]
        if self.limits == "preexec":
            kwargs["preexec_fn"] = _make_preexec(rl)
        elif self.limits == "prlimit":
            args = ["prlimit", *(f"--{k}={v}" for k, v in self.rlimits.items()), *args]
        if self.host_uid is not None:
            # setpriv, not subprocess's user=/group=: uvloop's subprocess_exec lacks them.
            uid = str(self.host_uid)
            args = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *args]
        if self.script is not None:
            args = ["/bin/sh", "-c", self.script, "sh", *args]
        return [*self.enter, *args], kwargs

    def launch(self, args: list[str]) -> tuple[list[str], dict[str, Any]]:
        """The argv (and spawn kwargs) that starts the bwrap argv `args` confined: behind
        the exec helper's ``launch`` where there is one, else `wrap`."""
        if self.prefix:
            return [*self.prefix, *args], {}
        return self.wrap(args)

    def seccomp_fd(self) -> int | None:
        """A fresh fd holding the seccomp program for ``--seccomp`` (None: no filter)."""
        return seccomp.filter_fd(self.spec.traces_execs) if self.seccomp_filter else None
