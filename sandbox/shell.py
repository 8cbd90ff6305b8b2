"""The persistent shell (DESIGN §5 `Sandbox.shell()`): one long-lived bash per session.

Layers
======

* `BashSession` (backend-agnostic) holds the session logic: framing, per-command nonces,
  the head-and-tail output cap, the wall-clock and idle-output timeouts, interrupt
  escalation, restart of a dead shell and `close`.
* `ShellProcess` is the small *process transport* a backend provides: a running
  ``bash --noprofile --norc -c BOOTSTRAP`` with three byte streams (a control stream
  into the shell, its merged stdout+stderr, a status stream out of it) and process
  control (snapshot the processes alive now, signal the ones started since, kill it all).
  `LocalShellProcess` is the transport for a shell that is a local child process whose
  process tree the host can see in ``/proc`` (the bwrap backend); docker (``docker exec
  -i`` / attach) and e2b would provide their own.

Protocol
========

The bootstrap (`bootstrap_script`) moves the control fd to 60, the status fd to 61 and a
copy of the output to 62, sets ``trap : INT`` (a shell that is not interactive would
otherwise act on a SIGINT its foreground job died of) and loops:

1. read a header line ``<nonce> <length>`` and then the command (NUL-terminated; long
   commands are read with ``head -c``, bash's ``read`` takes one syscall per byte on a
   pipe) from fd 60;
2. ``eval`` the command with ``</dev/null >&62 2>&1`` and fds 60-62 closed: the command
   never holds the control or status pipe, and its stdin/stdout/stderr are reset for every
   command (an ``exec >file`` or ``exec 1>&-`` lasts until the end of its command);
3. write the end-of-output marker ``\\x1eP<nonce>\\x1f`` to fd 62 (the output pipe), then
   the record ``<nonce> <exit code> <$PWD>\\0`` to fd 61 (the status pipe).  xtrace is
   switched off around all of this (and back on for the next command) so ``set -x`` does
   not print the framing.

The host, for each command, picks a fresh 128-bit nonce, sends it with the command, and
takes as the command's result the first status record carrying that nonce; the output is
everything on the output pipe up to the marker carrying that nonce.  Output a command
prints (stdout or stderr, the two are merged into one stream, as in a terminal) is never
parsed for anything but that marker; output that arrives between commands (a background
job's) is kept (its last 64 KiB) and shows at the start of the next command's output.

Why a command cannot forge its result
-------------------------------------

The user's command runs as the shell's uid, so on its own the status pipe would be
reachable: through inherited fds, through ``/proc/<bash>/fd/N`` (reopening a pipe needs
only PTRACE_MODE_READ), through ``/proc/<bash>/mem`` (the nonce is in bash's memory).
What stops it:

* **fd hygiene.** fds 60-62 are closed for the command; bash keeps its saved copies
  close-on-exec, so no *program* the command runs has them.  The bwrap namespace's init
  (pid 1, dumpable, same uid) holds only /dev/null and the output pipe.
* **a non-dumpable shell.** bash is exec'ed from an *execute-only* copy of the bash binary
  (mode 0111, owned by root on the host; `prepare_shell_binary`).  The kernel marks a
  process that execs a file it cannot read as non-dumpable, so for every process of the
  sandbox ``/proc/<bash>/{fd,mem,environ,maps}`` are EACCES and ptrace is refused (the
  bwrap backend's seccomp filter refuses ptrace anyway).  ``/proc/<bash>/cmdline`` stays
  readable: it holds only the bootstrap, which holds no secret.
* **per-command nonces.** The status record and the output marker only count with the
  current command's nonce, which exists only in the host and in the shell's memory from
  the moment the command is sent; it changes every command, so seeing an old one (e.g. by
  reading the output pipe) is useless.  The status parser looks for ``<nonce> `` anywhere
  in the stream, so bytes a writer injects around the real record cannot hide it.

Residual risks (documented, accepted):

* **Code that runs *as the shell*** -- builtins, ``eval``, ``source``, functions, ``( )``
  and ``{ …; } &`` subshells (forks of bash without exec) -- is the shell: it can read the
  nonce variable, write to bash's saved copy of the status fd (fd 10-12 during a command),
  read the control pipe, redefine the loop's helpers or ``exit``.  So a command that
  *sources* hostile shell code can make this session report wrong exit codes / cwds or
  end commands early, for itself.  That only deceives the agent about its own session:
  the shell holds no host secret, and verifiers use `Sandbox.exec`, never this channel.
* A program can read the output pipe (``/proc/self/fd/1`` reopened for reading) and steal
  output, including the marker; the host then waits MARKER_GRACE_S after the status and
  returns what it has.  It can send signals to the shell (``kill -STOP $PPID``): the
  command then times out and the shell is killed and restarted.
* If a backend cannot make the shell non-dumpable (no execute-only binary), a program of
  the same uid can reopen the status pipe through ``/proc/<bash>/fd`` and, with ptrace
  or ``/proc/<bash>/mem`` access (no Yama, no seccomp), read the nonce.

Timeouts, interrupt, restart
============================

On a wall-clock timeout, an idle-output timeout (no output for ``idle_timeout`` s) or
`interrupt()`: SIGINT to the foreground job -- every process of the sandbox that did not
exist when the command started and does not descend from one that did (so it includes
what the command started in the background or that escaped with ``setsid``; there is no
terminal, hence no terminal process group: without job control the command's processes
share the shell's group, so they are signalled one by one) -- then, after INT_GRACE_S,
SIGKILL to them (repeated, so the next command of a list dies too; job control, ``set
-m``, is off: with it bash exits when a foreground job dies of SIGINT), and if the shell
still has not come back after KILL_GRACE_S (a builtin loop like ``while :; do :; done``,
``exec sleep``, a stopped shell) the shell itself is killed.  The worst case is timeout +
about 0.8 s.  Background jobs started by *earlier* commands (and what they fork) survive
a timeout; those the timed-out command started are SIGKILLed once the shell is back.
Everything dies on `close()` and when the shell dies (the
sandbox's pid namespace goes with it).

The exit code of a timed-out command is what the shell saw (130 after SIGINT, 137 after
SIGKILL), or -9 if the shell itself had to be killed.  ``exec prog`` replaces the shell:
that command ends when prog does (or on its timeout, by killing it).  After the SIGINT the
rest of a command list goes on, as in any non-interactive shell (``sleep 100; echo x``
prints x), until the SIGKILL stage; bash reports a job it saw killed ("Killed …") in the
output of the next command.  A shell that died (``exit``,
``exec``, killed, ``set -e``) is restarted by the next `run`, whose result says
``restarted=True``; its cwd and variables are back to the start.  The result of the
command during which it died has the shell's exit status as exit code and the workdir as
cwd.  stdin is /dev/null; there is no terminal (``isatty`` is false, no job-control
terminal).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    SandboxError,
    SandboxGone,
    ShellResult,
    ShellSession,
)
from palaestra.sandbox.spawn import spawn

KILLED_EXIT_CODE = -9  # the shell itself had to be killed (as `ExecResult` on a timeout)
INT_GRACE_S = 0.3  # after SIGINT to the foreground job, before SIGKILL
KILL_GRACE_S = 0.4  # after SIGKILL to the job, before killing the shell itself
KILL_REPEAT_S = 0.05
MARKER_GRACE_S = 1.0  # status seen, output marker not (yet): how long to wait for it
START_TIMEOUT_S = 20.0
STRAY_CAP = 64 * 1024  # output between commands kept for the next one (its tail)
LONG_COMMAND = 16 * 1024  # read with `head -c` above this (bash's read is 1 syscall/byte)
CONTROL_FD, STATUS_FD, OUTPUT_FD = 60, 61, 62
_CHUNK = 64 * 1024


def bootstrap_script(control_fd: int, status_fd: int) -> str:
    """The ``bash -c`` program of a session; `control_fd`/`status_fd` are where the
    transport hands bash the control pipe (read) and the status pipe (write)."""
    c, s, o = CONTROL_FD, STATUS_FD, OUTPUT_FD
    close = " ".join(f"{fd}{d}&-" for fd, d in ((control_fd, "<"), (status_fd, ">")) if fd > 2)
    return f"""\
exec {c}<&{control_fd} {s}>&{status_fd} {o}>&1 2>&1 {close}
trap : INT
__p_v=
builtin printf 'ready\\0' >&{s}
while :; do
  {{ IFS=' ' builtin read -r -u {c} __p_n __p_l || builtin exit 0
  if (( __p_l > {LONG_COMMAND} )) && __p_h=$(builtin command -v head); then
    __p_c=$("$__p_h" -c "$__p_l" <&{c}; builtin echo .); __p_c=${{__p_c%.}}
    IFS= builtin read -r -d '' -u {c} __p_x
  else
    IFS= builtin read -r -d '' -u {c} __p_c
  fi; }} 2>/dev/null
  builtin eval "$__p_v$__p_c" </dev/null >&{o} 2>&1 {c}<&- {s}>&- {o}>&-
  {{ __p_r=$?; __p_v=; [[ $- == *x* ]] && {{ __p_v='set -x;'; set +x; }}
  builtin printf '\\036P%s\\037' "$__p_n" >&{o}
  builtin printf '%s %s %s\\0' "$__p_n" "$__p_r" "$PWD" >&{s}; }} 2>/dev/null
done
"""


# ---- the process transport ------------------------------------------------------------------


class ShellProcess(abc.ABC):
    """One running shell, as a backend provides it (see the module docstring)."""

    output: asyncio.StreamReader  # the shell's stdout and stderr, merged
    status: asyncio.StreamReader  # what the shell writes to its status fd

    @abc.abstractmethod
    async def send(self, data: bytes) -> None:
        """Write to the shell's control stream."""

    @abc.abstractmethod
    async def snapshot(self) -> object:
        """Note the processes alive now (the shell's background jobs), before a command."""

    @abc.abstractmethod
    async def signal_job(self, snapshot: object, sig: int) -> int:
        """Send `sig` to the foreground job: the processes started since `snapshot` (never
        the shell itself, nor what descends from a process alive at `snapshot`).
        Returns how many processes were signalled."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Kill the shell and everything it started."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """The shell's exit status once it has exited (128+n after signal n)."""

    @property
    @abc.abstractmethod
    def exited(self) -> bool: ...


class LocalShellProcess(ShellProcess):
    """A shell that is a local child process (bwrap … bash): pipes plus ``/proc`` walks.

    The host pid tree is ``outer`` (bwrap, our child) → ``init`` (the pid namespace's
    pid 1) → ``bash`` → the user's processes; orphans are reparented to ``init``, so the
    sandbox's processes are exactly the descendants of ``init``."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        control: asyncio.StreamWriter,
        status: asyncio.StreamReader,
        on_exit: Callable[[asyncio.subprocess.Process], None] | None = None,
    ) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.output = proc.stdout
        self.status = status
        self._control = control
        self._on_exit = on_exit
        self._init: int | None = None
        self._bash: int | None = None
        self._waiter = asyncio.ensure_future(self._wait())

    @classmethod
    async def spawn(
        cls,
        argv_for: Callable[[str], tuple[list[str], dict[str, Any]]],
        *,
        pass_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
        on_exit: Callable[[asyncio.subprocess.Process], None] | None = None,
    ) -> LocalShellProcess:
        """Start the shell: `argv_for(bootstrap)` gives the argv (and spawn kwargs) that
        runs ``bash --noprofile --norc -c bootstrap`` with the fds it is told about."""
        import fcntl

        loop = asyncio.get_running_loop()
        fds: list[int] = []
        try:
            ctl_r0, ctl_w = os.pipe()
            fds += [ctl_r0, ctl_w]
            st_r, st_w0 = os.pipe()
            fds += [st_r, st_w0]
            # High numbers, so the bootstrap's moves to 60-62 cannot clobber them.
            ctl_r = fcntl.fcntl(ctl_r0, fcntl.F_DUPFD_CLOEXEC, 100)
            fds.append(ctl_r)
            st_w = fcntl.fcntl(st_w0, fcntl.F_DUPFD_CLOEXEC, 100)
            fds.append(st_w)
            argv, kwargs = argv_for(bootstrap_script(ctl_r, st_w))
            try:
                proc = await spawn(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    pass_fds=(ctl_r, st_w, *pass_fds),
                    start_new_session=True,
                    cwd="/",
                    env=env if env is not None else {"PATH": "/usr/bin:/bin"},
                    **kwargs,
                )
            except OSError as e:
                raise SandboxError(f"cannot start the shell: {e}") from e
            for fd in (ctl_r0, st_w0, ctl_r, st_w):
                os.close(fd)
                fds.remove(fd)
            # From here the file objects own the two descriptors: closed through them only,
            # never by number as well (a second close by number can hit a reused number).
            status_pipe = os.fdopen(st_r, "rb", buffering=0)
            fds.remove(st_r)
            control_pipe = os.fdopen(ctl_w, "wb", buffering=0)
            fds.remove(ctl_w)
            try:
                status = asyncio.StreamReader(limit=2**20, loop=loop)
                await loop.connect_read_pipe(
                    lambda: asyncio.StreamReaderProtocol(status, loop=loop), status_pipe
                )
                transport, protocol = await loop.connect_write_pipe(
                    lambda: asyncio.StreamReaderProtocol(
                        asyncio.StreamReader(loop=loop), loop=loop
                    ),
                    control_pipe,
                )
            except BaseException:
                status_pipe.close()
                control_pipe.close()
                raise
            control = asyncio.StreamWriter(transport, protocol, None, loop)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return cls(proc, control, status, on_exit)

    async def _wait(self) -> int:
        try:
            return await self.proc.wait()
        finally:
            with contextlib.suppress(Exception):
                self._control.close()
            if self._on_exit is not None:
                cb, self._on_exit = self._on_exit, None
                cb(self.proc)

    @property
    def exited(self) -> bool:
        return self.proc.returncode is not None

    async def send(self, data: bytes) -> None:
        self._control.write(data)
        await self._control.drain()

    async def wait(self) -> int:
        rc = await asyncio.shield(self._waiter)
        return 128 - rc if rc < 0 else rc

    def _find_shell(self) -> None:
        if self._bash is not None:
            return
        inits = _children(self.proc.pid)
        if len(inits) != 1:
            raise SandboxError(f"shell: expected one namespace init, found {inits}")
        self._init = inits[0]
        shells = _children(self._init)
        if len(shells) != 1:
            raise SandboxError(f"shell: expected one shell process, found {shells}")
        self._bash = shells[0]

    def _walk(self, old: set[int] | None) -> list[int]:
        """The sandbox's processes but init and the shell; with `old` (a snapshot), only
        those that are not in it and do not descend from a process in it: the job."""
        assert self._init is not None
        out: list[int] = []
        todo = [(pid, False) for pid in _children(self._init)]
        seen: set[int] = set()
        while todo:
            pid, background = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if pid != self._bash:
                background = background or (old is not None and pid in old)
                if not background:
                    out.append(pid)
            todo += [(k, background) for k in _children(pid)]
        return out

    async def snapshot(self) -> object:
        if self.exited:
            return frozenset()
        self._find_shell()
        return frozenset(self._walk(None))

    async def signal_job(self, snapshot: object, sig: int) -> int:
        assert isinstance(snapshot, frozenset)
        if self.exited or self._bash is None:
            return 0
        pids = self._walk(set(snapshot))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return len(pids)

    async def kill(self) -> None:
        if self.exited:
            return
        # The namespace's init first: when it dies the kernel kills the whole namespace.
        for pid in (self._init, self.proc.pid):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._waiter), 5.0)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


# ---- output accounting ----------------------------------------------------------------------


class _Capped:
    """Keeps the first and the last `limit/2` bytes of what it is fed, and the total."""

    def __init__(self, limit: int) -> None:
        limit = max(0, limit)
        self.limit = limit
        self.head_cap = limit - limit // 2
        self.tail_cap = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_cap > 0:
            self.tail += data[-self.tail_cap :]
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + tail
        omitted = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[… {omitted} bytes omitted …]\n{tail}"


# ---- the session ----------------------------------------------------------------------------


@dataclass
class _Live:
    """One shell process and what its readers have seen."""

    proc: ShellProcess
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ready: bool = False
    status_eof: bool = False
    output_eof: bool = False
    status_buf: bytearray = field(default_factory=bytearray)
    # the command in flight
    nonce: bytes | None = None
    marker: bytes | None = None
    marker_seen: bool = False
    record: tuple[int, str] | None = None
    sink: _Capped | None = None
    carry: bytearray = field(default_factory=bytearray)
    stray: bytearray = field(default_factory=bytearray)
    last_output: float = 0.0
    forged: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class BashSession(ShellSession):
    """A persistent bash over a `ShellProcess` transport; `launch` starts a fresh one."""

    def __init__(
        self,
        launch: Callable[[], Awaitable[ShellProcess]],
        *,
        workdir: str,
        default_timeout: float = 30.0,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self._launch = launch
        self.workdir = workdir
        self.default_timeout = default_timeout
        self._alive = alive or (lambda: True)
        self._live: _Live | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._running = False
        self._interrupt = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def forged_records(self) -> int:
        """Status bytes of the current shell that did not carry the expected nonce."""
        return self._live.forged if self._live is not None else 0

    # ---- lifecycle --------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise SandboxGone("the shell session is closed")
        if not self._alive():
            raise SandboxGone("the sandbox of this shell is closed")

    async def start(self) -> None:
        """Start the shell now (`run` starts or restarts it when needed)."""
        async with self._lock:
            self._check()
            if self._live is None or self._dead(self._live):
                await self._start()

    async def _start(self) -> None:
        if self._live is not None:
            await self._discard(self._live)
        proc = await self._launch()
        live = _Live(proc)
        live.tasks = [
            asyncio.ensure_future(self._read_output(live)),
            asyncio.ensure_future(self._read_status(live)),
            asyncio.ensure_future(self._watch_exit(live)),
        ]
        self._live = live
        deadline = time.monotonic() + START_TIMEOUT_S
        while not live.ready:
            if self._dead(live) or time.monotonic() > deadline:
                out = bytes(live.stray).decode(errors="replace")
                rc = await self._exit_code(live)
                await self._discard(live)
                self._live = None
                self._check()
                raise SandboxError(f"the shell did not start (exit {rc}): {out[-2000:]}")
            live.wake.clear()
            if live.ready:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.wake.wait(), 0.5)

    @staticmethod
    def _dead(live: _Live) -> bool:
        return live.status_eof or live.proc.exited

    async def _discard(self, live: _Live) -> None:
        with contextlib.suppress(Exception):
            await live.proc.kill()
        for t in live.tasks:
            t.cancel()
        await asyncio.gather(*live.tasks, return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        live, self._live = self._live, None
        self._interrupt.set()
        if live is not None:
            await asyncio.shield(self._discard(live))

    async def interrupt(self) -> None:
        """Interrupt the running command (SIGINT, then SIGKILL, then the shell); returns
        once it has ended. A no-op when nothing runs."""
        if not self._running:
            return
        self._interrupt.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), INT_GRACE_S + KILL_GRACE_S + 6.0)

    # ---- readers ----------------------------------------------------------------------------

    async def _read_output(self, live: _Live) -> None:
        stream = live.proc.output
        try:
            while chunk := await stream.read(_CHUNK):
                live.last_output = time.monotonic()
                self._feed(live, chunk)
                live.wake.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self._flush(live)
            live.output_eof = True
            live.wake.set()

    @staticmethod
    def _to_stray(live: _Live, data: bytes | bytearray) -> None:
        live.stray += data
        if len(live.stray) > STRAY_CAP:
            del live.stray[: len(live.stray) - STRAY_CAP]

    def _feed(self, live: _Live, chunk: bytes) -> None:
        marker = live.marker
        if marker is None or live.sink is None:
            self._to_stray(live, chunk)
            return
        buf = live.carry + chunk
        i = buf.find(marker)
        if i >= 0:
            live.sink.add(buf[:i])
            live.carry = bytearray()
            live.marker = None
            live.marker_seen = True
            self._to_stray(live, buf[i + len(marker) :])
            return
        keep = len(marker) - 1
        if len(buf) > keep:
            live.sink.add(buf[: len(buf) - keep])
            live.carry = bytearray(buf[len(buf) - keep :])
        else:
            live.carry = bytearray(buf)

    @staticmethod
    def _flush(live: _Live) -> None:
        if live.carry and live.sink is not None:
            live.sink.add(live.carry)
        live.carry = bytearray()

    async def _read_status(self, live: _Live) -> None:
        stream = live.proc.status
        try:
            while chunk := await stream.read(4096):
                live.status_buf += chunk
                self._parse_status(live)
                live.wake.set()
        except (ConnectionError, OSError):
            pass
        finally:
            live.status_eof = True
            live.wake.set()

    def _parse_status(self, live: _Live) -> None:
        buf = live.status_buf
        if not live.ready:
            i = buf.find(b"ready\0")
            if i < 0:
                return
            live.ready = True
            del buf[: i + 6]
        if live.nonce is None:
            # Nothing expected: whatever is here is not a current record.
            if buf:
                live.forged += 1
                buf.clear()
            return
        key = live.nonce + b" "
        i = buf.find(key)
        if i < 0:
            if len(buf) > 1 << 20:
                del buf[: len(buf) - len(key)]
            return
        end = buf.find(b"\0", i)
        if end < 0:
            return
        rc_s, _, cwd = bytes(buf[i + len(key) : end]).partition(b" ")
        if i > 0:
            live.forged += 1
        del buf[: end + 1]
        try:
            rc = int(rc_s)
        except ValueError:
            live.forged += 1
            return
        live.record = (rc, cwd.decode("utf-8", errors="replace"))
        live.nonce = None

    async def _watch_exit(self, live: _Live) -> None:
        with contextlib.suppress(Exception):
            await live.proc.wait()
        live.wake.set()

    async def _exit_code(self, live: _Live) -> int:
        try:
            return await asyncio.wait_for(live.proc.wait(), 5.0)
        except TimeoutError:
            return KILLED_EXIT_CODE

    # ---- run --------------------------------------------------------------------------------

    async def run(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ShellResult:
        async with self._lock:
            self._check()
            restarted = False
            if self._live is None or self._dead(self._live):
                restarted = self._live is not None
                await self._start()
            live = self._live
            assert live is not None
            self._running = True
            self._idle.clear()
            self._interrupt.clear()
            try:
                result = await self._run(live, cmd, timeout, idle_timeout, max_output)
            finally:
                self._running = False
                self._idle.set()
            result.restarted = restarted
            if self._closed or not self._alive():
                raise SandboxGone("the shell was closed while a command ran")
            return result

    async def _run(
        self,
        live: _Live,
        cmd: str,
        timeout: float | None,
        idle_timeout: float | None,
        max_output: int,
    ) -> ShellResult:
        if timeout is None:
            timeout = self.default_timeout
        data = cmd.encode("utf-8", errors="surrogateescape").replace(b"\0", b"")
        nonce = secrets.token_hex(16).encode()
        sink = _Capped(max_output)
        sink.add(live.stray)
        live.stray = bytearray()
        live.carry = bytearray()
        live.marker_seen = False
        live.record = None
        snap = await live.proc.snapshot()
        live.sink = sink
        live.marker = b"\x1eP" + nonce + b"\x1f"
        live.nonce = nonce
        start = time.monotonic()
        live.last_output = start
        with contextlib.suppress(ConnectionError, OSError):  # if it died: seen below
            await live.proc.send(nonce + b" %d\n" % len(data) + data + b"\0")

        deadline = start + timeout
        timed_out = idle = False
        stage = 0  # 0 running, 1 SIGINT sent, 2 SIGKILLing the job, 3 shell killed
        stage_at = 0.0
        status_at: float | None = None
        while True:
            live.wake.clear()
            now = time.monotonic()
            if live.record is not None:
                if status_at is None:
                    status_at = now
                if live.marker_seen or now - status_at > MARKER_GRACE_S or live.output_eof:
                    break
            elif live.proc.exited:
                # (Status EOF alone is not the end: `exec prog` replaced the shell and
                # prog runs on, under this command's timeouts.)
                break
            if stage == 0 and live.record is None:
                why = ""
                if now >= deadline:
                    why = "timeout"
                elif idle_timeout is not None and now - live.last_output >= idle_timeout:
                    why = "idle"
                elif self._interrupt.is_set():
                    why = "interrupt"
                if why:
                    timed_out = why != "interrupt"
                    idle = why == "idle"
                    await live.proc.signal_job(snap, signal.SIGINT)
                    stage, stage_at = 1, now
            elif stage == 1 and live.record is None and now - stage_at >= INT_GRACE_S:
                stage, stage_at = 2, now
            if stage == 2 and live.record is None:
                if now - stage_at >= KILL_GRACE_S:
                    stage = 3
                    await live.proc.kill()
                    continue
                await live.proc.signal_job(snap, signal.SIGKILL)
            # the next moment something may be due
            waits = [MARKER_GRACE_S]
            if stage == 0:
                waits.append(deadline - now)
                if idle_timeout is not None:
                    waits.append(live.last_output + idle_timeout - now)
            elif stage == 1:
                waits.append(stage_at + INT_GRACE_S - now)
            elif stage == 2:
                waits.append(KILL_REPEAT_S)
            if self._interrupt.is_set() and stage == 0:
                waits.append(0)
            delay = max(0.0, min(waits))
            if live.wake.is_set():
                continue
            wake = asyncio.ensure_future(live.wake.wait())
            intr = asyncio.ensure_future(self._interrupt.wait()) if stage == 0 else None
            try:
                await asyncio.wait(
                    [t for t in (wake, intr) if t is not None],
                    timeout=delay,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for t in (wake, intr):
                    if t is not None and not t.done():
                        t.cancel()

        duration = time.monotonic() - start
        live.nonce = None
        live.marker = None
        if live.record is not None:
            if stage:
                # The shell is back: what the interrupted command left (its background
                # jobs, a process that ignored SIGINT in a list that went on) dies now.
                await live.proc.signal_job(snap, signal.SIGKILL)
            live.sink = None
            live.carry = bytearray()
            rc, cwd = live.record
            return ShellResult(
                sink.text(), rc, cwd, timed_out, idle, sink.truncated, False, duration
            )
        # The shell died (or we killed it): collect what it printed, report its status.
        end = time.monotonic() + 1.0
        while not live.output_eof and time.monotonic() < end:
            live.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.wake.wait(), 0.1)
        self._flush(live)
        live.sink = None
        rc = KILLED_EXIT_CODE if stage == 3 else await self._exit_code(live)
        await self._discard(live)
        return ShellResult(
            sink.text(),
            rc,
            self.workdir,
            timed_out,
            idle,
            sink.truncated,
            False,
            time.monotonic() - start,
        )


# ---- the execute-only shell binary ----------------------------------------------------------


def prepare_shell_binary(src: str, dest_dir: str) -> str:
    """An execute-only (mode 0111) copy of the bash at `src`, in `dest_dir`; its path.

    A process that execs a file it cannot read is non-dumpable (see the module docstring),
    which keeps the sandbox's other processes out of the shell's ``/proc/<pid>/{fd,mem}``.
    Copies are named by the source's size and mtime and shared (written once, atomically).
    """
    import hashlib
    import shutil

    st = os.stat(src)
    tag = hashlib.sha256(f"{src}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = os.path.join(dest_dir, f"shell-bash-{tag}")
    if os.path.exists(dest):
        return dest
    os.makedirs(dest_dir, mode=0o711, exist_ok=True)
    tmp = f"{dest}.{secrets.token_hex(4)}.tmp"
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o111)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest
