"""Running one exec in a jail to its end: its output capped, its stdin fed, its timeout
kept, and its exit code read from bwrap's ``--json-status-fd`` (never from its output).

Results: a timeout is ``timed_out=True, exit_code=-9``; death by a signal is ``128 +
signal`` (as bwrap reports it); ``oom_killed`` here is the best effort without a cgroup (a
SIGKILL that was not our timeout, or a trailing Python ``MemoryError``), which the sandbox
makes exact from its cgroup's counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

from palaestra.sandbox import exechelper
from palaestra.sandbox.base import ExecResult, SandboxError, SandboxGone
from palaestra.sandbox.bwrap.jail import KILL_GRACE_S, Jail, init_gone, parse_status, read_status
from palaestra.sandbox.bwrap.launch import JOIN_FAILED, LAUNCH_FAILED
from palaestra.sandbox.preamble import TIMEOUT_EXIT_CODE, append_capped, memory_error
from palaestra.sandbox.spawn import CHUNK, drain_capped, killpg


async def run_stub(
    jail: Jail,
    req: bytes,
    data: bytes | None,
    timeout: float,
    max_output: int,
    start: float,
    *,
    sandbox_id: str,
    closed: Callable[[], bool],
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
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            if not eof[fd].done():
                eof[fd].set_result(None)
            return
        if append_capped(bufs[fd], chunk, max_output):
            truncated = True

    def on_status() -> None:
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
        loop.add_reader(jail.status_r, on_status)
        if in_w >= 0:
            loop.add_writer(in_w, write_in)
        waits: list[asyncio.Future[None]] = [eof[out_r], eof[err_r], reported]
        _, pending = await asyncio.wait(waits, timeout=timeout)
        timed_out = bool(pending)
        if timed_out:
            killpg(proc)
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
    status = parse_status(bytes(raw_status))
    if timed_out or "exit-code" in status:
        # bwrap reports the exit code once its first child exits, and its init (pid 1,
        # holding whatever the command left running) dies only with bwrap: end it now and
        # wait until the init, and so every process of the exec, is gone.
        killpg(proc)
        await init_gone(status.get("child-pid"))
    if timed_out:
        return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated, duration)
    if closed():
        raise SandboxGone(f"sandbox {sandbox_id} was closed during exec")
    if "exit-code" in status:
        jail.reported = True
        code = int(status["exit-code"])
        oom = code == 128 + signal.SIGKILL or memory_error(stderr)
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
    if JOIN_FAILED in text:
        raise SandboxError(f"sandbox {sandbox_id}: {JOIN_FAILED}")
    raise SandboxError(f"bwrap failed to run the command (rc={rc}): {text[:2000]}")


async def supervise(
    proc: asyncio.subprocess.Process,
    data: bytes | None,
    timeout: float,
    max_output: int,
    status_r: int,
    start: float,
    *,
    sandbox_id: str,
    closed: Callable[[], bool],
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
            killpg(proc)
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
    status = read_status(status_r)
    # bwrap exits once its first child did; its init (and whatever the command left
    # running) dies after it: wait for that too.
    await init_gone(status.get("child-pid"))
    if timed_out:
        return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated[0], duration)
    if closed():
        raise SandboxGone(f"sandbox {sandbox_id} was closed during exec")

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
    elif rc == LAUNCH_FAILED and JOIN_FAILED in stderr:
        raise SandboxError(f"sandbox {sandbox_id}: {JOIN_FAILED}")
    else:
        raise SandboxError(f"bwrap failed to set up the sandbox (rc={rc}): {stderr[:2000]}")
    oom = code == 128 + signal.SIGKILL or memory_error(stderr)
    return ExecResult(code, stdout, stderr, False, oom, truncated[0], duration)
