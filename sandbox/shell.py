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

The protocol, and why a command cannot forge its result, are in `palaestra.sandbox.shellproc`.

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

import asyncio
import contextlib
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    SandboxError,
    SandboxGone,
    ShellResult,
    ShellSession,
)
from palaestra.sandbox.shellproc import ShellProcess
from palaestra.sandbox.spawn import CHUNK

KILLED_EXIT_CODE = -9  # the shell itself had to be killed (as `ExecResult` on a timeout)
INT_GRACE_S = 0.3  # after SIGINT to the foreground job, before SIGKILL
KILL_GRACE_S = 0.4  # after SIGKILL to the job, before killing the shell itself
KILL_REPEAT_S = 0.05
MARKER_GRACE_S = 1.0  # status seen, output marker not (yet): how long to wait for it
START_TIMEOUT_S = 20.0
STRAY_CAP = 64 * 1024  # output between commands kept for the next one (its tail)


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
            while chunk := await stream.read(CHUNK):
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
