"""One-shot Python sandboxes forked from a zygote (a fork server).

Forking an interpreter that is already running costs a fraction of a fresh ``bwrap …
python3 -I -S -c CODE`` (docs/reference/sandboxes.md has the figures).

Design
------
* **The jail.**  One long-lived ``/usr/bin/python3 -I -S`` process, the *zygote*, runs
  inside a bwrap jail built like the bwrap backend's (read-only ``/usr``, the same ``/etc``
  subset and synthetic passwd, every namespace unshared: no network, cleared environment,
  uid/gid 1000, started through ``setpriv`` as host uid 1000 when we are root), but
  *without* ``--disable-userns``: its children need one more user namespace.  The jail's
  root, ``/dev`` and everything else are read-only; ``/work`` and ``/tmp`` are empty
  directories that every child covers with its own tmpfs.
* **The zygote never sees task data.**  It pre-imports what programs commonly need and
  waits on a ``SOCK_SEQPACKET`` control socket.  Per run, the server sends it a small JSON
  control message (run id, timeout, memory and workspace limits) plus three file
  descriptors by ``SCM_RIGHTS``: a sealed memfd holding the files and then the program's
  stdin, and the write ends of fresh stdout/stderr pipes.  The program's source is the
  first file of that memfd.  The zygote forks and closes its copies at once; only the
  child reads the memfd.  So no child can find another task's data in memory it
  inherited from the zygote.
* **The child** (``C``) ``unshare``\\ s user, mount, pid, ipc, uts and network namespaces,
  maps uid/gid 1000 to itself (``setgroups`` denied), makes every mount private and mounts
  fresh tmpfs on ``/work`` (``workspace_mb``), ``/tmp`` and ``/dev/shm`` and a fresh devpts
  instance, then forks the *grandchild* (``G``), pid 1 of the new pid namespace, with
  ``PR_SET_PDEATHSIG = SIGKILL``.  ``G`` mounts a fresh ``/proc``, brings up loopback,
  sets ``user.max_user_namespaces = 0`` in its own user namespace (no further namespaces
  can be created below it), unpacks the files into ``/work``, sets rlimits (AS =
  ``memory_mb``, FSIZE = ``workspace_mb``, CORE 0, NOFILE 1024, NPROC), drops every
  capability (bounding set, ambient set, ``capset`` to empty, ``PR_SET_NO_NEW_PRIVS``),
  installs the bwrap backend's seccomp filter (`palaestra.sandbox.seccomp`: the zygote
  itself and ``C`` run without it, since they need mount and nested namespaces),
  closes every descriptor but 0/1/2 and runs the program as ``__main__`` of a fresh
  module (``sys.argv == ["-c"]``), with the exit status ``python3 -c`` would give.
* **Timeouts.**  The zygote (single-threaded: ``select`` over the control socket and a
  SIGCHLD wake-up pipe, a heap of deadlines) SIGKILLs ``C`` on its deadline; ``G`` dies
  of its parent-death signal, and with it (pid 1) the whole pid namespace.  The zygote
  reports ``{exit code, timed out}``; the server returns once that report arrived and
  both output pipes reached EOF (bounded wait), so every process is dead by timeout + 1 s.
  A run whose awaiting task is cancelled is killed the same way.
* **Failures.**  If the zygote dies, runs in flight raise `SandboxError` and the next run
  starts a new one.  If it cannot start at all (no bwrap, no nested user namespaces),
  `run` raises `ForkServerUnavailable` so callers can fall back to a bwrap sandbox.

Isolation, per run: its own user/mount/pid/ipc/uts/net namespaces, so it sees only its own
processes, its own empty ``/work``, ``/tmp`` and ``/dev/shm``, no network but its own
loopback, no host path outside ``/usr`` and a few ``/etc`` files; uid 1000 with no
capabilities, on the host as well (host uid 1000 when the server runs as root).

Residual risks / differences from a bwrap exec:

* All runs share one kernel view of the jail's (read-only) root and ``/dev`` device nodes
  and the host uid 1000.  Each run has a cgroup of its own (`palaestra.sandbox.runcgroup`:
  ``pids``, memory = ``memory_mb`` + `CGROUP_SLACK_MB`, CPU = ``cpus``), joined by the
  run's first process before it starts anything and killed whole at the deadline, so a
  fork bomb or memory hog in one run stays in it; the budgets the kernel counts per uid
  (inotify, POSIX message queues) are closed by the seccomp filter.  Without cgroups (the
  server not root, no usable hierarchy: ``cgroup_status`` says why) only the rlimits
  bound a run, as for the bwrap backend.
* The program runs as pid 1 of its namespace: signals it sends itself without a handler
  installed (``SIGTERM``, ``SIGINT``…) are ignored, unlike in ``python3 -c``.
* The interpreter state is a fork of the zygote's: modules it pre-imported are already in
  ``sys.modules`` (harmless, but a program can observe it), and the zygote's own code and
  control parameters of other runs (ids, limits) are in memory; no task data is.
* A kernel bug in nested user namespaces is the main escape risk, as for bwrap itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from palaestra.sandbox import programs, seccomp
from palaestra.sandbox.base import (
    BASE_PATH,
    ExecResult,
    SandboxError,
    SandboxSpec,
    sandbox_env,
)
from palaestra.sandbox.bwrap.host import bwrap_available, is_root
from palaestra.sandbox.bwrap.jail import KILL_GRACE_S
from palaestra.sandbox.bwrap.launch import CgroupMode, resolve_cgroups
from palaestra.sandbox.bwrap.mounts import etc_args, usr_symlinks, write_etc_files
from palaestra.sandbox.cgroups import CgroupManager
from palaestra.sandbox.fdpipes import PipeReader
from palaestra.sandbox.forkrun import (
    PYTHON,
    WORKDIR,
    ForkServerUnavailable,
    PythonRun,
    payload,
    sealed_memfd,
)
from palaestra.sandbox.preamble import (
    SANDBOX_GID,
    SANDBOX_UID,
    TIMEOUT_EXIT_CODE,
    memory_error,
)
from palaestra.sandbox.runcgroup import RunCgroup
from palaestra.sandbox.spawn import drain_capped, spawn

log = logging.getLogger("palaestra.sandbox.forkserver")

START_TIMEOUT_S = 15.0
# A run's memory cgroup allows this much above its memory_mb (RLIMIT_AS per process): what
# the forked interpreter copies of the zygote's pages, so one process meets its own
# MemoryError first, while all of a run's processes together stay bounded.
CGROUP_SLACK_MB = 64
# How long past a run's own timeout we wait for the zygote's report before calling it hung.
REPORT_SLACK_S = 5.0

# What `run` looks like, for callers that only need "run this Python program somewhere fresh".
# The zygote (programs/zygote.py) runs inside the bwrap jail as `python3 -I -S -c ZYGOTE <ctl
# fd> <seccomp hex>`. It never reads task data: it forks on control messages and closes the
# descriptors it was handed.
ZYGOTE = programs.text("zygote.py")


def _seccomp_hex() -> str:
    """The bwrap backend's seccomp program, for the zygote to apply in each run ("": none)."""
    try:
        return seccomp.filter_bytes().hex()
    except seccomp.SeccompUnsupported:
        return ""


class PythonForkServer:
    """Fresh, one-shot Python sandboxes forked from a jailed zygote (see the module docstring).

    One per server process; started lazily by the first `run`, restarted if it dies.
    """

    def __init__(
        self,
        runtime_dir: Path | None = None,
        *,
        host_uid: int = SANDBOX_UID,
        net_ns: bool = True,
        nproc: int = 4096,
        cgroups: CgroupMode | CgroupManager = "auto",
        pids: int = SandboxSpec.pids,
        cpus: float | None = SandboxSpec.cpus,
    ) -> None:
        if runtime_dir is None:
            if is_root():
                runtime_dir = Path("/run/palaestra")
            else:
                runtime_dir = Path(tempfile.gettempdir()) / f"palaestra-{os.getuid()}"
        self.runtime_dir = runtime_dir
        self._host_uid: int | None = host_uid if is_root() else None
        self.net_ns = net_ns
        self.nproc = nproc
        # Each run gets a cgroup of its own, as a bwrap sandbox does: pids, memory, CPU.
        self.pids, self.cpus = pids, cpus
        self.cgroups, self.cgroup_status = resolve_cgroups(cgroups)
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=64)
        self._tasks: list[asyncio.Task[None]] = []
        self._etc_root: Path | None = None
        self._started_once = False
        self.unavailable: str | None = None  # why it can never start here
        self.starts = 0
        self._closed = False
        self._cleanups: set[asyncio.Future[None]] = set()  # run cgroups being removed

    @property
    def alive(self) -> bool:
        return self._sock is not None and self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        """The host pid of the jail's outermost process (setpriv/bwrap), for tests."""
        return self._proc.pid if self._proc is not None else None

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the zygote now (idempotent). Raises ForkServerUnavailable."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._abandon("the event loop changed")
            self._loop, self._lock = loop, asyncio.Lock()
        assert self._lock is not None
        async with self._lock:
            if self.alive:
                return
            if self.unavailable is not None:
                raise ForkServerUnavailable(self.unavailable)
            try:
                await self._spawn()
            except ForkServerUnavailable as exc:
                self._abandon(str(exc))
                if not self._started_once:
                    self.unavailable = str(exc)
                    log.warning("python fork server unavailable, using bwrap sandboxes: %s", exc)
                raise
            self._started_once = True

    def _bwrap_argv(self, bwrap: str, etc: Path, fd: int) -> list[str]:
        a = [bwrap, "--ro-bind", "/usr", "/usr", *usr_symlinks(), *etc_args()]
        for f in ("passwd", "group", "hosts"):
            a += ["--ro-bind", str(etc / f), f"/etc/{f}"]
        a += ["--proc", "/proc", "--dev", "/dev", "--dir", "/dev/shm", "--remount-ro", "/dev"]
        a += ["--dir", WORKDIR, "--dir", "/tmp", "--remount-ro", "/"]
        a += ["--unshare-all", "--unshare-user"]
        a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", "sandbox"]
        a += ["--die-with-parent", "--new-session", "--clearenv"]
        for k, v in sandbox_env(SandboxSpec(), WORKDIR).items():
            a += ["--setenv", k, v]
        a += ["--chdir", "/", "--", PYTHON, "-I", "-S", "-c", ZYGOTE, str(fd), _seccomp_hex()]
        if self._host_uid is not None:
            uid = str(self._host_uid)
            a = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *a]
        return a

    async def _spawn(self) -> None:
        ok, why = await asyncio.to_thread(bwrap_available)
        if not ok:
            raise ForkServerUnavailable(why)
        try:
            self.runtime_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="forkserver-", dir=self.runtime_dir))
            os.chmod(root, 0o711)
            etc = root / "etc"
            etc.mkdir(mode=0o755)
            write_etc_files(etc, WORKDIR)
        except OSError as e:
            raise ForkServerUnavailable(f"cannot create the fork server's files: {e}") from e
        self._etc_root = root
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = await spawn(
                *self._bwrap_argv(why, etc, theirs.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                cwd="/",
                env={"PATH": BASE_PATH},
            )
        except OSError as e:
            ours.close()
            raise ForkServerUnavailable(f"cannot start bwrap: {e}") from e
        finally:
            theirs.close()
        self.starts += 1
        self._stderr.clear()
        self._tasks = [asyncio.ensure_future(self._pump_stderr(self._proc))]
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            hello = await asyncio.wait_for(loop.sock_recv(ours, 4096), START_TIMEOUT_S)
        except (TimeoutError, OSError) as e:
            ours.close()
            raise ForkServerUnavailable(f"the zygote did not start: {e!r} {self._errtail()}") from e
        if not hello:
            ours.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._proc.wait(), 2.0)
            await asyncio.sleep(0)
            raise ForkServerUnavailable(f"the zygote exited at start: {self._errtail()}")
        self._sock = ours
        loop.add_reader(ours.fileno(), self._on_readable)
        self._tasks.append(asyncio.ensure_future(self._watch(self._proc)))
        # Probe: one trivial run proves nested namespaces work here.
        try:
            probe = await self._run_started(
                PythonRun(
                    "import os\nassert os.getcwd() == '/work'",
                    timeout=10.0,
                    max_output=4096,
                    memory_mb=256,
                    workspace_mb=1,
                )
            )
        except SandboxError as e:
            raise ForkServerUnavailable(f"the fork server's probe run failed: {e}") from e
        if probe.exit_code != 0:
            raise ForkServerUnavailable(
                f"the fork server's probe run exited {probe.exit_code}: {probe.stderr[-2000:]}"
            )

    def _errtail(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")[-2000:]

    async def _pump_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(4096):
            self._stderr.append(chunk)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        if proc is self._proc:
            self._abandon(f"the fork server exited ({rc}): {self._errtail()}")

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as e:
                self._abandon(f"the fork server's socket failed: {e}")
                return
            if not data:
                self._abandon(f"the fork server hung up: {self._errtail()}")
                return
            msg = json.loads(data)
            fut = self._pending.pop(msg.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def _abandon(self, reason: str) -> None:
        """Forget the current zygote (killing it) and fail every run in flight."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(Exception):
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.remove_reader(sock.fileno())
            sock.close()
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for task in self._tasks:
            if not task.done() and task is not asyncio.current_task():
                with contextlib.suppress(RuntimeError):
                    task.cancel()
        self._tasks = []
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_exception(SandboxError(f"the Python fork server died: {reason}"))
        if self._etc_root is not None:
            shutil.rmtree(self._etc_root, ignore_errors=True)
            self._etc_root = None

    async def aclose(self) -> None:
        self._closed = True
        proc = self._proc
        self._abandon("closed")
        if proc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 2.0)
        if self._cleanups:
            await asyncio.wait(set(self._cleanups), timeout=5.0)

    # ---- runs ------------------------------------------------------------------------------

    async def run(self, job: PythonRun) -> ExecResult:
        """Run `code` as `python3 -I -S -c code` in a fresh sandbox whose /work holds `files`.

        Timeouts, exit codes and truncation are data; faults raise SandboxError
        (ForkServerUnavailable when it cannot start here at all)."""
        if self._closed:
            raise SandboxError("the Python fork server is closed")
        if not self.alive or self._loop is not asyncio.get_running_loop():
            await self.start()
        return await self._run_started(job)

    async def _run_started(self, job: PythonRun) -> ExecResult:
        sock = self._sock
        if sock is None:
            raise SandboxError("the Python fork server is not running")
        self._next_id += 1
        run_id = self._next_id
        rc = None
        if self.cgroups is not None:
            mem = (int(job.memory_mb) + CGROUP_SLACK_MB) << 20
            name = f"fork-{self.starts}-{run_id}"
            rc = RunCgroup(self.cgroups, name, mem, self.pids, self.cpus)
        try:
            return await self._run_in(sock, rc, run_id, job)
        finally:
            if rc is not None:  # off the result's path; `aclose` waits for it
                task = asyncio.ensure_future(rc.cleanup())
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)

    async def _run_in(
        self,
        sock: socket.socket,
        rc: RunCgroup | None,
        run_id: int,
        job: PythonRun,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        memfd = sealed_memfd(payload(job.code, job.files, job.stdin))
        timeout, max_output = job.timeout, job.max_output
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sync_ours = sync_theirs = None
        if rc is not None:
            sync_ours, sync_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sync_ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sync_ours.setblocking(False)
        request = {
            "id": run_id,
            "timeout": max(0.001, float(timeout)),
            "memory_mb": int(job.memory_mb),
            "workspace_mb": int(job.workspace_mb),
            "nproc": self.nproc,
            "net_ns": self.net_ns,
            "cgroup": rc is not None,
        }
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[run_id] = fut
        start = time.monotonic()
        pipes: list[PipeReader] = []
        placing: asyncio.Future[None] | None = None
        killer: asyncio.Future[None] | None = None
        try:
            fds = [memfd, out_w, err_w]
            if sync_theirs is not None:
                fds.append(sync_theirs.fileno())
            try:
                await self._send(sock, json.dumps(request).encode(), fds)
            finally:
                for fd in (memfd, out_w, err_w):
                    os.close(fd)
                if sync_theirs is not None:
                    sync_theirs.close()
            if rc is not None and sync_ours is not None:
                placing = asyncio.ensure_future(rc.place(sync_ours))
                killer = asyncio.ensure_future(rc.kill_at(float(timeout)))
            out_pipe, out_reader = PipeReader.open(out_r)
            pipes.append(out_pipe)
            err_pipe, err_reader = PipeReader.open(err_r)
            pipes.append(err_pipe)
            out, err = bytearray(), bytearray()
            drains = [
                asyncio.ensure_future(drain_capped(out_reader, out, max_output)),
                asyncio.ensure_future(drain_capped(err_reader, err, max_output)),
            ]
            try:
                try:
                    report = await asyncio.wait_for(
                        asyncio.shield(fut), float(timeout) + REPORT_SLACK_S
                    )
                except TimeoutError:
                    self._abandon("it did not report a run past its deadline")
                    raise SandboxError("the Python fork server hung") from None
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        await self._send(sock, json.dumps({"kill": run_id}).encode(), [])
                    raise
                done, _ = await asyncio.wait(drains, timeout=KILL_GRACE_S)
                truncated = any(t.result() for t in done)
            finally:
                for t in drains:
                    t.cancel()
        finally:
            for task in (placing, killer):
                if task is not None and not task.done():
                    task.cancel()
            if sync_ours is not None:
                sync_ours.close()
            self._pending.pop(run_id, None)
            for pipe in pipes:
                pipe.close()
            for fd in (out_r, err_r)[len(pipes) :]:  # not yet handed to a PipeReader
                os.close(fd)
        duration = time.monotonic() - start
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        if report.get("timed_out") or (rc is not None and rc.killed):
            return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated, duration)
        if report.get("setup_error"):
            raise SandboxError(f"the fork server could not set up the run: {report['setup_error']}")
        code_ = int(report["code"])
        oom = code_ == 128 + signal.SIGKILL or memory_error(stderr)
        if rc is not None:
            oom = oom or rc.oom_killed()
        return ExecResult(code_, stdout, stderr, False, oom, truncated, duration)

    async def _send(self, sock: socket.socket, data: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                socket.send_fds(sock, [data], fds)
                return
            except BlockingIOError:
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_writer(sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(sock.fileno())
            except OSError as e:
                self._abandon(f"sending to it failed: {e}")
                raise SandboxError(f"the Python fork server died: {e}") from e
