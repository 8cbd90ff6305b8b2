"""Jails: one bwrap started for one exec, and the one each sandbox keeps started ahead.

With the exec helper (`palaestra.sandbox.exechelper`), a jail's command is the helper's
``stub``: it says "ready" on a socket and waits for the command, which an exec then sends
with fresh stdio pipes (so the exec costs one ``execve`` instead of a bwrap set-up).  Without
it, the command is on bwrap's command line.  No untrusted code ever runs in a waiting jail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.sandbox import exechelper
from palaestra.sandbox.base import BASE_PATH, SandboxError
from palaestra.sandbox.bwrap.launch import JOIN_FAILED, Launcher
from palaestra.sandbox.spawn import killpg, spawn

log = logging.getLogger("palaestra.sandbox.bwrap")

# After a SIGKILL, how long we wait for bwrap to be reaped and its pipes to close.
KILL_GRACE_S = 0.9
# How long a jail may take to come up (bwrap set-up) before we call it failed.
JAIL_START_TIMEOUT_S = 20.0
# After an exec, how long before the next exec's jail is started ahead.
PRESPAWN_DELAY_S = 0.05


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


@dataclass
class Jail:
    """One bwrap started for one exec.

    With the exec helper, ``ctl`` is our end of the stub's socket: the jail is up and its
    stub waits for the command (a *ready* jail).  Without it (``ctl`` None), the command was
    on bwrap's command line.  ``static`` is the static argv it was built from."""

    proc: asyncio.subprocess.Process
    ctl: socket.socket | None
    status_r: int
    static: list[str]
    ready: bool = False  # its stub said "R" (set-up done)
    reported: bool = False  # bwrap reported the command's exit code
    closed: bool = False

    def discard(self) -> None:
        """Kill it (if still running) and close our ends; idempotent."""
        killpg(self.proc)
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


class JailDied(SandboxError):
    """A jail's stub died before it took its command: nothing of the exec ran."""


def took_command(ctl: socket.socket) -> bool:
    """Whether the stub acknowledged its command ("S") before its jail ended."""
    try:
        return b"S" in ctl.recv(16, socket.MSG_DONTWAIT)
    except OSError:
        return False


def _ignore_failure(task: asyncio.Future[Jail]) -> None:
    """A jail started ahead that failed or was cancelled: the next exec starts its own."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a jail started ahead failed: %s", task.exception())


async def init_gone(pid: object) -> None:
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


def read_status(fd: int) -> dict[str, Any]:
    """Merge the JSON documents bwrap wrote to --json-status-fd (all writers are gone now;
    `fd` is non-blocking since the jail was made)."""
    raw = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            raw += chunk
    return parse_status(raw)


def parse_status(raw: bytes) -> dict[str, Any]:
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


class Jails:
    """The jails of one sandbox: starting them (`spawn`), the one started ahead for the next
    exec (`take`, `schedule_next`, `wait_ready`), and reaping the bwraps that exit by
    themselves (`drain`, at close).

    `static` (the sandbox's bwrap argv) and `launcher` are set once the sandbox is set up;
    `closed` once it is closing."""

    def __init__(
        self,
        sandbox_id: str,
        *,
        workdir: str,
        helper: Path | None,
        prespawn: bool,
        budget: JailBudget,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.workdir = workdir
        self.helper = helper
        self.prespawn = prespawn and helper is not None
        self.budget = budget
        self.static: list[str] = []
        self.launcher: Launcher | None = None
        self.closed = False
        # The jail started ahead for the next exec; it holds one unit of `budget`.
        self.ahead: asyncio.Future[Jail] | None = None
        self._timer: asyncio.TimerHandle | None = None  # starts `ahead` after an exec
        self._reaping: set[asyncio.Future[Any]] = set()  # bwraps exiting by themselves

    # ---- reaping ---------------------------------------------------------------------------

    def reap_later(self, proc: asyncio.subprocess.Process) -> None:
        """Reap a bwrap that reported its command's exit, or was killed, and now exits by
        itself; `drain` waits for it (a process still unreaped when its event loop ends
        leaves its transport "running", and its finalizer fails on the closed loop)."""
        self._await_on_close(asyncio.ensure_future(proc.wait()))

    def _await_on_close(self, fut: asyncio.Future[Any]) -> None:
        self._reaping.add(fut)
        fut.add_done_callback(self._reaping.discard)
        fut.add_done_callback(lambda t: None if t.cancelled() else t.exception())

    def discard(self, jail: Jail) -> None:
        """Kill `jail` and reap it in the background."""
        jail.discard()
        self.reap_later(jail.proc)

    def _discard_result(self, task: asyncio.Future[Jail]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.discard(task.result())

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for the bwraps being reaped; a reap may register meanwhile (a
        cancelled jail start discarding its jail)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._reaping and (left := deadline - loop.time()) > 0:
            await asyncio.wait(list(self._reaping), timeout=left)

    # ---- starting one ----------------------------------------------------------------------

    async def spawn(self, argv: list[str] | None = None, env: dict[str, str] | None = None,
                    cwd: str | None = None, stdin_null: bool = False) -> Jail:  # fmt: skip
        """Start one exec's bwrap.

        With the exec helper and no `argv`: a jail whose stub waits for its command; this
        returns once the stub said it is ready (bwrap's set-up is done) and raises
        SandboxError with bwrap's message if it never is.  Otherwise (`argv`, `env` and `cwd`
        given) the command is on bwrap's command line, behind the launcher (stdin /dev/null
        with `stdin_null`, else a pipe)."""
        assert self.launcher is not None
        static = self.static
        args = list(static)
        ours: socket.socket | None = None
        theirs: socket.socket | None = None
        if argv is None:
            assert self.helper is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            args += ["--ro-bind", str(self.helper), exechelper.INSIDE_PATH, "--chdir", "/"]
        else:
            for k, v in (env or {}).items():
                args += ["--setenv", k, v]
            args += ["--chdir", cwd or self.workdir]
        status_r, status_w = os.pipe()
        # Our end is non-blocking from birth: flags are never set later on a number that, by
        # then, might name another descriptor (a command's stdin made non-blocking fails
        # with EAGAIN).
        os.set_blocking(status_r, False)
        sfd = self.launcher.seccomp_fd()
        pass_fds = [status_w]
        if sfd is not None:
            args += ["--seccomp", str(sfd)]
            pass_fds.append(sfd)
        args += ["--json-status-fd", str(status_w), "--"]
        if theirs is not None:
            pass_fds.append(theirs.fileno())
            args += [exechelper.INSIDE_PATH, "stub", str(theirs.fileno())]
        else:
            assert argv is not None
            args += argv
        args, kwargs = self.launcher.launch(args)
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
        jail = Jail(proc, ours, status_r, static)
        if ours is None:
            return jail
        ours.setblocking(False)
        await self._await_ready(jail)
        return jail

    async def _await_ready(self, jail: Jail) -> None:
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
                killpg(proc)
                err = b""
                if proc.stderr is not None:
                    with contextlib.suppress(Exception):
                        err = await asyncio.wait_for(proc.stderr.read(1 << 16), KILL_GRACE_S)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
                text = err.decode(errors="replace").strip()
                if JOIN_FAILED in text:
                    raise SandboxError(f"sandbox {self.sandbox_id}: {JOIN_FAILED}")
                raise SandboxError(f"bwrap failed to set up the sandbox: {text[:2000]}")
        finally:
            if not ok:
                self.discard(jail)
        jail.ready = True

    # ---- the jail started ahead ------------------------------------------------------------

    async def wait_ready(self) -> None:
        """Start the next exec's jail now and wait until it is up (see
        `BwrapSandbox.wait_ready`)."""
        self._cancel_timer()
        self._start_next()
        fut = self.ahead
        if fut is None:
            return
        try:
            await asyncio.shield(fut)
        except SandboxError:
            if self.ahead is fut:
                self._pop_next()
            raise

    def _pop_next(self) -> asyncio.Future[Jail] | None:
        fut, self.ahead = self.ahead, None
        if fut is not None:
            self.budget.give()
        return fut

    def drop_next(self) -> None:
        """Kill the jail started ahead (or being started) for the next exec."""
        self._cancel_timer()
        fut = self._pop_next()
        if fut is None:
            return
        if not fut.done():
            fut.cancel()  # a cancelled `spawn` kills what it started
            self._await_on_close(fut)
        elif not fut.cancelled() and fut.exception() is None:
            self.discard(fut.result())

    def schedule_next(self) -> None:
        """Start the next exec's jail in the background (the warm part of a sandbox), after
        PRESPAWN_DELAY_S: an exec followed at once by `close` (a verifier's run) or by another
        exec (which starts its own) wastes no jail."""
        if not self.prespawn or self.closed or self.ahead is not None or self._timer:
            return
        self._timer = asyncio.get_running_loop().call_later(PRESPAWN_DELAY_S, self._start_next)

    def _start_next(self) -> None:
        self._timer = None
        if not self.prespawn or self.closed or self.ahead is not None:
            return
        if not self.budget.take():
            return
        task = asyncio.ensure_future(self.spawn())
        task.add_done_callback(_ignore_failure)
        self.ahead = task

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def take(self) -> Jail | None:
        """The jail started ahead (waiting for it if it is still coming up), if usable."""
        self._cancel_timer()
        fut = self._pop_next()
        if fut is not None:
            try:
                jail: Jail | None = await asyncio.shield(fut)
            except asyncio.CancelledError:
                if not fut.cancelled():
                    fut.add_done_callback(self._discard_result)
                raise
            except SandboxError as e:
                log.debug("sandbox %s: the jail started ahead failed: %s", self.sandbox_id, e)
                jail = None
            if jail is not None and (
                jail.static is not self.static or jail.proc.returncode is not None or jail.closed
            ):
                self.discard(jail)  # built from other arguments, or died while idle
                jail = None
            if jail is not None:
                return jail
        return None
