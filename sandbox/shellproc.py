"""The persistent shell's process side: the bash program a session runs
(`bootstrap_script`, ``programs/shell_bootstrap.sh``), the transport a backend provides
(`ShellProcess`; `LocalShellProcess` for a local child such as ``bwrap … bash``) and the
execute-only bash it runs from (`prepare_shell_binary`).  The session on top is
`palaestra.sandbox.shell.BashSession`.

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

"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable
from typing import Any

from palaestra.sandbox import programs
from palaestra.sandbox.base import SandboxError
from palaestra.sandbox.fdpipes import PipeReader, PipeWriter
from palaestra.sandbox.spawn import spawn

# Where the bootstrap keeps the control, status and output streams (in the script itself).
CONTROL_FD, STATUS_FD, OUTPUT_FD = 60, 61, 62
LONG_COMMAND = 16 * 1024  # read with `head -c` above this (bash's read is 1 syscall/byte)


def bootstrap_script(control_fd: int, status_fd: int) -> str:
    """The ``bash -c`` program of a session; `control_fd`/`status_fd` are where the
    transport hands bash the control pipe (read) and the status pipe (write)."""
    close = " ".join(f"{fd}{d}&-" for fd, d in ((control_fd, "<"), (status_fd, ">")) if fd > 2)
    return programs.text(
        "shell_bootstrap.sh",
        CONTROL_IN=control_fd,
        STATUS_OUT=status_fd,
        CLOSE=close,
        LONG_COMMAND=LONG_COMMAND,
    )


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
        control: PipeWriter,
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
            # From here the pipe objects own the two descriptors (sandbox/fdpipes.py: never
            # a loop's pipe transport, whose close can hit a number reused meanwhile).
            _, status = PipeReader.open(st_r, limit=2**20)
            fds.remove(st_r)
            control = PipeWriter(ctl_w)
            fds.remove(ctl_w)
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


# ---- the execute-only shell binary ----------------------------------------------------------


def prepare_shell_binary(src: str, dest_dir: str) -> str:
    """An execute-only (mode 0111) copy of the bash at `src`, in `dest_dir`; its path.

    A process that execs a file it cannot read is non-dumpable (see the module docstring),
    which keeps the sandbox's other processes out of the shell's ``/proc/<pid>/{fd,mem}``.
    Copies are named by the source's size and mtime and shared (written once, atomically).
    """
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
