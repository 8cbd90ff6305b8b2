"""The `bwrap` backend (DESIGN §5): Linux namespaces via bubblewrap, no daemon.

Each sandbox owns a host directory ``<runtime_root>/<id>/`` holding ``ws/``, the
workspace: a size-limited tmpfs when we run as root (a plain directory otherwise),
bound read-write at ``spec.workdir`` inside. A synthetic ``passwd``, ``group`` and
``hosts``, the same for every sandbox with that workdir, are written once to
``<runtime_root>/etc-<hash>/``; beside copies of the few host ``/etc`` files a sandbox
needs, they make up ``etc-<hash>/etc/``, bound read-only at ``/etc`` in one bind
(`write_etc_tree`; an image's own ``/etc`` gets the three files bound over it instead).
The runtime root is one folder per server process, so a server reaps the folders and
mounts a killed one left.

Every `exec` is one ``bwrap`` invocation with all namespaces unshared (network:
loopback only), a read-only ``/usr`` (plus the ``/bin``, ``/lib``... symlinks and
a handful of ``/etc`` files), a fresh ``/proc``, ``/dev`` and ``/tmp``, and a cleared
environment.  Nothing else of the host -- its environment, ``/root``, ``/home``,
the repository, the pack store, the server's data -- is mounted.

The sandboxed code runs as uid/gid 1000.  When the server runs as root, bwrap
itself is started as host uid/gid ``host_uid`` (default 1000), so the sandboxed
processes are unprivileged on the host too (with bwrap started as root, uid 1000
inside would map to host uid 0 and pass owner-permission checks on root-owned
files).  Workspace files written from the host are chowned to that uid.

Because of ``--unshare-pid`` and ``--die-with-parent``, when the sandboxed command
exits (or bwrap is SIGKILLed on timeout) every process it started dies with its
pid namespace: no untrusted code runs between two `exec` calls.

Jails started ahead (with the exec helper, `palaestra.sandbox.exechelper`, a static C
program built on first use): an exec's bwrap does not need its command to set up, so each
sandbox keeps one *jail* started ahead -- `PRESPAWN_DELAY_S` after each exec, and when a
warm pool readies it (`wait_ready`) -- whose command is the helper's ``stub``: it says
"ready" on a socket and waits.  An exec sends it the command (argv, environment, cwd) and
fresh stdio pipes (SCM_RIGHTS; bwrap never holds them, so the exec ends when bwrap reports
the exit code, not when bwrap exits); the stub puts those on 0/1/2, closes every descriptor
above 2 and execs the command (``execvp``), so the command runs exactly where a fresh
bwrap exec would (same namespaces, mounts, uid, seccomp filter, capabilities, rlimits and
cgroup, a fresh ``/tmp``, pid 2 under bwrap's init), and the exec costs one ``execve``
instead of a bwrap set-up.  A jail serves one exec
only; an exec that finds none (the first after a plain create, concurrent execs) is one
bwrap with the command on its command line, behind the helper's launcher.  No untrusted
code ever runs in a waiting jail.  At most ``max_ready_jails`` (default 256) wait per
backend; beyond that, and with ``prespawn=False``, none is started ahead.  A jail that died
while it waited (before its stub took the command) is replaced once, transparently.

Hardening (each exec):

* ``--unshare-all --disable-userns --die-with-parent --new-session --clearenv``, uid 1000
  with every capability dropped (``--cap-drop ALL``), an explicit environment: a fixed
  base (PATH, HOME, LANG, PYTHONDONTWRITEBYTECODE) plus ``spec.env`` and the exec's
  ``env``, whose names must match ``[A-Za-z_][A-Za-z0-9_]*`` and must not start with
  ``LD_`` (loader variables), values without NUL (`check_env`);
* a seccomp filter (`palaestra.sandbox.seccomp`) handed to ``bwrap --seccomp`` through a
  pipe: ptrace, process_vm_*, bpf, perf_event_open, userfaultfd, keyrings, the mount
  APIs, kexec and kernel modules fail with EPERM, ``ioctl(TIOCSTI/TIOCLINUX)`` too, foreign
  architectures (i386/x32 calls) are refused;
* one cgroup per sandbox (`palaestra.sandbox.cgroups`, v2 or v1):
  ``memory`` = ``spec.memory_mb`` (swap included), ``pids`` = ``spec.pids`` (threads
  count), CPU quota = ``spec.cpus``.  With the exec helper, its ``launch`` step writes its
  own pid into the cgroup, sets the rlimits and drops to the host uid before it execs
  bwrap: one exec in front of bwrap instead of two.  Without it, every exec is started as
  ``/bin/sh -c 'echo $$ >
  <cgroup>/cgroup.procs…; ulimit …; exec setpriv … bwrap …'``: the shell puts *itself*
  into the cgroup before it execs anything, so no process of the sandbox ever runs
  outside it (no pid-after-spawn race) and the shell's ``ulimit`` replaces the
  ``prlimit`` exec, so the chain stays three execs long (sh → setpriv → bwrap).  A
  timed-out exec (the only one in flight in its sandbox) and `close` kill everything left
  in the cgroup; ``oom_killed`` is exact (the cgroup's oom_kill counter rose during the
  exec).  Where cgroups are unusable (not mounted, not writable, v2 controllers not
  delegable) the backend degrades to rlimits only and says why once, in the log and in
  ``BwrapBackend.cgroup_status``;
* rlimits: ``RLIMIT_FSIZE`` = workspace_mb, ``RLIMIT_CORE`` = 0, ``RLIMIT_NOFILE`` = 1024,
  and ``RLIMIT_AS`` = memory_mb only without a memory cgroup (an address-space limit
  breaks runtimes that reserve more than they use: the JVM, Go, some BLAS builds).

Spec checks (`check_spec`, `SandboxSpecError` naming the limit): memory_mb in
[MIN_MEMORY_MB, host RAM], cpus in (0, host CPUs], pids in [MIN_PIDS, MAX_PIDS],
workspace_mb in [1, min(MAX_WORKSPACE_MB, host RAM)], default_timeout_s > 0, a valid env,
no network, an image that exists.

Images: ``spec.image`` None binds the host's ``/usr`` (and a few ``/etc`` files)
read-only; an absolute path names an extracted rootfs, and a bare name resolves to
``$PALAESTRA_IMAGES_DIR/<name>/rootfs`` (default ``${PALAESTRA_CACHE:-~/.cache/palaestra}
/images``).  Every top-level entry of the rootfs (but ``/proc``, ``/dev``, ``/sys``,
``/tmp``, ``/run`` and the one holding the workdir) is bound read-only (its symlinks
recreated), then the synthetic passwd/group/hosts over the image's where it has them.

"An exec that kills the sandbox": each exec is its own set of namespaces, so an exec can
only kill the *sandbox* by destroying what persists between execs -- the workspace mount
or the cgroup.  After each exec (and before one) the workspace must still be the same
filesystem and the cgroup must still exist; if not, the sandbox is closed and
`SandboxGone` raised.  OOM kills and timeouts leave it usable.

Results:

* timeout: ``timed_out=True``, ``exit_code=-9`` (we SIGKILL it; -9 cannot be
  confused with an exit status the program chose, which is 0..255);
* death by a signal: ``exit_code = 128 + signal`` (as bwrap reports it);
* ``oom_killed``: with a memory cgroup, the kernel OOM-killed a process of this sandbox
  during the exec (concurrent execs in one sandbox share the counter); without one, best
  effort: a SIGKILL that was not our timeout (exit 137) or a trailing Python
  ``MemoryError`` (``RLIMIT_AS`` makes allocation fail).

Without the shell launcher (``limits="prlimit"`` / ``"preexec"``), rlimits are set by util-linux
``prlimit`` (about +1 ms per exec) or a ``preexec_fn`` (not thread-safe); the cgroup is
then still joined by a shell in front.

A new backend reaps what dead servers left (`reap_stale`): sandbox folders and their
mounts, and the processes still running in their cgroups, and the cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import resource
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from palaestra.sandbox import cgroups as cgroups_mod
from palaestra.sandbox import exechelper, seccomp
from palaestra.sandbox.base import (
    BASE_PATH,
    DEFAULT_MAX_OUTPUT,
    MAX_TREE_DEPTH,
    Backend,
    ExecResult,
    Sandbox,
    SandboxCreateError,
    SandboxDeadError,
    SandboxError,
    SandboxFileTooLarge,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    SandboxSpecError,
    SandboxTreeTooDeep,
    check_ro_binds,
    close_all,
    command_argv,
    read_limit,
    sandbox_env,
)
from palaestra.sandbox.cgroups import Cgroup, CgroupManager
from palaestra.sandbox.shell import BashSession, LocalShellProcess, prepare_shell_binary
from palaestra.sandbox.spawn import spawn

log = logging.getLogger("palaestra.sandbox.bwrap")

SANDBOX_UID = 1000
SANDBOX_GID = 1000
TIMEOUT_EXIT_CODE = -9
# Where the persistent shell's execute-only bash is bound inside (read-only).
SHELL_BINARY = "/run/palaestra/bash"
# After a SIGKILL, how long we wait for bwrap to be reaped and its pipes to close.
KILL_GRACE_S = 0.9
_CHUNK = 64 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

LimitMode = Literal["auto", "shell", "preexec", "prlimit", "none"]
CgroupMode = Literal["auto", "off"]

# Spec bounds (check_spec); the host's RAM and CPU count bound memory_mb and cpus too.
MIN_MEMORY_MB = 16
MIN_PIDS = 4  # bwrap itself uses two: its outer process and the namespace's init
MAX_PIDS = 65536
MAX_WORKSPACE_MB = 16384  # a tmpfs: RAM (or swap), charged to whoever writes it
NOFILE = 1024
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_ENV_BYTES = 256 * 1024
# Marker the launcher shell prints when it cannot join the sandbox's cgroup.
_JOIN_FAILED = "palaestra: cannot join the sandbox cgroup"
_LAUNCH_FAILED = 125
# How long a jail may take to come up (bwrap set-up) before we call it failed.
JAIL_START_TIMEOUT_S = 20.0
# After an exec, how long before the next exec's jail is started ahead.
PRESPAWN_DELAY_S = 0.05


def _is_root() -> bool:
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
    argv = [path, "--ro-bind", "/usr", "/usr", *_usr_symlinks(), "--unshare-all"]
    argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    argv += ["--die-with-parent", "--", "/usr/bin/true"]
    kwargs: dict[str, Any] = {}
    if _is_root():
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


def _usr_symlinks() -> list[str]:
    """Mirror the host's /bin, /lib, /lib64, /sbin (symlinks into /usr on merged-/usr hosts)."""
    out: list[str] = []
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        host = f"/{name}"
        if os.path.islink(host):
            out += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            out += ["--ro-bind", host, host]
    return out


def _etc_args() -> list[str]:
    """Only the /etc files programs need (never the whole /etc)."""
    out: list[str] = []
    for p in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl/certs", "/etc/ca-certificates"):
        if os.path.exists(p):
            out += ["--ro-bind", p, p]
    lt = "/etc/localtime"
    if os.path.islink(lt):
        out += ["--symlink", os.readlink(lt), lt]
    elif os.path.isfile(lt):
        out += ["--ro-bind", lt, lt]
    return out


def write_etc_files(etc: Path, workdir: str) -> None:
    """The synthetic /etc/passwd, group and hosts bound read-only into every sandbox."""
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{workdir}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n")
    for f in ("passwd", "group", "hosts"):
        os.chmod(etc / f, 0o644)


_ETC_COPIED = ("ld.so.cache", "alternatives", "ssl/certs", "ca-certificates", "localtime")


def write_etc_tree(etc: Path) -> Path:
    """``<etc>/etc``: the whole ``/etc`` of a host-``/usr`` sandbox, bound read-only at once.

    It holds the synthetic passwd, group and hosts (already in `etc`) and copies of what
    `_etc_args` binds one by one (symlinks kept as symlinks).  One bind instead of eight: bwrap
    re-reads ``/proc/self/mountinfo`` for every read-only bind, ≈ 0.3 ms of CPU each.  Built
    once per runtime folder and workdir (atomically, by rename), so a host change to those
    files reaches new sandboxes after a server restart."""
    tree = etc / "etc"
    if tree.is_dir():
        return tree
    tmp = etc / f"etc.{secrets.token_hex(4)}.tmp"
    try:
        tmp.mkdir(mode=0o755)
        for f in ("passwd", "group", "hosts"):
            shutil.copy2(etc / f, tmp / f)
        for rel in _ETC_COPIED:
            src, dst = Path("/etc") / rel, tmp / rel
            dst.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            if src.is_symlink() and rel == "localtime":
                os.symlink(os.readlink(src), dst)
            elif src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            elif src.is_file():
                shutil.copy2(src, dst)
        for dirpath, _, _ in os.walk(tmp):
            os.chmod(dirpath, 0o755)
        try:
            os.rename(tmp, tree)
        except OSError:
            if not tree.is_dir():  # not "another sandbox was first"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tree


async def drain_capped(stream: asyncio.StreamReader, buf: bytearray, max_output: int) -> bool:
    """Read `stream` to EOF, keeping its first `max_output` bytes; True if any were dropped."""
    truncated = False
    while chunk := await stream.read(_CHUNK):
        room = max_output - len(buf)
        if len(chunk) > room:
            truncated = True
            if room > 0:
                buf += chunk[:room]
        else:
            buf += chunk
    return truncated


def _make_preexec(limits: list[tuple[int, int]]) -> Callable[[], None]:
    def preexec() -> None:
        for res, val in limits:
            resource.setrlimit(res, (val, val))

    return preexec


# ---- spec and environment checks -----------------------------------------------------------


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


def images_dir() -> Path:
    explicit = os.environ.get("PALAESTRA_IMAGES_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("PALAESTRA_CACHE") or str(Path.home() / ".cache" / "palaestra")
    return Path(cache) / "images"


_IMAGE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")


def resolve_image(image: str) -> Path:
    """The rootfs directory `image` names: a name under `images_dir`, or an absolute path
    that resolves (symlinks followed) strictly inside it. Never the host root, never a
    directory outside the operator's images dir: an image is the sandbox's whole view."""
    base = images_dir()
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
            " (PALAESTRA_IMAGES_DIR); the bwrap backend runs only rootfs directories built"
            " there, never a host directory"
        )
    if real == real_base:
        raise SandboxSpecError(f"image {image!r}: is the images dir {base} itself, not a rootfs")
    if not root.is_dir():
        raise SandboxSpecError(f"image {image!r}: no rootfs directory at {root}")
    if not (root / "usr").is_dir():
        raise SandboxSpecError(f"image {image!r}: {root} has no usr/, not a rootfs")
    return real  # resolved: what was checked is what gets bound


def check_spec(spec: SandboxSpec) -> None:
    """Raise SandboxSpecError, naming the limit, if this host cannot give `spec`."""
    if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) == "/":
        raise SandboxSpecError(f"workdir must be an absolute path below /: {spec.workdir!r}")
    if spec.network:
        raise SandboxSpecError("network=True: the bwrap backend has no network support")
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
        resolve_image(spec.image)
    check_ro_binds(spec)


# ---- cgroups, seccomp, launcher -------------------------------------------------------------

_logged: set[str] = set()


def _log_once(level: int, msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log.log(level, msg)


@functools.cache
def _cgroup_manager() -> tuple[CgroupManager | None, str]:
    """This process's cgroup manager (detected once: it creates palaestra/<pid>/)."""
    if not _is_root():
        return None, "cgroups unused: not running as root"
    return cgroups_mod.detect()


@functools.cache
def _shell_ulimit_ok() -> bool:
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


def _launcher_script(procs_files: list[Path], ulimits: list[tuple[str, int]]) -> str:
    """The shell that joins the cgroup, sets rlimits, then execs its arguments."""
    s = ""
    if procs_files:
        joins = " && ".join(f"echo $$ >{shlex.quote(str(f))}" for f in procs_files)
        fail = f"{{ echo '{_JOIN_FAILED}' >&2; exit {_LAUNCH_FAILED}; }}"
        s += f"{{ {joins}; }} 2>/dev/null || {fail}; "
    if ulimits:
        sets = " && ".join(f"ulimit -{flag} {val}" for flag, val in ulimits)
        s += f"{sets} || exit {_LAUNCH_FAILED}; "
    return s + 'exec "$@"'


def _image_args(root: Path, workdir: str) -> list[str]:
    """Bind a rootfs's top-level entries read-only (never those we mount ourselves)."""
    top = workdir.strip("/").split("/")[0]
    skip = {"proc", "dev", "sys", "tmp", "run", top}
    out: list[str] = []
    for name in sorted(os.listdir(root)):
        if name in skip:
            continue
        host = root / name
        if host.is_symlink():
            out += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            out += ["--ro-bind", str(host), f"/{name}"]
    return out


def _reachable(path: Path, uid: int) -> bool:
    """Whether `uid` (no supplementary groups) can traverse every directory down to `path`."""
    p = path
    while True:
        try:
            st = os.stat(p)
        except OSError:
            return False
        if st.st_uid == uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == uid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return False
        if p.parent == p:
            return True
        p = p.parent


def _image_source(image: Path, runtime_dir: Path, host_uid: int | None) -> Path:
    """Where bwrap (running as `host_uid`) can reach the rootfs `image`.

    If some directory above it is closed to that uid (an image cached under /root), the
    rootfs is bind-mounted read-only (not recursively) once per server at
    ``<runtime_dir>/img-<hash>``, a folder the collector unmounts when the server is gone."""
    if host_uid is None or _reachable(image, host_uid):
        return image
    tag = hashlib.sha256(os.fsencode(image)).hexdigest()[:12]
    target = runtime_dir / f"img-{tag}"
    if str(target) in _mounted_images:
        return target
    target.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(runtime_dir, 0o711)
    libc = _libc()
    ms_bind, ms_remount, ms_ro, ms_nosuid, ms_nodev = 0x1000, 0x20, 0x1, 0x2, 0x4
    src, dst = os.fsencode(image), os.fsencode(target)
    if libc.mount(src, dst, None, ms_bind, None) != 0:
        err = ctypes.get_errno()
        raise SandboxCreateError(f"cannot bind the image {image}: {os.strerror(err)}")
    flags = ms_bind | ms_remount | ms_ro | ms_nosuid | ms_nodev
    if libc.mount(None, dst, None, flags, None) != 0:
        err = ctypes.get_errno()
        _unmount(target)
        raise SandboxCreateError(f"cannot make the image bind read-only: {os.strerror(err)}")
    _mounted_images.add(str(target))
    return target


_mounted_images: set[str] = set()


class BwrapBackend(Backend):
    """Creates `BwrapSandbox`es, by default under /run/palaestra/sandboxes/<pid>/ as root."""

    name = "bwrap"

    def __init__(
        self,
        runtime_dir: Path | None = None,
        *,
        host_uid: int = SANDBOX_UID,
        limits: LimitMode = "auto",
        cgroups: CgroupMode | CgroupManager = "auto",
        seccomp_filter: bool = True,
        exec_helper: bool = True,
        prespawn: bool = True,
        max_ready_jails: int = 256,
    ) -> None:
        if isinstance(cgroups, CgroupManager):
            self.cgroups: CgroupManager | None = cgroups
            self.cgroup_status = cgroups.describe()
        elif cgroups == "off":
            self.cgroups, self.cgroup_status = None, "cgroups off (rlimits only): cgroups='off'"
        else:
            self.cgroups, why = _cgroup_manager()
            self.cgroup_status = (
                why if self.cgroups else f"cgroups unavailable (rlimits only): {why}"
            )
        if runtime_dir is None:
            # One folder per server process, so a server can reap what a dead one left behind.
            base = default_runtime_base()
            reap_stale(base, cgroups=self.cgroups is not None or _is_root())
            runtime_dir = base / str(os.getpid())
        _log_once(logging.INFO if self.cgroups else logging.WARNING, f"bwrap: {self.cgroup_status}")
        self.seccomp = seccomp_filter
        if not seccomp_filter:
            self.seccomp_status = "seccomp off: seccomp_filter=False"
        else:
            try:
                seccomp.filter_bytes()
                self.seccomp_status = (
                    f"seccomp: {len(seccomp.DENIED)} syscalls denied, "
                    f"{len(seccomp.UNAVAILABLE)} unavailable"
                )
            except seccomp.SeccompUnsupported as e:
                self.seccomp = False
                self.seccomp_status = f"seccomp unavailable: {e}"
                _log_once(logging.WARNING, f"bwrap: {self.seccomp_status}")
        self.runtime_dir = runtime_dir
        self.host_uid = host_uid
        self.limits: LimitMode = limits
        self._bwrap: str | None = None  # bwrap's path once the probe passed
        self.prespawn = prespawn and max_ready_jails > 0
        self.jails = JailBudget(max_ready_jails)
        if self.prespawn:
            _raise_nofile()
        self._want_helper = exec_helper
        self._helper: Path | None = None
        self.helper_status = "exec helper not resolved yet" if exec_helper else "exec helper off"
        self._live: set[BwrapSandbox] = set()

    def _resolve_helper(self) -> Path | None:
        """Build (once per machine) and install (once per backend) the exec helper."""
        if self._helper is None and self._want_helper:
            self._want_helper = False  # resolved once, whatever the outcome
            path, why = exechelper.helper_binary()
            if path is not None:
                try:
                    self._helper = exechelper.install(self.runtime_dir)
                except OSError as e:
                    why = f"cannot install the exec helper in {self.runtime_dir}: {e}"
            if self._helper is not None:
                self.helper_status = f"exec helper {self._helper}"
            else:
                self.helper_status = f"exec helper unavailable (sh + setpriv launcher): {why}"
                _log_once(logging.WARNING, f"bwrap: {self.helper_status}")
        return self._helper

    @staticmethod
    def available() -> tuple[bool, str]:
        return bwrap_available()

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def create(self, spec: SandboxSpec) -> BwrapSandbox:
        check_spec(spec)
        if self._bwrap is None:  # probed once per backend (off the event loop), then known
            ok, why = await asyncio.to_thread(bwrap_available)
            if not ok:
                raise SandboxCreateError(why)
            self._bwrap = why
        why = self._bwrap
        helper = self._helper
        if helper is None and self._want_helper:
            helper = await asyncio.to_thread(self._resolve_helper)
        box = BwrapSandbox(
            spec,
            bwrap=why,
            runtime_dir=self.runtime_dir,
            host_uid=self.host_uid,
            limits=self.limits,
            on_close=self._live.discard,
            cgroups=self.cgroups,
            seccomp_filter=self.seccomp,
            helper=helper,
            prespawn=self.prespawn,
            jails=self.jails,
        )
        try:
            await box._setup()
        except BaseException:
            await asyncio.shield(box.close())
            raise
        self._live.add(box)
        return box

    async def aclose(self) -> None:
        await close_all(self._live)
        if self.cgroups is not None:
            self.cgroups.release()  # palaestra/<pid>/ itself, once its sandboxes are gone


class JailBudget:
    """How many jails may wait, started ahead, over one backend's sandboxes: each holds three
    processes (bwrap's two, the stub) and five of the server's descriptors."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used = max(0, self.used - 1)


def _raise_nofile(want: int = 65536) -> None:
    """Lift this process's soft RLIMIT_NOFILE towards its hard limit (jails hold descriptors)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


@dataclass
class _Jail:
    """One bwrap started for one exec.

    With the exec helper, ``ctl`` is our end of the stub's socket: the jail is up and its
    stub waits for the command (a *ready* jail).  Without it (``ctl`` None), the command was
    on bwrap's command line.  ``static`` is the `_static_args` it was built from."""

    proc: asyncio.subprocess.Process
    ctl: socket.socket | None
    status_r: int
    static: list[str]
    ready: bool = False  # its stub said "R" (set-up done)
    reported: bool = False  # bwrap reported the command's exit code
    closed: bool = False

    def discard(self) -> None:
        """Kill it (if still running) and close our ends; idempotent."""
        _killpg(self.proc)
        self.release()

    def release(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.ctl is not None:
            self.ctl.close()
        os.close(self.status_r)
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()


class BwrapSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        *,
        bwrap: str = "/usr/bin/bwrap",
        runtime_dir: Path | None = None,
        host_uid: int = SANDBOX_UID,
        limits: LimitMode = "auto",
        on_close: Callable[[BwrapSandbox], None] | None = None,
        cgroups: CgroupManager | None = None,
        seccomp_filter: bool = True,
        helper: Path | None = None,
        prespawn: bool = True,
        jails: JailBudget | None = None,
    ) -> None:
        if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) == "/":
            raise SandboxSpecError(f"workdir must be an absolute path below /: {spec.workdir!r}")
        self.spec = spec
        self._image = resolve_image(spec.image) if spec.image is not None else None
        self._cgroups = cgroups
        self.cgroup: Cgroup | None = None
        self._seccomp = seccomp_filter
        self._launcher: str | None = None
        self._ws_dev: int | None = None
        # Execs (and other users, such as a persistent shell) running in the cgroup now: a
        # timed-out exec kills the whole cgroup only when it is the only one.
        self.cgroup_users = 0
        self.id = secrets.token_hex(8)
        self._bwrap = bwrap
        if runtime_dir is None:
            runtime_dir = default_runtime_base() / str(os.getpid())
        self.root = runtime_dir / self.id
        self.workspace = self.root / "ws"
        self._workdir = posixpath.normpath(spec.workdir)
        # The synthetic /etc files depend only on the workdir: written once, shared read-only.
        tag = hashlib.sha256(self._workdir.encode()).hexdigest()[:12]
        self._etc = runtime_dir / f"etc-{tag}"
        self._as_root = _is_root()
        # Host uid the sandboxed code runs as (None: whatever we are).
        self._host_uid: int | None = host_uid if self._as_root else None
        if limits == "auto":
            if _shell_ulimit_ok():
                limits = "shell"
            else:
                limits = "prlimit" if shutil.which("prlimit") else "preexec"
        self._limits: LimitMode = limits
        self._on_close = on_close
        self._mounted = False
        self.mount_error = ""
        self.tmpfs = False  # whether the workspace is a size-limited tmpfs
        self._closed = False
        self._procs: set[asyncio.subprocess.Process] = set()
        self._reaping: set[asyncio.Future[int]] = set()  # bwraps exiting by themselves
        self._static_args: list[str] = []
        self._etc_tree: Path | None = None  # bound at /etc (host-/usr sandboxes, `_setup`)
        # The exec helper (palaestra.sandbox.exechelper): with it, every exec's bwrap jail
        # is started by its launcher and its stub receives the command once the jail is up;
        # `_next` is the jail started ahead for the next exec (prespawn).
        self._helper = helper
        self._prespawn = prespawn and helper is not None
        self._launch_prefix: list[str] = []
        self._next: asyncio.Future[_Jail] | None = None  # holds one unit of `_jails`
        self._timer: asyncio.TimerHandle | None = None  # starts `_next` after an exec
        self._jails = jails if jails is not None else JailBudget(1)

    # ---- lifecycle -------------------------------------------------------------------------

    async def _setup(self) -> None:
        try:
            self.root.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
            self.root.mkdir(mode=0o711)
            os.chmod(self.root, 0o711)
            self.workspace.mkdir(mode=0o700)
            if not (self._etc / "hosts").exists():
                self._etc.mkdir(mode=0o755, exist_ok=True)
                os.chmod(self._etc, 0o755)
                write_etc_files(self._etc, self._workdir)
        except OSError as e:
            raise SandboxCreateError(f"cannot create sandbox dir {self.root}: {e}") from e
        if self._image is None:
            tree: Path | None = self._etc / "etc"
            if not self._etc.joinpath("etc").is_dir():
                try:
                    tree = await asyncio.to_thread(write_etc_tree, self._etc)
                except OSError as e:
                    _log_once(logging.WARNING, f"bwrap: /etc as one folder failed ({e}); "
                              "binding its files one by one")  # fmt: skip
                    tree = None
            self._etc_tree = tree
        if self._as_root:
            mb = self.spec.workspace_mb
            opts = f"size={mb}m,nr_inodes={max(8192, mb * 256)}"
            opts += f",mode=0755,uid={self._host_uid},gid={self._host_uid}"
            self.mount_error = _mount_tmpfs(self.workspace, opts)
            self._mounted = self.tmpfs = not self.mount_error
        if not self.tmpfs:
            if self._host_uid is not None:
                os.chown(self.workspace, self._host_uid, self._host_uid)
                os.chmod(self.workspace, 0o755)
            else:
                os.chmod(self.workspace, 0o777)
        self._ws_dev = os.stat(self.workspace).st_dev
        if self._cgroups is not None:
            cpus = self.spec.cpus if self.spec.cpus < host_cpus() else None
            try:
                self.cgroup = await asyncio.to_thread(
                    self._cgroups.create,
                    self.id,
                    self.spec.memory_mb << 20,
                    self.spec.pids,
                    cpus,
                )
            except OSError as e:
                raise SandboxCreateError(f"cannot create the sandbox's cgroup: {e}") from e
        if self._image is not None:
            self._image = _image_source(self._image, self.root.parent, self._host_uid)
        self._static_args = self._build_static_args()
        ulimits: list[tuple[str, int]] = []
        if self._limits == "shell":
            ulimits = [("f", self.spec.workspace_mb * 2048), ("c", 0), ("n", NOFILE)]
            if self.cgroup is None:
                ulimits.append(("v", self.spec.memory_mb * 1024))
        procs_files = self.cgroup.procs_files if self.cgroup is not None else []
        if procs_files or ulimits:
            self._launcher = _launcher_script(procs_files, ulimits)
        if self._helper is not None:
            self._launch_prefix = self._helper_launcher(procs_files)
            # No jail yet: a first exec right after create is one bwrap with its command on
            # the command line (the cold path); a warm pool starts one with `wait_ready`.

    def _helper_launcher(self, procs_files: list[Path]) -> list[str]:
        """The exec helper's ``launch`` argv up to ``--``: cgroup join, rlimits, host uid."""
        assert self._helper is not None
        a = [str(self._helper), "launch"]
        for f in procs_files:
            a += ["--cg", str(f)]
        a += ["--rl", f"fsize={self.spec.workspace_mb * 1024 * 1024}", "--rl", "core=0"]
        a += ["--rl", f"nofile={NOFILE}"]
        if self.cgroup is None:
            a += ["--rl", f"as={self.spec.memory_mb * 1024 * 1024}"]
        if self._host_uid is not None:
            a += ["--ids", f"{self._host_uid}:{self._host_uid}"]
        return [*a, "--"]

    def _build_static_args(self) -> list[str]:
        a = [self._bwrap]
        etc_files: tuple[str, ...] = ()
        if self._image is None and self._etc_tree is not None:
            a += ["--ro-bind", "/usr", "/usr", *_usr_symlinks()]
            a += ["--ro-bind", str(self._etc_tree), "/etc"]
        elif self._image is None:
            a += ["--ro-bind", "/usr", "/usr", *_usr_symlinks(), *_etc_args()]
            etc_files = ("passwd", "group", "hosts")
        else:
            a += _image_args(self._image, self._workdir)
            # Over the image's own where it has them (a read-only root cannot grow new files).
            etc_files = tuple(
                f for f in ("passwd", "group", "hosts") if _is_plain_file(self._image / "etc" / f)
            )
        for f in etc_files:
            a += ["--ro-bind", str(self._etc / f), f"/etc/{f}"]
        size = str(self.spec.workspace_mb * 1024 * 1024)
        a += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
        a += ["--size", size, "--tmpfs", "/tmp"]
        a += ["--bind", str(self.workspace), self._workdir]
        for host, target in self.spec.ro_binds:
            a += ["--ro-bind", host, posixpath.normpath(target)]
        a += ["--unshare-all", "--unshare-user", "--disable-userns"]
        a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", "sandbox"]
        a += ["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
        return a

    def _wrap(self, args: list[str]) -> tuple[list[str], dict[str, Any]]:
        """Put the rlimits, the host uid and the cgroup join around a bwrap argv.

        Returns the argv to spawn and extra keyword arguments for the spawn (a preexec_fn
        in "preexec" mode).  Spawn it with ``env={"PATH": BASE_PATH}`` and ``cwd="/"``."""
        kwargs: dict[str, Any] = {}
        rl = [
            (resource.RLIMIT_FSIZE, self.spec.workspace_mb * 1024 * 1024),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NOFILE, NOFILE),
        ]
        if self.cgroup is None:
            rl.insert(0, (resource.RLIMIT_AS, self.spec.memory_mb * 1024 * 1024))
        if self._limits == "preexec":
            kwargs["preexec_fn"] = _make_preexec(rl)
        elif self._limits == "prlimit":
            names = {
                resource.RLIMIT_AS: "as",
                resource.RLIMIT_FSIZE: "fsize",
                resource.RLIMIT_CORE: "core",
                resource.RLIMIT_NOFILE: "nofile",
            }
            args = ["prlimit", *(f"--{names[r]}={v}" for r, v in rl), *args]
        if self._host_uid is not None:
            # setpriv, not subprocess's user=/group=: uvloop's subprocess_exec lacks them.
            uid = str(self._host_uid)
            args = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *args]
        if self._launcher is not None:
            args = ["/bin/sh", "-c", self._launcher, "sh", *args]
        return args, kwargs

    def _seccomp_fd(self) -> int | None:
        """A fresh fd holding the seccomp program for ``--seccomp`` (None: no filter)."""
        return seccomp.filter_fd() if self._seccomp else None

    def _lost(self) -> str:
        """Why the sandbox is dead although not closed ("" while it is intact)."""
        try:
            st = os.stat(self.workspace)
        except OSError:
            return "its workspace is gone"
        if self._ws_dev is not None and st.st_dev != self._ws_dev:
            return "its workspace was unmounted"
        if self.cgroup is not None and not self.cgroup.exists():
            return "its cgroup was removed"
        return ""

    async def _gone(self, why: str) -> SandboxGone:
        await self.close()
        return SandboxGone(f"sandbox {self.id} died: {why}")

    @property
    def alive(self) -> bool:
        return not self._closed

    def cpu_seconds(self) -> float | None:
        """CPU time this sandbox's processes used so far, from its cgroup (None: no counter);
        the server bills it to the episode's token (server/tenancy.py)."""
        return self.cgroup.cpu_seconds() if self.cgroup is not None else None

    def _reap_later(self, proc: asyncio.subprocess.Process) -> None:
        """Reap a bwrap that reported its command's exit, or was killed, and now exits by
        itself; `close` waits for it (a process still unreaped when its event loop ends
        leaves its transport "running", and its finalizer fails on the closed loop)."""
        self._await_on_close(asyncio.ensure_future(proc.wait()))

    def _await_on_close(self, fut: asyncio.Future[Any]) -> None:
        self._reaping.add(fut)
        fut.add_done_callback(self._reaping.discard)
        fut.add_done_callback(lambda t: None if t.cancelled() else t.exception())

    def _discard(self, jail: _Jail) -> None:
        """Kill `jail` and reap it in the background."""
        jail.discard()
        self._reap_later(jail.proc)

    def _discard_result(self, task: asyncio.Future[_Jail]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._discard(task.result())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in list(self._procs):
            _killpg(proc)
        self._drop_next()
        # Bounded; a reap may register meanwhile (a cancelled jail start discarding its jail).
        deadline = time.monotonic() + KILL_GRACE_S
        while self._reaping and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self._reaping), timeout=left)
        mounted, self._mounted = self._mounted, False
        cg, self.cgroup = self.cgroup, None
        if cg is not None:
            await asyncio.to_thread(cg.remove)
        await asyncio.to_thread(_remove, self.root, self.workspace if mounted else None)
        if self._on_close is not None:
            self._on_close(self)

    # ---- exec ------------------------------------------------------------------------------

    def _sandbox_path(self, path: str) -> str:
        """An absolute in-sandbox path (relative ones are under the workdir)."""
        return posixpath.normpath(posixpath.join(self._workdir, path))

    # ---- persistent shell (palaestra.sandbox.shell) -----------------------------------------

    def _shell_source(self) -> str:
        """The host path of the sandbox's own bash (the image's, or the host's /usr)."""
        root = str(self._image) if self._image is not None else "/"
        for rel in ("usr/bin/bash", "bin/bash"):
            p = os.path.join(root, rel)
            for _ in range(8):  # follow symlinks inside the rootfs, never out of it
                if not os.path.islink(p):
                    break
                target = os.readlink(p)
                base = root if target.startswith("/") else os.path.dirname(p)
                p = os.path.normpath(os.path.join(base, target.lstrip("/")))
            if os.path.isfile(p):
                return p
        raise SandboxError(f"sandbox {self.id}: no bash in its root, no persistent shell")

    async def shell(self) -> BashSession:
        """A persistent bash: one long-lived ``bwrap … bash`` per session, with the same
        workspace, mounts, namespaces, uid, environment, rlimits, cgroup and seccomp filter
        as `exec`, plus one read-only file, an execute-only copy of bash at SHELL_BINARY
        (which makes the shell non-dumpable; see `palaestra.sandbox.shell`)."""
        self._check_alive()
        src = self._shell_source()
        binary = await asyncio.to_thread(prepare_shell_binary, src, str(self.root.parent))

        def exited(proc: asyncio.subprocess.Process) -> None:
            self._procs.discard(proc)
            self.cgroup_users -= 1

        async def launch() -> LocalShellProcess:
            self._check_alive()
            if why := self._lost():
                raise await self._gone(why)
            env = sandbox_env(self.spec, self._workdir)
            args = list(self._static_args)
            for k, v in env.items():
                args += ["--setenv", k, v]
            args += ["--chdir", self._workdir, "--ro-bind", binary, SHELL_BINARY]
            sfd = self._seccomp_fd()
            if sfd is not None:
                args += ["--seccomp", str(sfd)]

            def argv_for(script: str) -> tuple[list[str], dict[str, Any]]:
                bash = [SHELL_BINARY, "--noprofile", "--norc", "-c", script]
                return self._wrap([*args, "--", *bash])

            self.cgroup_users += 1
            try:
                sp = await LocalShellProcess.spawn(
                    argv_for,
                    pass_fds=() if sfd is None else (sfd,),
                    env={"PATH": BASE_PATH},
                    on_exit=exited,
                )
            except BaseException:
                self.cgroup_users -= 1
                raise
            finally:
                if sfd is not None:
                    os.close(sfd)
            self._procs.add(sp.proc)
            return sp

        session = BashSession(
            launch,
            workdir=self._workdir,
            default_timeout=self.spec.default_timeout_s,
            alive=lambda: not self._closed,
        )
        await session.start()
        return session

    # ---- jails: one bwrap per exec -----------------------------------------------------------

    async def _spawn_jail(self, argv: list[str] | None = None, env: dict[str, str] | None = None,
                          cwd: str | None = None, stdin_null: bool = False) -> _Jail:  # fmt: skip
        """Start one exec's bwrap.

        With the exec helper and no `argv`: a jail whose stub waits for its command; this
        returns once the stub said it is ready (bwrap's set-up is done) and raises
        SandboxError with bwrap's message if it never is.  Otherwise (`argv`, `env` and `cwd`
        given) the command is on bwrap's command line, behind the launcher (stdin /dev/null
        with `stdin_null`, else a pipe)."""
        static = self._static_args
        args = list(static)
        ours: socket.socket | None = None
        theirs: socket.socket | None = None
        if argv is None:
            assert self._helper is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            args += ["--ro-bind", str(self._helper), exechelper.INSIDE_PATH, "--chdir", "/"]
        else:
            for k, v in (env or {}).items():
                args += ["--setenv", k, v]
            args += ["--chdir", cwd or self._workdir]
        status_r, status_w = os.pipe()
        # Our end is non-blocking from birth: flags are never set later on a number that, by
        # then, might name another descriptor (a command's stdin made non-blocking fails
        # with EAGAIN).
        os.set_blocking(status_r, False)
        sfd = self._seccomp_fd()
        pass_fds = [status_w]
        if sfd is not None:
            args += ["--seccomp", str(sfd)]
            pass_fds.append(sfd)
        args += ["--json-status-fd", str(status_w), "--"]
        kwargs: dict[str, Any] = {}
        if theirs is not None:
            pass_fds.append(theirs.fileno())
            args += [exechelper.INSIDE_PATH, "stub", str(theirs.fileno())]
            args = [*self._launch_prefix, *args]
        else:
            assert argv is not None
            args += argv
            if self._launch_prefix:
                args = [*self._launch_prefix, *args]
            else:
                args, kwargs = self._wrap(args)
        try:
            stub = theirs is not None  # its command gets its stdio from the exec, later
            proc = await spawn(
                *args,
                stdin=subprocess.DEVNULL if stdin_null or stub else subprocess.PIPE,
                stdout=subprocess.DEVNULL if stub else subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                start_new_session=True,
                cwd="/",
                # bwrap's own environ stays readable inside as /proc/1/environ (its init
                # process): never hand it the server's environment.
                env={"PATH": BASE_PATH},
                **kwargs,
            )
        except BaseException:
            os.close(status_r)
            if ours is not None:
                ours.close()
            raise
        finally:
            os.close(status_w)
            if sfd is not None:
                os.close(sfd)
            if theirs is not None:
                theirs.close()
        jail = _Jail(proc, ours, status_r, static)
        if ours is None:
            return jail
        ours.setblocking(False)
        await self._await_ready(jail)
        return jail

    async def _await_ready(self, jail: _Jail) -> None:
        """Wait for a jail's stub to say it is up; SandboxError with bwrap's message if not."""
        if jail.ready:
            return
        proc, ours = jail.proc, jail.ctl
        assert ours is not None
        ok = False
        try:
            loop = asyncio.get_running_loop()
            try:
                ok = await asyncio.wait_for(loop.sock_recv(ours, 1), JAIL_START_TIMEOUT_S) == b"R"
            except (OSError, TimeoutError):
                ok = False
            if not ok:
                _killpg(proc)
                err = b""
                if proc.stderr is not None:
                    with contextlib.suppress(Exception):
                        err = await asyncio.wait_for(proc.stderr.read(1 << 16), KILL_GRACE_S)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
                text = err.decode(errors="replace").strip()
                if _JOIN_FAILED in text:
                    raise SandboxError(f"sandbox {self.id}: {_JOIN_FAILED}")
                raise SandboxError(f"bwrap failed to set up the sandbox: {text[:2000]}")
        finally:
            if not ok:
                self._discard(jail)
        jail.ready = True

    async def wait_ready(self) -> None:
        """Start the next exec's jail now and wait until it is up: a warm pool calls this
        before it pools the sandbox, so a hand-out's first exec is one ``execve``.
        SandboxError if it cannot come up (nothing to do without the exec helper, or when
        the backend's `max_ready_jails` are all taken)."""
        self._check_alive()
        self._cancel_timer()
        self._start_next()
        fut = self._next
        if fut is None:
            return
        try:
            await asyncio.shield(fut)
        except SandboxError:
            if self._next is fut:
                self._pop_next()
            raise

    def _pop_next(self) -> asyncio.Future[_Jail] | None:
        fut, self._next = self._next, None
        if fut is not None:
            self._jails.give()
        return fut

    def _drop_next(self) -> None:
        """Kill the jail started ahead (or being started) for the next exec."""
        self._cancel_timer()
        fut = self._pop_next()
        if fut is None:
            return
        if not fut.done():
            fut.cancel()  # a cancelled `_spawn_jail` kills what it started
            self._await_on_close(fut)
        elif not fut.cancelled() and fut.exception() is None:
            self._discard(fut.result())

    def _schedule_next(self) -> None:
        """Start the next exec's jail in the background (the warm part of a sandbox), after
        PRESPAWN_DELAY_S: an exec followed at once by `close` (a verifier's run) or by another
        exec (which starts its own) wastes no jail."""
        if not self._prespawn or self._closed or self._next is not None or self._timer:
            return
        self._timer = asyncio.get_running_loop().call_later(PRESPAWN_DELAY_S, self._start_next)

    def _start_next(self) -> None:
        self._timer = None
        if not self._prespawn or self._closed or self._next is not None:
            return
        if not self._jails.take():
            return
        task = asyncio.ensure_future(self._spawn_jail())
        task.add_done_callback(_ignore_failure)
        self._next = task

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _take_jail(self) -> _Jail | None:
        """The jail started ahead (waiting for it if it is still coming up), if usable."""
        self._cancel_timer()
        fut = self._pop_next()
        if fut is not None:
            try:
                jail: _Jail | None = await asyncio.shield(fut)
            except asyncio.CancelledError:
                if not fut.cancelled():
                    fut.add_done_callback(self._discard_result)
                raise
            except SandboxError as e:
                log.debug("sandbox %s: the jail started ahead failed: %s", self.id, e)
                jail = None
            if jail is not None and (
                jail.static is not self._static_args
                or jail.proc.returncode is not None
                or jail.closed
            ):
                self._discard(jail)  # built from other arguments, or died while idle
                jail = None
            if jail is not None:
                return jail
        return None

    # ---- exec ------------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        if self._closed:
            raise SandboxDeadError(f"sandbox {self.id} is closed")
        argv = command_argv(cmd)
        if env:
            check_env(env)
        if why := self._lost():
            raise await self._gone(why)
        if timeout is None:
            timeout = self.spec.default_timeout_s
        full_env = sandbox_env(self.spec, self._workdir, env)
        where = self._sandbox_path(cwd or ".")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        start = time.monotonic()
        req = b""
        if self._helper is not None:
            req = exechelper.request(where, full_env, argv, data is None)
        try:
            jail = None
            if self._helper is not None:
                jail = await self._take_jail()
            if jail is None:  # cold: one bwrap with the command on its command line
                jail = await self._spawn_jail(argv, full_env, where, data is None)
        except OSError as e:
            if e.errno == errno.E2BIG:
                # The command itself is too big for execve: the caller's doing, so data (as a
                # shell reports it), not an infrastructure fault that would void the episode.
                message = "palaestra: argument list too long (an argument over 128 KiB?)\n"
                return ExecResult(126, "", message, duration_s=time.monotonic() - start)
            raise SandboxError(f"cannot start bwrap: {e}") from e
        try:
            return await self._exec_in(jail, req, data, timeout, max_output, start)
        except _JailDied as e:
            # The jail started ahead died before it took the command (an OOM kill while it
            # waited, say): nothing ran, so run it once more in a fresh jail.
            log.info("sandbox %s: %s; retrying in a fresh jail", self.id, e)
            try:
                jail = await self._spawn_jail(argv, full_env, where, data is None)
            except OSError as e2:
                raise SandboxError(f"cannot start bwrap: {e2}") from e2
            return await self._exec_in(jail, req, data, timeout, max_output, start)

    async def _exec_in(
        self,
        jail: _Jail,
        req: bytes,
        data: bytes | None,
        timeout: float,
        max_output: int,
        start: float,
    ) -> ExecResult:
        """Run one exec in `jail` (sending `req` to its stub, if it has one) to its end."""
        if self._closed:
            self._discard(jail)
            raise SandboxDeadError(f"sandbox {self.id} was closed during exec")
        proc = jail.proc
        cg = self.cgroup
        self._procs.add(proc)
        self.cgroup_users += 1
        try:
            oom_before = cg.oom_kills() if cg is not None else 0
            try:
                if jail.ctl is not None:
                    result = await self._run_stub(jail, req, data, timeout, max_output, start)
                else:
                    result = await self._supervise(
                        proc, data, timeout, max_output, jail.status_r, start
                    )
            except SandboxDeadError:
                raise
            except SandboxError as e:
                if why := self._lost():
                    raise await self._gone(why) from e
                if jail.ctl is not None and not _took_command(jail.ctl):
                    raise _JailDied(str(e)) from e
                raise
            if cg is not None and self.cgroup is cg:
                if result.timed_out and self.cgroup_users == 1:
                    # The pid namespace is gone with bwrap; this makes sure of it (and takes
                    # the jail started ahead with it, if one is up).
                    self._drop_next()
                    await asyncio.to_thread(cg.kill_all, KILL_GRACE_S)
                result.oom_killed = cg.oom_kills() > oom_before or (
                    not result.timed_out and _memory_error(result.stderr)
                )
            if why := self._lost():
                raise await self._gone(why)
            return result
        finally:
            self.cgroup_users -= 1
            if proc.returncode is None and jail.reported:
                # bwrap reported the exit code (its init, and with it every process of the
                # exec, is gone) and now exits by itself: reaped in the background.
                self._reap_later(proc)
            elif proc.returncode is None:
                _killpg(proc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_S)
            self._procs.discard(proc)
            jail.release()
            self._schedule_next()

    async def _run_stub(
        self,
        jail: _Jail,
        req: bytes,
        data: bytes | None,
        timeout: float,
        max_output: int,
        start: float,
    ) -> ExecResult:
        """Send a ready jail's stub its command with fresh stdio pipes; run it to its end.

        Done when bwrap reported the exit code (its init is gone, and with it every process
        of the exec) and both output pipes reached end of file.  bwrap itself never holds
        the pipes, so its own exit is not waited for."""
        loop = asyncio.get_running_loop()
        proc, ctl = jail.proc, jail.ctl
        assert ctl is not None
        # blocking for the command (a non-blocking stdout makes programs fail with EAGAIN),
        # non-blocking for us
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r = in_w = -1
        if data is not None:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.set_blocking(fd, False)
        theirs = [fd for fd in (in_r, out_w, err_w) if fd >= 0]
        ours = [fd for fd in (out_r, err_r, in_w) if fd >= 0]
        bufs = {out_r: bytearray(), err_r: bytearray()}
        eof = {out_r: loop.create_future(), err_r: loop.create_future()}
        reported: asyncio.Future[None] = loop.create_future()
        raw_status = bytearray()
        truncated = False
        pending_in = memoryview(data or b"")

        def read_out(fd: int) -> None:
            nonlocal truncated
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                loop.remove_reader(fd)
                if not eof[fd].done():
                    eof[fd].set_result(None)
                return
            buf = bufs[fd]
            room = max_output - len(buf)
            if len(chunk) > room:
                truncated = True
                chunk = chunk[: max(0, room)]
            buf += chunk

        def read_status() -> None:
            try:
                chunk = os.read(jail.status_r, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            raw_status.extend(chunk)
            if (not chunk or b"exit-code" in raw_status) and not reported.done():
                loop.remove_reader(jail.status_r)
                reported.set_result(None)

        def close_in() -> None:
            nonlocal in_w
            if in_w >= 0:
                loop.remove_writer(in_w)
                os.close(in_w)
                ours.remove(in_w)
                in_w = -1

        def write_in() -> None:
            nonlocal pending_in
            try:
                while pending_in:
                    pending_in = pending_in[os.write(in_w, pending_in) :]
            except BlockingIOError:
                return
            except OSError:
                pass  # the command closed its stdin: the rest is dropped, as with a pipe
            close_in()

        try:
            try:
                rest = exechelper.send(ctl, req, theirs)
                if rest:
                    await loop.sock_sendall(ctl, rest)
            except OSError:
                pass  # a dead jail: its status says so below
            finally:
                for fd in theirs:
                    os.close(fd)
            loop.add_reader(out_r, read_out, out_r)
            loop.add_reader(err_r, read_out, err_r)
            loop.add_reader(jail.status_r, read_status)
            if in_w >= 0:
                loop.add_writer(in_w, write_in)
            waits: list[asyncio.Future[None]] = [eof[out_r], eof[err_r], reported]
            _, pending = await asyncio.wait(waits, timeout=timeout)
            timed_out = bool(pending)
            if timed_out:
                _killpg(proc)
                await asyncio.wait(pending, timeout=KILL_GRACE_S)
        finally:
            for fd in (out_r, err_r, jail.status_r):
                loop.remove_reader(fd)
            close_in()
            for fd in ours:
                os.close(fd)
        duration = time.monotonic() - start
        stdout = bufs[out_r].decode("utf-8", errors="replace")
        stderr = bufs[err_r].decode("utf-8", errors="replace")
        status = _parse_status(bytes(raw_status))
        if timed_out or "exit-code" in status:
            # bwrap reports the exit code once its first child exits, and its init (pid 1,
            # holding whatever the command left running) dies only with bwrap: end it now and
            # wait until the init, and so every process of the exec, is gone.
            _killpg(proc)
            await _init_gone(status.get("child-pid"))
        if timed_out:
            return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated, duration)
        if self._closed:
            raise SandboxDeadError(f"sandbox {self.id} was closed during exec")
        if "exit-code" in status:
            jail.reported = True
            code = int(status["exit-code"])
            oom = code == 128 + signal.SIGKILL or _memory_error(stderr)
            return ExecResult(code, stdout, stderr, False, oom, truncated, duration)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_S)
        rc = proc.returncode
        if rc is not None and rc < 0:
            # bwrap itself was killed (not by us): count as an OOM-style kill, as `_supervise`.
            return ExecResult(128 - rc, stdout, stderr, False, True, truncated, duration)
        err = b""
        if proc.stderr is not None:
            with contextlib.suppress(Exception):
                err = await asyncio.wait_for(proc.stderr.read(1 << 16), KILL_GRACE_S)
        text = err.decode(errors="replace").strip()
        if _JOIN_FAILED in text:
            raise SandboxError(f"sandbox {self.id}: {_JOIN_FAILED}")
        raise SandboxError(f"bwrap failed to run the command (rc={rc}): {text[:2000]}")

    async def _supervise(
        self,
        proc: asyncio.subprocess.Process,
        data: bytes | None,
        timeout: float,
        max_output: int,
        status_r: int,
        start: float,
    ) -> ExecResult:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        truncated = [False]

        async def drain(stream: asyncio.StreamReader, buf: bytearray) -> None:
            if await drain_capped(stream, buf, max_output):
                truncated[0] = True

        async def feed() -> None:
            if proc.stdin is None:
                return
            try:
                if data:
                    proc.stdin.write(data)
                    await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                proc.stdin.close()

        tasks = [
            asyncio.ensure_future(drain(proc.stdout, out)),
            asyncio.ensure_future(drain(proc.stderr, err)),
            asyncio.ensure_future(feed()),
            asyncio.ensure_future(proc.wait()),
        ]
        timed_out = False
        try:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                timed_out = True
                _killpg(proc)
                _, pending = await asyncio.wait(pending, timeout=KILL_GRACE_S)
                for t in pending:
                    t.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=0.05)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if not isinstance(exc, (BrokenPipeError, ConnectionResetError)):
                    raise SandboxError(f"exec supervision failed: {exc!r}") from exc
        duration = time.monotonic() - start
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        status = _read_status(status_r)
        # bwrap exits once its first child did; its init (and whatever the command left
        # running) dies after it: wait for that too.
        await _init_gone(status.get("child-pid"))
        if timed_out:
            return ExecResult(
                TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated[0], duration
            )
        if self._closed:
            raise SandboxDeadError(f"sandbox {self.id} was closed during exec")

        rc = proc.returncode
        assert rc is not None
        if "exit-code" in status:
            code = int(status["exit-code"])
        elif rc < 0:
            # bwrap itself was killed (not by us): count as an OOM-style kill.
            code = 128 - rc
        elif stderr.startswith("bwrap: execvp"):
            # The command does not exist / is not executable: data, like a shell's 127.
            code = 127
        elif stderr.startswith("bwrap: Can't chdir"):
            # The caller's cwd does not exist: data, like a failed `cd`.
            code = 1
        elif rc == _LAUNCH_FAILED and _JOIN_FAILED in stderr:
            raise SandboxError(f"sandbox {self.id}: {_JOIN_FAILED}")
        else:
            raise SandboxError(f"bwrap failed to set up the sandbox (rc={rc}): {stderr[:2000]}")
        oom = code == 128 + signal.SIGKILL or _memory_error(stderr)
        return ExecResult(code, stdout, stderr, False, oom, truncated[0], duration)

    # ---- files -----------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        """The workspace-relative components of `path`; SandboxPathError if it escapes."""
        if "\0" in path:
            raise SandboxPathError(f"NUL in path {path!r}")
        norm = posixpath.normpath(posixpath.join(self._workdir, path))
        if norm == self._workdir:
            return []
        if not norm.startswith(self._workdir + "/"):
            raise SandboxPathError(f"path {path!r} is outside the workspace {self._workdir}")
        return norm[len(self._workdir) + 1 :].split("/")

    def _chown(self, name: str, dir_fd: int) -> None:
        if self._host_uid is not None:
            os.chown(name, self._host_uid, self._host_uid, dir_fd=dir_fd, follow_symlinks=False)

    def _open_dir(self, parts: list[str], create: bool = False) -> int:
        """Walk `parts` from the workspace root without following any symlink."""
        fd = os.open(self.workspace, _DIR_FLAGS)
        try:
            for part in parts:
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                        self._chown(part, fd)
                        if self._host_uid is None:
                            os.chmod(part, 0o777, dir_fd=fd, follow_symlinks=False)
                    nfd = _open_at(part, _DIR_FLAGS, fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise SandboxPathError(f"{part!r} is a symlink or not a directory") from e
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxDeadError(f"sandbox {self.id} is closed")

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        return await asyncio.to_thread(self._read_sync, path)

    def _read_sync(self, path: str) -> bytes:
        parts = self._parts(path)
        if not parts:
            raise SandboxPathError(f"{path!r} is a directory", "not_regular_file")
        dfd = self._open_dir(parts[:-1])
        try:
            fd = _open_at(
                parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dfd
            )
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise SandboxPathError(f"{path!r} is not a regular file", "not_regular_file")
        limit = read_limit(self.spec)
        if st.st_size > limit:  # sparse: no real file outgrows the workspace
            os.close(fd)
            raise SandboxFileTooLarge(f"{path!r} is {st.st_size} bytes, over {limit}")
        with os.fdopen(fd, "rb") as f:
            return f.read(limit + 1)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_alive()
        raw = data.encode() if isinstance(data, str) else data
        await asyncio.to_thread(self._write_sync, self._parts(path), raw, mode)

    def _write_sync(self, parts: list[str], data: bytes, mode: int) -> None:
        if not parts:
            raise SandboxPathError("cannot write to the workdir itself")
        mode &= 0o777
        if self._host_uid is None:
            mode |= 0o666  # the sandbox uid maps to us, but be permissive anyway
        dfd = self._open_dir(parts[:-1], create=True)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = _open_at(parts[-1], flags, dfd, mode)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise SandboxPathError(f"{'/'.join(parts)!r} is not a regular file")
            with os.fdopen(fd, "wb") as f:
                os.ftruncate(fd, 0)
                os.fchmod(fd, mode)
                if self._host_uid is not None:
                    os.fchown(fd, self._host_uid, self._host_uid)
                f.write(data)
        finally:
            os.close(dfd)

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        self._check_alive()
        await asyncio.to_thread(self._upload_sync, data, self._parts(dest or "."))

    def _upload_sync(self, data: bytes, dest: list[str]) -> None:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            for m in tf:
                name = posixpath.normpath(m.name)
                if name == ".":
                    continue
                if name.startswith("/") or name == ".." or name.startswith("../"):
                    raise SandboxPathError(f"tar member {m.name!r} escapes the destination")
                parts = dest + name.split("/")
                if m.isdir():
                    self._close(self._open_dir(parts, create=True))
                elif m.isreg():
                    f = tf.extractfile(m)
                    assert f is not None
                    self._write_sync(parts, f.read(), (m.mode & 0o777) | 0o600)
                elif m.issym():
                    target = m.linkname
                    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                    if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                        raise SandboxPathError(f"tar symlink {m.name!r} -> {target!r} escapes")
                    dfd = self._open_dir(parts[:-1], create=True)
                    try:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(parts[-1], dir_fd=dfd)
                        os.symlink(target, parts[-1], dir_fd=dfd)
                        self._chown(parts[-1], dfd)
                    finally:
                        os.close(dfd)
                else:
                    raise SandboxPathError(
                        f"tar member {m.name!r}: unsupported type (links/devices)"
                    )

    @staticmethod
    def _close(fd: int) -> None:
        os.close(fd)

    async def download_tar(self, path: str | None = None) -> bytes:
        self._check_alive()
        return await asyncio.to_thread(self._download_sync, self._parts(path or "."))

    def _download_sync(self, parts: list[str]) -> bytes:
        buf = io.BytesIO()
        budget = _Budget(read_limit(self.spec))
        with tarfile.open(fileobj=buf, mode="w") as tf:
            if not parts:
                fd = self._open_dir([])
                try:
                    for item in _walk(fd, "", budget):
                        _add(tf, *item)
                finally:
                    os.close(fd)
            else:
                dfd = self._open_dir(parts[:-1])
                try:
                    st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        fd = self._open_dir(parts)
                        try:
                            _add(tf, parts[-1], st, None, None)
                            for item in _walk(fd, parts[-1], budget):
                                _add(tf, *item)
                        finally:
                            os.close(fd)
                    else:
                        _add(tf, *_entry(dfd, parts[-1], parts[-1], st, budget))
                finally:
                    os.close(dfd)
        return buf.getvalue()


# ---- helpers -------------------------------------------------------------------------------


def _open_at(name: str, flags: int, dir_fd: int, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
            raise SandboxPathError(
                f"{name!r} is a symlink or not a regular file", "not_regular_file"
            ) from e
        raise


_Entry = tuple[str, os.stat_result, bytes | None, str | None]


@dataclass
class _Budget:
    """What is left of a download's byte allowance (`read_limit`): headers count too."""

    left: int

    def take(self, n: int, what: str) -> None:
        self.left -= n + 512
        if self.left < 0:
            raise SandboxFileTooLarge(
                f"the download is over its limit at {what!r} (sparse files, hard links or "
                "too many entries)"
            )


def _entry(dfd: int, name: str, arcname: str, st: os.stat_result, budget: _Budget) -> _Entry:
    if stat.S_ISLNK(st.st_mode):
        budget.take(0, arcname)
        return arcname, st, None, os.readlink(name, dir_fd=dfd)
    if stat.S_ISREG(st.st_mode):
        fd = _open_at(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dfd)
        real = os.fstat(fd)
        if not stat.S_ISREG(real.st_mode):
            os.close(fd)
            raise SandboxPathError(f"{name!r} is not a regular file", "not_regular_file")
        try:
            budget.take(real.st_size, arcname)
        except SandboxFileTooLarge:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as f:
            return arcname, real, f.read(real.st_size), None
    budget.take(0, arcname)
    return arcname, st, None, None


def _walk(dfd: int, prefix: str, budget: _Budget, depth: int = 1) -> Iterator[_Entry]:
    """Entries below the directory `dfd`, never following symlinks; SandboxTreeTooDeep past
    MAX_TREE_DEPTH levels, SandboxFileTooLarge past the budget (both the agent's doing)."""
    for name in sorted(os.listdir(dfd)):
        arc = f"{prefix}/{name}" if prefix else name
        if depth > MAX_TREE_DEPTH:
            raise SandboxTreeTooDeep(f"{arc[:200]!r}... is nested deeper than {MAX_TREE_DEPTH}")
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except OSError:
                continue
            try:
                budget.take(0, arc)
                yield arc, st, None, None
                yield from _walk(sub, arc, budget, depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            try:
                yield _entry(dfd, name, arc, st, budget)
            except SandboxFileTooLarge:
                raise
            except (OSError, SandboxPathError):
                continue


def _add(
    tf: tarfile.TarFile, arc: str, st: os.stat_result, data: bytes | None, link: str | None
) -> None:
    ti = tarfile.TarInfo(arc)
    ti.mtime = int(st.st_mtime)
    ti.mode = stat.S_IMODE(st.st_mode)
    if link is not None:
        ti.type = tarfile.SYMTYPE
        ti.linkname = link
        tf.addfile(ti)
    elif data is not None:
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    elif stat.S_ISDIR(st.st_mode):
        ti.type = tarfile.DIRTYPE
        tf.addfile(ti)


class _JailDied(SandboxError):
    """A jail's stub died before it took its command: nothing of the exec ran."""


def _took_command(ctl: socket.socket) -> bool:
    """Whether the stub acknowledged its command ("S") before its jail ended."""
    try:
        return b"S" in ctl.recv(16, socket.MSG_DONTWAIT)
    except OSError:
        return False


def _ignore_failure(task: asyncio.Future[_Jail]) -> None:
    """A jail started ahead that failed or was cancelled: the next exec starts its own."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a jail started ahead failed: %s", task.exception())


async def _init_gone(pid: object) -> None:
    """Wait (at most KILL_GRACE_S) until the process `pid` -- a jail's init, as bwrap
    reported its host pid -- has exited: its pid namespace, and every process in it, is
    gone by then (the kernel kills and waits for them before the init exits)."""
    if not isinstance(pid, int) or pid <= 0:
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone (or pidfds unsupported)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not done.done():
            done.set_result(None)

    try:
        loop.add_reader(fd, exited)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, KILL_GRACE_S)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _read_status(fd: int) -> dict[str, Any]:
    """Merge the JSON documents bwrap wrote to --json-status-fd (all writers are gone now;
    `fd` is non-blocking since the jail was made)."""
    raw = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            raw += chunk
    return _parse_status(raw)


def _parse_status(raw: bytes) -> dict[str, Any]:
    """Merge the JSON documents in `raw` (bwrap's --json-status-fd output)."""
    merged: dict[str, Any] = {}
    dec = json.JSONDecoder()
    text, i = raw.decode(errors="replace"), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            merged.update(obj)
    return merged


def _is_plain_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _memory_error(stderr: str) -> bool:
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith("MemoryError") or tail.endswith("MemoryError")


def _killpg(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def default_runtime_base() -> Path:
    if _is_root():
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
            _unmount(Path(target))
        shutil.rmtree(folder, ignore_errors=True)
    return len(stale)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(target: Path, options: str) -> str:
    """mount(2) a tmpfs (a syscall, not a `mount` process: ~2 ms less a sandbox). "" on success."""
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV (not MS_NOEXEC: the agent runs programs it writes)
    rc = _libc().mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode())
    if rc != 0:
        err = ctypes.get_errno()
        return f"mount tmpfs on {target}: {os.strerror(err)}"
    return ""


def _remove(root: Path, mount: Path | None) -> None:
    if mount is not None:
        _unmount(mount)
    shutil.rmtree(root, ignore_errors=True)


def _unmount(target: Path) -> None:
    """umount2(2), falling back to a lazy detach if the mount is still busy."""
    path = os.fsencode(target)
    if _libc().umount2(path, 0) != 0:
        _libc().umount2(path, 2)  # MNT_DETACH
