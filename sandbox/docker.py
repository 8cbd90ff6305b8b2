"""The `docker` backend (DESIGN §5): one container per sandbox on the local docker engine.

Images are built locally from images/ (`palaestra images build`); nothing is pulled.
`SandboxSpec.image` names one: None is the base image (``palaestra/base:bookworm``, a
debootstrap bookworm with python3), a bare name such as ``"coding"`` is the family image
``palaestra/coding:latest``, anything with a ``/`` or ``:`` is used as it is.

Each sandbox is a container ``sleep infinity`` under docker's init (tini) that runs as
uid 65534, with no network (``network_mode=none``), a read-only root, a size-limited tmpfs
at /tmp, ``mem_limit = memswap_limit = memory_mb``, ``pids_limit``, ``nano_cpus``, every
capability dropped, ``no-new-privileges``, our seccomp profile (`seccomp.docker_profile`:
the bwrap filter's policy, io_uring and inotify included, plus no new namespaces) in
place of the engine's default, no logging, and a workspace: a tmpfs *volume*
(size ``workspace_mb``, owned by uid 1000) at ``spec.workdir``. A volume rather than a
``--tmpfs`` mount because the archive API (``put_archive``/``get_archive``, which the file
methods use) reads and writes the container's root filesystem view on the host, where
volumes are mounted and plain tmpfs mounts are not.

Every exec runs as uid/gid 1000 through a small shell wrapper::

    cd CWD || exit 1; "$@"; rc=$?; <sweep>; exit $rc

The sweep (builtins only, no fork) SIGKILLs, pass after pass until none is left, every
process of uid 1000 with gid 1000 (an exec's) or with the gid of a persistent shell that
is gone -- never init or the keep-alive (another uid), never a live shell's processes
(see below). So when an exec returns nothing it started is left running (the bwrap
backend's guarantee), although `docker exec` itself has no way to kill what it started. A
fork bomb that outruns one kill per pid for 200 passes gets ``kill -9 -1`` (every process
of uid 1000, live shells included: they restart). On a timeout a second exec runs the
same sweep (it works at the pids limit too); if even that exec cannot start, the
container is restarted (the workspace volume survives, /tmp does not). A timed-out exec
returns with ``exit_code=-9`` within about 0.1-0.3 s of its timeout. Because of that
sweep, execs in one sandbox run one at a time (an asyncio lock).

Persistent shell (`DockerSandbox.shell`)
----------------------------------------

A `palaestra.sandbox.shell.BashSession` over `DockerShellProcess`: one long-lived
``docker exec -i`` per shell (the exec API's hijacked socket, stdin attached, no tty) that
runs ``bash --noprofile --norc -c BOOTSTRAP``: docker's stdin is the control stream (bash
moves it to fd 60 and puts /dev/null on fd 0), stdout the output stream, stderr the status
stream (the multiplexed frames tell them apart). Before the bootstrap, bash reports its pid
and the container's /proc/uptime on the status stream. A command's round trip is frames on
that one socket, no extra exec: about 0.5 ms (median; 1 ms p90) against ~60 ms for an exec.

*Which processes are the shell's.* Each shell launch runs as uid 1000 with a gid of its
own (SHELL_GID_BASE + n, never reused in a sandbox). A process cannot change its gid (no
CAP_SETGID, no-new-privileges stops set-gid files), so unlike a session id or a process
group (``setsid`` leaves one) the gid is a marker untrusted code can neither shed nor
forge: whatever the shell started, however it detached, has the shell's gid; nothing an
exec started has it. That is what lets an exec's sweep spare a live shell, and lets the
shell kill its own:

* a snapshot (before each command) is a point on the container's clock, no exec: host
  CLOCK_BOOTTIME minus the offset measured at launch (0 when the engine shares this
  kernel, the usual case: /proc/<pid>/stat starttimes are on that clock);
* on a timeout, idle timeout or interrupt, a short helper exec (``sh``, builtins only, run
  with the shell's gid) lists the processes of that gid with their parent and start time;
  the job is those that started since the snapshot and do not descend from one that did
  not (the bwrap rule; orphans, whose parent is gone, count as the job), never the shell
  itself; the helper signals them (SIGINT, then SIGKILL, ~60-100 ms per round);
* `kill` (the shell's last stage, `close`, and the shell's own death -- ``exit``, ``exec``,
  killed -- as bwrap's pid namespace would) marks the gid dead and runs a helper that
  SIGKILLs every process of that gid until none is left; every later exec's sweep kills
  that gid too; if no exec can start (pids limit) the sandbox-wide sweep or a container
  restart does it.

*Non-dumpable.* At create, the image's bash is copied once per image (from a container
created and never started, into ``$PALAESTRA_CACHE/docker-shell``), mode 0111, and bound
read-only at SHELL_BINARY. The kernel marks a process that execs a file it cannot read as
non-dumpable, so ``/proc/<bash>/{fd,mem,environ}`` are EACCES for the sandbox's other
processes and ptrace is refused: the control and status pipes and the nonce are out of
reach of programs the commands run, as with bwrap. (The mount cannot be chmodded: it is
read-only and the container has no capabilities; if the host user is uid 1000 the file is
owned by the sandbox user, which changes nothing.) An image with no bash to copy gets the
image's /bin/bash, which is dumpable: see the residual risks in `palaestra.sandbox.shell`.

Residual risks of the docker shell, beyond those of `palaestra.sandbox.shell`:

* the shell and the execs share one pid namespace and uid: a shell's background job
  (alive between commands, by design) can signal or ptrace (docker's default seccomp
  profile allows it; Yama may not) a concurrent exec's processes, e.g. a verifier's, and
  read their /proc. Close the shell before running a verifier (a bwrap shell's jobs can
  tamper with the verifier's files, but cannot see its processes);
* a process of the timed-out command that started within one clock tick (10 ms) of the
  command (or of the launch-time offset measurement, when the engine is on another
  kernel) may be counted as an earlier background job and survive the timeout; it still
  dies at `close`, and at the shell's death;
* signal helpers see pids, not identities: a pid reused between the listing and the kill
  (≈100 ms) by another uid-1000 process gets the signal (which the untrusted code could
  send itself anyway);
* the helper execs are uid-1000 processes the shell's code could kill: a signal round is
  then lost, and the last stage (kill the gid) falls back to the sandbox-wide sweep;
* a bind mount needs the engine to see this host's files (a local engine; with a remote
  or VM engine the create fails on the mount rather than running a dumpable shell).

Output is read from the exec's hijacked HTTP connection with asyncio (the engine's unix
socket; no thread per exec), demultiplexed, and capped at ``max_output`` bytes per stream;
stdin is written to the same connection, then half-closed. Every blocking docker SDK call
runs in `asyncio.to_thread`.

File methods confine paths to the workdir (``SandboxPathError`` otherwise). The engine
extracts and archives as root, but inside the container's own filesystem view (chrooted
since docker 19.03): a symlink the sandboxed code planted resolves inside the sandbox's
own files, never the host's. ``read_file`` refuses anything but a regular file (a symlink
is not followed); uploads are rewritten before they are sent (members owned by 1000, no
absolute or ``..`` names, no links escaping the destination, no hard links or devices).

Containers and volumes carry labels (``palaestra.sandbox``, the owner's host, pid and
process start time); a backend removes those whose owner process is gone at its first
create, so a killed server leaves nothing behind for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import posixpath
import re
import secrets
import socket
import struct
import tarfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from palaestra.sandbox import seccomp
from palaestra.sandbox.base import (
    BASE_PATH,
    DEFAULT_MAX_OUTPUT,
    MAX_TREE_DEPTH,
    Backend,
    ExecResult,
    Sandbox,
    SandboxCreateError,
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
from palaestra.sandbox.shell import BashSession, ShellProcess, bootstrap_script

BASE_IMAGE = "palaestra/base:bookworm"
SANDBOX_UID = 1000
KEEPALIVE_USER = "65534:65534"
LABEL = "palaestra.sandbox"
TIMEOUT_EXIT_CODE = -9
MAX_PIDS = 32768
MAX_WORKSPACE_MB = 64 * 1024
# Shells (`DockerSandbox.shell`) run with gid SHELL_GID_BASE + n, a fresh n per launch;
# execs with gid SANDBOX_UID. Nothing in the container can change its gid (no CAP_SETGID,
# no-new-privileges), so the gid tells an exec's processes from a shell's.
SHELL_GID_BASE = 20000
# Where the execute-only copy of the image's bash is bound (read-only) for the shell.
SHELL_BINARY = "/run/palaestra/bash"


def _sweep(pick: str, *, fast: bool) -> str:
    """A builtins-only (no fork: it must work at the pids limit) sh snippet that SIGKILLs,
    until none is left, every live process of the sandbox user but itself for which `pick`
    (a snippet that sees the process's gid as ``$g``) succeeds; its status is 0 once none is
    left. With `fast`, a pick that still finds processes after 200 passes (a fork bomb
    outrunning one kill per pid) gives way to ``kill -9 -1``: every process of the user,
    shells included. Zombies, which run nothing, are skipped; init reaps orphans, `wait`
    our own children."""
    return (
        '__f() { __n=0; for p in /proc/[0-9]*; do [ "$p" = "/proc/$$" ] && continue; s=; u=; g=; '
        "while read -r k a _; do case $k in State:) s=$a;; Uid:) u=$a;; Gid:) g=$a; break;; "
        'esac; done 2>/dev/null < "$p/status"; [ "$u" = '
        f'{SANDBOX_UID} ] && [ "$s" != Z ] && [ "$s" != X ] || continue; {pick} || continue; '
        '__n=1; [ "$1" = k ] && kill -9 "${p#/proc/}" 2>/dev/null; done; [ $__n = 1 ]; }; '
        "n=0; while __f k && [ $n -lt 200 ]; do wait; n=$((n+1)); done; "
        + (
            "n=0; while __f && [ $n -lt 1000 ]; do kill -9 -1 2>/dev/null; wait; n=$((n+1)); done; "
            if fast
            else ""
        )
        + "! __f"
    )


# After every exec: kill the exec's processes (gid SANDBOX_UID) and those of the shells that
# are gone (their gids: ``$__dead``, set by the wrapper). A live shell's are spared.
_KILL_LOOP = _sweep(
    f'[ "$g" = {SANDBOX_UID} ] || case " $__dead " in *" $g "*) true;; *) false;; esac',
    fast=True,
)
_WRAPPER = (
    'cd "$1" 2>/dev/null || { echo "cannot cd to $1" >&2; exit 1; }; __dead=$2; shift 2; '
    f'"$@"; rc=$?; {_KILL_LOOP}; exit $rc'
)
# A shell's processes (gid ``$1``), all of them: `DockerShellProcess.kill`.
_SHELL_KILL = _sweep('[ "$g" = "$__g" ]', fast=False)
# A shell's processes (gid ``$1``) as lines ``pid ppid starttime state``, then ``.``; then
# reads ``signal pid…`` and signals those: `DockerShellProcess.signal_job`.
_SHELL_JOB = (
    '__g=$1; for p in /proc/[0-9]*; do [ "$p" = "/proc/$$" ] && continue; u=; g=; '
    "while read -r k a _; do case $k in Uid:) u=$a;; Gid:) g=$a; break;; esac; "
    'done 2>/dev/null < "$p/status"; '
    f'[ "$u" = {SANDBOX_UID} ] && [ "$g" = "$__g" ] || continue; '
    'read -r l 2>/dev/null < "$p/stat" || continue; set -- ${l##*) }; '
    '__s=$1; __pp=$2; shift 19; echo "${p#/proc/} $__pp $1 $__s"; done; echo .; '
    'read -r sig pids || exit 0; [ -z "$pids" ] || kill -"$sig" $pids 2>/dev/null; echo done'
)
_CHUNK = 64 * 1024


# A docker reference: [host[:port]/]name[/name...][:tag][@sha256:digest]; never a path.
_IMAGE_REF = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[0-9a-f]{64})?\Z"
)


def image_ref(image: str | None, default: str = BASE_IMAGE) -> str:
    """The docker image a `SandboxSpec.image` names (see the module docstring); a host
    path ('/', '../x', '/root/...') is refused, not handed to the engine."""
    if image is None:
        return default
    if not _IMAGE_REF.match(image) or ".." in image:
        raise SandboxSpecError(
            f"image {image!r}: the docker backend takes an image name (e.g. 'coding' or "
            "'palaestra/base:bookworm'), never a host path"
        )
    if "/" in image or ":" in image:
        return image
    return f"palaestra/{image}:latest"


def _import_docker() -> Any:
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the docker extra is not installed
        raise SandboxCreateError("the docker backend needs `pip install palaestra[docker]`") from e
    return docker


def docker_available(timeout: float = 5.0) -> tuple[bool, str]:
    """Whether the local engine answers (`docker info`); (False, why) if not."""
    try:
        docker = _import_docker()
        client = docker.from_env(timeout=timeout)
        try:
            info = client.info()
        finally:
            client.close()
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return True, f"docker {info.get('ServerVersion', '?')} ({info.get('Driver', '?')})"


def _socket_path() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    url = urlparse(host)
    if url.scheme not in ("unix", ""):
        raise SandboxCreateError(
            f"the docker backend needs the local engine's unix socket, not DOCKER_HOST={host}"
        )
    return url.path or "/var/run/docker.sock"


@cache
def _owner() -> dict[str, str]:
    """Labels that tell whether the process that made a container is still alive."""
    pid = os.getpid()
    return {
        "palaestra.owner.host": socket.gethostname(),
        "palaestra.owner.pid": str(pid),
        "palaestra.owner.start": _start_time(pid),
    }


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(labels: dict[str, str]) -> bool:
    if labels.get("palaestra.owner.host") != socket.gethostname():
        return True  # another machine's: not ours to judge
    pid = labels.get("palaestra.owner.pid", "")
    if not pid.isdigit():
        return False
    start = _start_time(int(pid))
    return bool(start) and start == labels.get("palaestra.owner.start", start)


def _host_limits() -> tuple[int, int]:
    """(memory MiB, CPUs) of this machine."""
    mem = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    return mem, os.cpu_count() or 1


@cache
def _seccomp_profile() -> str:
    """Our seccomp policy as docker's JSON profile (`seccomp.docker_profile`), once."""
    return json.dumps(seccomp.docker_profile(), separators=(",", ":"))


def check_spec(spec: SandboxSpec) -> None:
    """Raise `SandboxSpecError` when the spec asks for more than this host has."""
    image_ref(spec.image)  # a path is refused before anything else
    mem, cpus = _host_limits()
    if spec.memory_mb < 16 or (mem and spec.memory_mb > mem):
        raise SandboxSpecError(f"memory_mb={spec.memory_mb}: must be 16..{mem} on this host")
    if not 0 < spec.cpus <= cpus:
        raise SandboxSpecError(f"cpus={spec.cpus}: must be > 0 and <= {cpus} on this host")
    if not 8 <= spec.pids <= MAX_PIDS:
        raise SandboxSpecError(f"pids={spec.pids}: must be 8..{MAX_PIDS}")
    top = min(MAX_WORKSPACE_MB, mem // 2) if mem else MAX_WORKSPACE_MB
    if not 1 <= spec.workspace_mb <= top:
        raise SandboxSpecError(f"workspace_mb={spec.workspace_mb}: must be 1..{top}")
    if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) in ("/", "/tmp"):
        raise SandboxSpecError(f"workdir must be an absolute path below /: {spec.workdir!r}")
    check_ro_binds(spec)


class DockerBackend(Backend):
    """Creates `DockerSandbox`es on the local engine."""

    name = "docker"

    def __init__(self, *, default_image: str = BASE_IMAGE, client: Any = None) -> None:
        self.default_image = default_image
        self._client = client
        self._started = False
        self._start_lock = asyncio.Lock()
        self._live: set[DockerSandbox] = set()

    @staticmethod
    def available() -> tuple[bool, str]:
        return docker_available()

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = _import_docker().from_env(timeout=60)
            except Exception as e:
                raise SandboxCreateError(f"docker engine unavailable: {e}") from e
        return self._client

    async def _start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            try:
                await asyncio.to_thread(self.client.ping)
            except SandboxError:
                raise
            except Exception as e:
                raise SandboxCreateError(f"docker engine unavailable: {e}") from e
            await asyncio.to_thread(reap_stale, self.client)
            self._started = True

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        check_spec(spec)
        if spec.network:
            raise SandboxCreateError("the docker backend runs sandboxes without network")
        await self._start()
        box = DockerSandbox(
            spec, self.client, image_ref(spec.image, self.default_image), self._live.discard
        )
        try:
            await asyncio.to_thread(box._create_sync)
        except BaseException:
            await asyncio.shield(box.close())
            raise
        self._live.add(box)
        return box

    async def aclose(self) -> None:
        await close_all(self._live)
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None
            self._started = False


def reap_stale(client: Any) -> int:
    """Remove the containers and volumes of palaestra processes that are gone; how many."""
    n = 0
    with contextlib.suppress(Exception):
        for c in client.containers.list(all=True, filters={"label": LABEL}):
            if not _owner_alive(c.labels):
                with contextlib.suppress(Exception):
                    c.remove(force=True)
                    n += 1
    with contextlib.suppress(Exception):
        for v in client.volumes.list(filters={"label": LABEL}):
            if not _owner_alive(v.attrs.get("Labels") or {}):
                with contextlib.suppress(Exception):
                    v.remove(force=True)
    return n


class DockerSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        client: Any,
        image: str,
        on_close: Callable[[DockerSandbox], None] | None = None,
    ) -> None:
        self.spec = spec
        self.id = secrets.token_hex(8)
        self.image = image
        self._client = client
        self._workdir = posixpath.normpath(spec.workdir)
        self._volume = f"palaestra-{self.id}"
        self._container: Any = None
        self._on_close = on_close
        self._closed = False
        self._lock = asyncio.Lock()
        self._sock_path = _socket_path()
        self._shell_binary: str | None = None  # host path, bound at SHELL_BINARY
        self._next_gid = SHELL_GID_BASE
        self._dead: set[int] = set()  # gids of shells that are gone (swept after each exec)

    @property
    def container_id(self) -> str:
        return str(self._container.id) if self._container is not None else ""

    # ---- lifecycle -------------------------------------------------------------------------

    def _create_sync(self) -> None:
        docker = _import_docker()
        spec = self.spec
        labels = {LABEL: self.id, **_owner()}
        mb = spec.workspace_mb
        try:
            self._client.volumes.create(
                name=self._volume,
                driver="local",
                driver_opts={
                    "type": "tmpfs",
                    "device": "tmpfs",
                    "o": f"size={mb}m,nr_inodes={max(8192, mb * 256)},uid={SANDBOX_UID},"
                    f"gid={SANDBOX_UID},mode=0755,nosuid,nodev",
                },
                labels=labels,
            )
            env = {"PATH": BASE_PATH, "HOME": self._workdir, "LANG": "C.UTF-8"}
            self._shell_binary = shell_binary(self._client, self.image)
            mounts = []
            if self._shell_binary is not None:
                mounts.append(
                    docker.types.Mount(
                        SHELL_BINARY, self._shell_binary, type="bind", read_only=True
                    )
                )
            # A family's toolchains (SandboxSpec.ro_binds), read-only, as bwrap binds them.
            mounts += [
                docker.types.Mount(target, host, type="bind", read_only=True)
                for host, target in spec.ro_binds
            ]
            self._container = self._client.containers.run(
                self.image,
                ["sleep", "infinity"],
                detach=True,
                init=True,
                user=KEEPALIVE_USER,
                hostname="sandbox",
                working_dir=self._workdir,
                environment=env,
                labels=labels,
                network_mode="none",
                read_only=True,
                tmpfs={"/tmp": f"size={mb}m,mode=1777,nosuid,nodev,exec"},  # verifier files run
                volumes={self._volume: {"bind": self._workdir, "mode": "rw"}},
                mounts=mounts,
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                pids_limit=spec.pids,
                nano_cpus=int(spec.cpus * 1e9),
                cap_drop=["ALL"],
                security_opt=["no-new-privileges", f"seccomp={_seccomp_profile()}"],
                ipc_mode="private",
                ulimits=[
                    docker.types.Ulimit(name="nofile", soft=1024, hard=1024),
                    docker.types.Ulimit(name="core", soft=0, hard=0),
                ],
                log_config=docker.types.LogConfig(type="none"),
                stdin_open=False,
                tty=False,
            )
        except docker.errors.ImageNotFound as e:
            name = self.image.split("/")[-1].split(":")[0]
            raise SandboxCreateError(
                f"image {self.image} is not in the local docker engine; build it with "
                f"`palaestra images build {name}` ({e.explanation})"
            ) from e
        except docker.errors.DockerException as e:
            raise SandboxCreateError(f"docker could not create the sandbox: {e}") from e

    @property
    def alive(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.to_thread(self._remove_sync)
        finally:
            if self._on_close is not None:
                self._on_close(self)

    def _remove_sync(self) -> None:
        with contextlib.suppress(Exception):
            if self._container is not None:
                self._container.remove(force=True)
        for _ in range(20):
            try:
                self._client.volumes.get(self._volume).remove(force=True)
                return
            except Exception as e:
                if "not found" in str(e).lower() or "no such volume" in str(e).lower():
                    return
                time.sleep(0.05)  # still in use for a moment after the container is gone

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxGone(f"sandbox {self.id} is closed")

    # ---- exec ------------------------------------------------------------------------------

    def _exec_create(
        self, argv: list[str], env: dict[str, str], stdin: bool, gid: int = SANDBOX_UID
    ) -> str:
        docker = _import_docker()
        try:
            res = self._client.api.exec_create(
                self._container.id,
                argv,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                environment=env,
                user=f"{SANDBOX_UID}:{gid}",
                workdir=self._workdir,
            )
        except docker.errors.NotFound as e:
            raise SandboxGone(f"sandbox {self.id}: its container is gone") from e
        except docker.errors.APIError as e:
            if e.status_code == 409:  # not running
                raise SandboxGone(f"sandbox {self.id}: {e.explanation}") from e
            raise SandboxError(f"docker exec failed: {e}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker exec failed: {e}") from e
        return str(res["Id"])

    def _exec_exit(self, exec_id: str) -> int | None:
        for _ in range(50):
            info = self._client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.01)
        return None

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
        self._check_alive()
        argv = command_argv(cmd)
        if timeout is None:
            timeout = self.spec.default_timeout_s
        full_env = sandbox_env(self.spec, self._workdir, env)
        wd = posixpath.normpath(posixpath.join(self._workdir, cwd or "."))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        async with self._lock:
            self._check_alive()
            return await self._exec_locked(
                ["/bin/sh", "-c", _WRAPPER, "sh", wd, self._dead_gids(), *argv],
                full_env,
                data,
                timeout,
                max_output,
            )

    async def _exec_locked(
        self,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        timeout: float,
        max_output: int,
    ) -> ExecResult:
        start = time.monotonic()
        exec_id = await asyncio.to_thread(self._exec_create, argv, env, stdin is not None)
        try:
            reader, writer = await asyncio.open_unix_connection(self._sock_path, limit=_CHUNK * 4)
        except OSError as e:
            raise SandboxError(f"cannot reach the docker engine: {e}") from e
        out, err = bytearray(), bytearray()
        truncated = False
        timed_out = False
        try:
            await self._start_exec(reader, writer, exec_id)
            feeder = None
            if stdin is not None:
                feeder = asyncio.create_task(_feed(writer, stdin))

            async def pump() -> None:
                nonlocal truncated
                while True:
                    try:
                        head = await reader.readexactly(8)
                    except asyncio.IncompleteReadError:
                        return
                    kind, size = head[0], struct.unpack(">I", head[4:])[0]
                    payload = await reader.readexactly(size)
                    buf = err if kind == 2 else out
                    room = max_output - len(buf)
                    if len(payload) > room:
                        truncated = True
                        if room > 0:
                            buf += payload[:room]
                    else:
                        buf += payload

            remaining = max(0.0, timeout - (time.monotonic() - start))
            pumping = asyncio.ensure_future(pump())
            try:
                await asyncio.wait_for(asyncio.shield(pumping), remaining)
            except TimeoutError:
                timed_out = True
                await self._kill_all()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(pumping), 0.5)
            finally:
                if not pumping.done():
                    pumping.cancel()
                if feeder is not None and not feeder.done():
                    feeder.cancel()
            if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
                exc = pumping.exception()
                raise SandboxError(f"exec stream failed: {exc!r}") from exc
        except asyncio.IncompleteReadError as e:
            raise SandboxError(f"the docker engine closed the exec stream: {e!r}") from e
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        duration = time.monotonic() - start
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        if timed_out:
            return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated, duration)
        self._check_alive()
        code = await asyncio.to_thread(self._exec_exit, exec_id)
        if code is None:
            await self._kill_all()
            raise SandboxError(f"sandbox {self.id}: the exec ended without an exit code")
        if code >= 128:
            # The wrapper itself may have been killed (its sweep never ran): sweep now.
            await self._kill_all()
            if not await asyncio.to_thread(self._running):
                raise SandboxGone(f"sandbox {self.id}: its container stopped")
        oom = code == 137 or _memory_error(stderr)
        return ExecResult(code, stdout, stderr, False, oom, truncated, time.monotonic() - start)

    async def _start_exec(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exec_id: str
    ) -> None:
        version = self._client.api.api_version
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        head = (
            f"POST /v{version}/exec/{exec_id}/start HTTP/1.1\r\n"
            "Host: docker\r\nContent-Type: application/json\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        status = await reader.readuntil(b"\r\n\r\n")
        line = status.split(b"\r\n", 1)[0].decode(errors="replace")
        if " 101 " not in line and " 200 " not in line:
            rest = b""
            with contextlib.suppress(Exception):
                rest = await asyncio.wait_for(reader.read(2000), 1.0)
            if " 404 " in line or " 409 " in line:
                raise SandboxGone(f"sandbox {self.id}: {line} {rest.decode(errors='replace')}")
            raise SandboxError(f"docker exec start: {line} {rest.decode(errors='replace')}")

    # ---- persistent shell --------------------------------------------------------------

    def _dead_gids(self) -> str:
        return " ".join(str(g) for g in sorted(self._dead))

    async def _open_exec(
        self, argv: list[str], env: dict[str, str], gid: int, stdin: bool
    ) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
        """Create and start an exec as uid SANDBOX_UID, gid `gid`: its id and hijacked stream."""
        exec_id = await asyncio.to_thread(self._exec_create, argv, env, stdin, gid)
        try:
            reader, writer = await asyncio.open_unix_connection(self._sock_path, limit=_CHUNK * 4)
        except OSError as e:
            raise SandboxError(f"cannot reach the docker engine: {e}") from e
        try:
            await self._start_exec(reader, writer, exec_id)
        except BaseException:
            writer.close()
            raise
        return exec_id, reader, writer

    async def shell(self) -> BashSession:
        """A persistent bash: one long-lived ``docker exec -i`` per session (see the module
        docstring), uid SANDBOX_UID with a gid of its own, the execute-only bash at
        SHELL_BINARY where the image has one to copy (else the image's /bin/bash)."""
        self._check_alive()
        binary = SHELL_BINARY if self._shell_binary is not None else "/bin/bash"
        env = sandbox_env(self.spec, self._workdir)
        # The bash moves the control stream (docker's stdin) off fd 0, and reports its pid
        # and the container's clock on the status stream (stderr) before the bootstrap.
        script = (
            "exec 63<&0 0</dev/null; builtin read -r __p_u _ </proc/uptime; "
            'builtin printf \'P %s %s\\n\' "$$" "$__p_u" >&2; __p_u=\n'
        ) + bootstrap_script(63, 2)

        async def launch() -> DockerShellProcess:
            self._check_alive()
            gid = self._next_gid
            self._next_gid += 1
            try:
                argv = [binary, "--noprofile", "--norc", "-c", script]
                exec_id, reader, writer = await self._open_exec(argv, env, gid, True)
            except BaseException:
                self._dead.add(gid)
                raise
            return DockerShellProcess(self, gid, exec_id, reader, writer)

        session = BashSession(
            launch,
            workdir=self._workdir,
            default_timeout=self.spec.default_timeout_s,
            alive=lambda: not self._closed,
        )
        try:
            await session.start()
        except BaseException:
            await asyncio.shield(session.close())
            raise
        return session

    def _running(self) -> bool:
        try:
            self._container.reload()
        except Exception:
            return False
        return bool(self._container.attrs.get("State", {}).get("Running"))

    def _kill_sync(self) -> bool:
        """Kill every process of the sandbox user; False if no exec could do it."""
        docker = _import_docker()
        for _ in range(3):
            try:
                res = self._client.api.exec_create(
                    self._container.id,
                    ["/bin/sh", "-c", "__dead=$1; " + _KILL_LOOP, "sh", self._dead_gids()],
                    user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                )
                self._client.api.exec_start(res["Id"])
                code = self._client.api.exec_inspect(res["Id"]).get("ExitCode")
                if code == 0:
                    return True
            except docker.errors.DockerException:
                pass
            time.sleep(0.05)
        return False

    async def _kill_all(self) -> None:
        if await asyncio.to_thread(self._kill_sync):
            return
        # No exec could start (pids limit reached?): restart the container; the workspace
        # volume survives.
        try:
            await asyncio.to_thread(self._container.restart, timeout=0)
        except Exception as e:
            raise SandboxGone(f"sandbox {self.id}: could not kill its processes: {e}") from e

    # ---- files -----------------------------------------------------------------------------

    def _rel(self, path: str) -> str:
        """`path` relative to the workdir ("" for the workdir); SandboxPathError if it escapes."""
        if "\0" in path:
            raise SandboxPathError(f"NUL in path {path!r}")
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise SandboxPathError(
                f"path {path!r} is not valid UTF-8 (the docker archive API needs UTF-8 names)"
            ) from None
        norm = posixpath.normpath(posixpath.join(self._workdir, path))
        if norm == self._workdir:
            return ""
        if not norm.startswith(self._workdir + "/"):
            raise SandboxPathError(f"path {path!r} is outside the workspace {self._workdir}")
        return norm[len(self._workdir) + 1 :]

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        rel = self._rel(path)
        if not rel:
            raise SandboxPathError(f"{path!r} is a directory", "not_regular_file")
        return await asyncio.to_thread(self._read_sync, rel, path)

    def _refuse_links(self, rel: str, shown: str, *, file: bool = False) -> None:
        """SandboxPathError if any component of `rel` is a symlink (or, with `file`, if `rel`
        exists and is not a regular file: a FIFO, socket, device or directory).

        The archive API resolves symlinks inside the container, so a planted `d -> /etc`
        would make `read_file("d/passwd")` read outside the workspace. No untrusted process
        runs between execs (each exec ends by killing them all), so this check cannot race.
        """
        docker = _import_docker()
        api = self._container.client.api
        url = api._url("/containers/{0}/archive", self._container.id)
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            here = f"{self._workdir}/{'/'.join(parts[:i])}"
            try:
                res = api.head(url, params={"path": here})
            except Exception as e:
                raise SandboxError(f"docker archive stat {shown!r}: {e}") from e
            if res.status_code == 404:
                return  # the rest does not exist: there is nothing to follow
            if res.status_code >= 400:
                raise SandboxError(f"docker archive stat {shown!r}: HTTP {res.status_code}")
            header = res.headers.get("x-docker-container-path-stat")
            stat = docker.utils.decode_json_header(header) if header else {}
            mode = int(stat.get("mode", 0))
            if mode & _GO_MODE_SYMLINK or stat.get("linkTarget"):
                raise SandboxPathError(
                    f"{shown!r} goes through a symlink ({'/'.join(parts[:i])})",
                    "not_regular_file" if i == len(parts) else "bad_path",
                )
            if file and i == len(parts) and mode & _GO_MODE_NOT_REGULAR:
                raise SandboxPathError(
                    f"{shown!r} exists and is not a regular file", "not_regular_file"
                )

    def _read_sync(self, rel: str, path: str) -> bytes:
        self._refuse_links(rel, path, file=True)
        raw = self._get_archive(f"{self._workdir}/{rel}", path)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
            member = tf.next()
            if member is None or not member.isreg():
                raise SandboxPathError(f"{path!r} is not a regular file", "not_regular_file")
            f = tf.extractfile(member)
            assert f is not None
            return f.read()

    def _get_archive(self, abs_path: str, shown: str) -> bytes:
        """The archive of `abs_path`, at most `read_limit` bytes (SandboxFileTooLarge: more
        is sparse files or hard links the agent made; the stream is dropped unread)."""
        docker = _import_docker()
        limit = read_limit(self.spec) + (1 << 20)
        try:
            stream, _ = self._container.get_archive(abs_path)
            chunks, size = [], 0
            for chunk in stream:
                size += len(chunk)
                if size > limit:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()
                    raise SandboxFileTooLarge(f"{shown!r}: the archive is over {limit} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        except docker.errors.NotFound as e:
            if not self._running():
                raise SandboxGone(f"sandbox {self.id}: its container is gone") from e
            raise FileNotFoundError(shown) from e
        except docker.errors.APIError as e:
            msg = str(e.explanation or e)
            if "not a directory" in msg:
                raise FileNotFoundError(shown) from e
            raise SandboxError(f"docker get_archive {shown!r}: {msg}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker get_archive {shown!r}: {e}") from e

    def _put_archive(self, data: bytes) -> None:
        docker = _import_docker()
        try:
            ok = self._container.put_archive(self._workdir, data)
        except docker.errors.NotFound as e:
            raise SandboxGone(f"sandbox {self.id}: its container is gone") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"docker put_archive: {e.explanation or e}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker put_archive: {e}") from e
        if not ok:
            raise SandboxError("docker put_archive failed")

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_alive()
        rel = self._rel(path)
        if not rel:
            raise SandboxPathError("cannot write to the workdir itself")
        raw = data.encode() if isinstance(data, str) else data
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            _add_parents(tf, rel, set())
            tf.addfile(_info(rel, tarfile.REGTYPE, mode & 0o777, len(raw)), io.BytesIO(raw))
        await asyncio.to_thread(functools.partial(self._refuse_links, rel, path, file=True))
        await asyncio.to_thread(self._put_archive, buf.getvalue())

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        self._check_alive()
        base = self._rel(dest or ".")
        clean, parents = await asyncio.to_thread(_rewrite_upload, data, base)
        for parent in sorted(parents):
            await asyncio.to_thread(self._refuse_links, parent, parent)
        await asyncio.to_thread(self._put_archive, clean)

    async def download_tar(self, path: str | None = None) -> bytes:
        self._check_alive()
        rel = self._rel(path or ".")
        return await asyncio.to_thread(self._download_sync, rel, path or ".")

    def _download_sync(self, rel: str, shown: str) -> bytes:
        if rel:
            self._refuse_links(rel, shown)
        raw = self._get_archive(f"{self._workdir}/{rel}" if rel else self._workdir, shown)
        top = posixpath.basename(self._workdir)
        out = io.BytesIO()
        with (
            tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as src,
            tarfile.open(fileobj=out, mode="w") as dst,
        ):
            for m in src:
                name = m.name
                if not rel:  # the workdir itself: its entries, relative to it
                    if name == top:
                        continue
                    name = name[len(top) + 1 :] if name.startswith(top + "/") else name
                if name.count("/") >= MAX_TREE_DEPTH:  # as bwrap's walk refuses it
                    raise SandboxTreeTooDeep(
                        f"{name[:200]!r}... is nested deeper than {MAX_TREE_DEPTH} levels"
                    )
                if m.isreg():
                    f = src.extractfile(m)
                    assert f is not None
                    ti = _info(name, tarfile.REGTYPE, m.mode & 0o777, m.size, m.mtime)
                    dst.addfile(ti, f)
                elif m.isdir():
                    dst.addfile(_info(name, tarfile.DIRTYPE, m.mode & 0o777, 0, m.mtime))
                elif m.issym():
                    ti = _info(name, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                    ti.linkname = m.linkname
                    dst.addfile(ti)
        return out.getvalue()


# ---- the shell transport -------------------------------------------------------------------


class DockerShellProcess(ShellProcess):
    """A shell over a ``docker exec -i`` hijacked stream (see the module docstring):
    stdin is the control stream, stdout the output, stderr the status stream. Its
    processes are the sandbox user's processes with its gid; snapshots are a point on the
    container's clock, signals go through a short exec."""

    def __init__(
        self,
        box: DockerSandbox,
        gid: int,
        exec_id: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.box = box
        self.gid = gid
        self.exec_id = exec_id
        self.output = asyncio.StreamReader(limit=2**20)
        self.status = asyncio.StreamReader(limit=2**20)
        self.pid: int | None = None  # the shell's pid in the container
        self._offset: float | None = None  # host CLOCK_BOOTTIME - the container's uptime
        self._pre: bytearray | None = bytearray()
        self._reader = reader
        self._writer = writer
        self._finish: asyncio.Future[None] | None = None
        self._pump_task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                head = await self._reader.readexactly(8)
                size = struct.unpack(">I", head[4:])[0]
                payload = await self._reader.readexactly(size)
                if head[0] == 2:
                    self._on_status(payload)
                else:
                    self.output.feed_data(payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if self._pre:
                self.status.feed_data(bytes(self._pre))
            self._pre = None
            self.output.feed_eof()
            self.status.feed_eof()
            self._writer.close()
            # Everything the shell started dies with it (as with bwrap's pid namespace).
            self._finishing()

    def _on_status(self, data: bytes) -> None:
        if self._pre is None:
            self.status.feed_data(data)
            return
        self._pre += data
        i = self._pre.find(b"\n")
        if i < 0:
            if len(self._pre) > 4096:
                self.status.feed_data(bytes(self._pre))
                self._pre = None
            return
        line, rest = bytes(self._pre[:i]), bytes(self._pre[i + 1 :])
        self._pre = None
        parts = line.split()
        if len(parts) == 3 and parts[0] == b"P":
            with contextlib.suppress(ValueError):
                self.pid = int(parts[1])
                offset = time.clock_gettime(time.CLOCK_BOOTTIME) - float(parts[2])
                self._offset = 0.0 if abs(offset) < 1.0 else offset  # 0: the same kernel
        else:
            rest = line + b"\n" + rest
        if rest:
            self.status.feed_data(rest)

    @property
    def exited(self) -> bool:
        return self._pump_task.done()

    async def send(self, data: bytes) -> None:
        if self.exited:
            raise ConnectionError("the shell has exited")
        self._writer.write(data)
        await self._writer.drain()

    async def wait(self) -> int:
        await asyncio.shield(self._pump_task)

        def code() -> int:
            for _ in range(50):
                with contextlib.suppress(Exception):
                    info = self.box._client.api.exec_inspect(self.exec_id)
                    if not info.get("Running") and info.get("ExitCode") is not None:
                        return int(info["ExitCode"])
                time.sleep(0.01)
            return 128 + 9

        return await asyncio.to_thread(code)

    async def snapshot(self) -> object:
        # A point on the container's clock, in the ticks of /proc/<pid>/stat's starttime:
        # the job is what started since (and does not descend from what started before).
        if self._offset is None:
            return None
        return int((time.clock_gettime(time.CLOCK_BOOTTIME) - self._offset) * _CLK_TCK)

    async def signal_job(self, snapshot: object, sig: int) -> int:
        if self.exited or self.box._closed or self.gid in self.box._dead:
            return 0
        since = snapshot if isinstance(snapshot, int) else None
        try:
            return await asyncio.wait_for(self._signal_job(since, sig), 5.0)
        except (TimeoutError, SandboxError, OSError, asyncio.IncompleteReadError):
            return 0

    async def _signal_job(self, since: int | None, sig: int) -> int:
        argv = ["/bin/sh", "-c", _SHELL_JOB, "sh", str(self.gid)]
        _, reader, writer = await self.box._open_exec(argv, {"PATH": BASE_PATH}, self.gid, True)
        try:
            out = bytearray()
            while not (out.startswith(b".\n") or b"\n.\n" in out):
                head = await reader.readexactly(8)
                payload = await reader.readexactly(struct.unpack(">I", head[4:])[0])
                if head[0] == 1:
                    out += payload
            procs: dict[int, tuple[int, int]] = {}
            for line in out.decode(errors="replace").splitlines():
                f = line.split()
                if len(f) == 4 and f[0].isdigit() and f[1].isdigit() and f[2].isdigit():
                    procs[int(f[0])] = (int(f[1]), int(f[2]))
            job = [p for p in procs if p != self.pid and not self._background(p, procs, since)]
            writer.write(f"{sig} {' '.join(map(str, job))}\n".encode())
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            with contextlib.suppress(asyncio.IncompleteReadError):
                while True:  # until the helper is done
                    head = await reader.readexactly(8)
                    await reader.readexactly(struct.unpack(">I", head[4:])[0])
            return len(job)
        finally:
            writer.close()

    def _background(self, pid: int, procs: dict[int, tuple[int, int]], since: int | None) -> bool:
        """Whether `pid` started before `since`, or descends from a process that did."""
        seen: set[int] = set()
        while pid in procs and pid != self.pid and pid not in seen:
            seen.add(pid)
            ppid, start = procs[pid]
            if since is not None and start < since:
                return True
            pid = ppid
        return False

    def _finishing(self) -> asyncio.Future[None]:
        if self._finish is None:
            self._finish = asyncio.ensure_future(self._kill_gid())
        return self._finish

    async def _kill_gid(self) -> None:
        box = self.box
        box._dead.add(self.gid)  # from now on every exec's sweep kills them too
        if box._closed:
            return
        argv = ["/bin/sh", "-c", "__g=$1; " + _SHELL_KILL, "sh", str(self.gid)]
        try:
            exec_id, reader, writer = await box._open_exec(
                argv, {"PATH": BASE_PATH}, self.gid, False
            )
            try:
                with contextlib.suppress(asyncio.IncompleteReadError):
                    while True:
                        head = await reader.readexactly(8)
                        await reader.readexactly(struct.unpack(">I", head[4:])[0])
            finally:
                writer.close()
            code = await asyncio.to_thread(box._exec_exit, exec_id)
            if code == 0:
                return
        except (SandboxError, OSError, asyncio.IncompleteReadError):
            if box._closed:
                return
        # No exec could do it (pids limit?): the sandbox-wide sweep, or a restart.
        with contextlib.suppress(SandboxError):
            await box._kill_all()

    async def kill(self) -> None:
        if not self.exited:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._finishing())
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pump_task), 5.0)
        if self._finish is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._finish), 10.0)


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def shell_binary(client: Any, image: str) -> str | None:
    """The host path of an execute-only (mode 0111) copy of `image`'s bash, made once per
    image (from a container that is created, never started); None if it has none."""
    try:
        image_id = str(client.images.get(image).id).split(":")[-1][:20]
    except Exception:
        return None
    cache = Path(os.environ.get("PALAESTRA_CACHE", Path.home() / ".cache" / "palaestra"))
    dest = cache / "docker-shell" / f"bash-{image_id}"
    if dest.is_file():
        return str(dest)
    try:
        cid = client.api.create_container(
            image,
            command=["true"],
            network_disabled=True,
            labels={LABEL: "shell-binary", **_owner()},  # reaped if we die right here
        )["Id"]
    except Exception:
        return None
    data = None
    try:
        for path in ("/usr/bin/bash", "/bin/bash"):
            with contextlib.suppress(Exception):
                stream, _ = client.api.get_archive(cid, path)
                with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as tf:
                    m = tf.next()
                    f = tf.extractfile(m) if m is not None and m.isreg() else None
                    if f is not None:
                        data = f.read()
                        break
    finally:
        with contextlib.suppress(Exception):
            client.api.remove_container(cid, force=True)
    if not data:
        return None
    dest.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o111)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return str(dest)


# ---- helpers -------------------------------------------------------------------------------


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def _memory_error(stderr: str) -> bool:
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith("MemoryError") or tail.endswith("MemoryError")


def _info(name: str, kind: bytes, mode: int, size: int = 0, mtime: float | None = None) -> Any:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.size = size
    ti.uid = ti.gid = SANDBOX_UID
    ti.uname = ti.gname = "sandbox"
    ti.mtime = int(time.time() if mtime is None else mtime)
    return ti


def _add_parents(tf: tarfile.TarFile, rel: str, done: set[str]) -> None:
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in done:
            done.add(d)
            tf.addfile(_info(d, tarfile.DIRTYPE, 0o755))


# Go's os.FileMode bits, as the archive API's stat header reports them.
_GO_MODE_SYMLINK = 1 << 27
_GO_MODE_NOT_REGULAR = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21)


def _rewrite_upload(data: bytes, base: str) -> tuple[bytes, set[str]]:
    """The upload as a tar rooted at the workdir, and the parent folders it writes into.

    SandboxPathError (see the module doc) for escapes, including a member that goes
    through a symlink of the same archive (`s1 -> .`, `s1/s2 -> ..`, `s1/s2/x`); the
    caller checks the parents for symlinks already in the container.
    """
    out = io.BytesIO()
    done: set[str] = set()
    links: set[str] = set()
    parents: set[str] = set()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as src,
        tarfile.open(fileobj=out, mode="w") as dst,
    ):
        if base:
            _add_parents(dst, base + "/x", done)
        for m in src:
            name = posixpath.normpath(m.name)
            if name == ".":
                continue
            if name.startswith("/") or name == ".." or name.startswith("../") or "\0" in name:
                raise SandboxPathError(f"tar member {m.name!r} escapes the destination")
            full = f"{base}/{name}" if base else name
            above = [posixpath.join(*full.split("/")[:i]) for i in range(1, full.count("/") + 1)]
            if any(p in links for p in above):
                raise SandboxPathError(f"tar member {m.name!r} goes through a symlink")
            if above:
                parents.add(above[-1])
            _add_parents(dst, full, done)
            if m.isdir():
                if full not in done:
                    done.add(full)
                    dst.addfile(_info(full, tarfile.DIRTYPE, (m.mode & 0o777) | 0o700))
            elif m.isreg():
                f = src.extractfile(m)
                assert f is not None
                ti = _info(full, tarfile.REGTYPE, (m.mode & 0o777) | 0o600, m.size, m.mtime)
                dst.addfile(ti, f)
            elif m.issym():
                target = m.linkname
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                    raise SandboxPathError(f"tar symlink {m.name!r} -> {target!r} escapes")
                ti = _info(full, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                ti.linkname = target
                dst.addfile(ti)
                links.add(full)
            else:
                raise SandboxPathError(f"tar member {m.name!r}: unsupported type (links/devices)")
    return out.getvalue(), parents
