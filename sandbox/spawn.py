"""Starting a subprocess from asyncio so that a cancellation cannot wedge it.

CPython 3.11's `asyncio.create_subprocess_exec`, when cancelled while it connects the
child's pipes, closes its transport and waits for every pipe to report disconnected; a pipe
that never connected never does, and the cancelled task hangs for good. Seen here: an exec
cancelled while its bwrap was starting (a batch step's caller gone, a shell interrupted)
never returned, and with it the episode's lock. `spawn` lets the creation finish, then
honours the cancellation: it kills what it started, waits (bounded) for it to exit and
raises CancelledError. The delay is the creation's own, a few milliseconds.

Also what every local child process needs: `killpg` and reading its output capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from palaestra.sandbox.preamble import append_capped

KILL_GRACE_S = 1.0
CHUNK = 64 * 1024


async def spawn(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
    """`asyncio.create_subprocess_exec(*args, **kwargs)`, safe to cancel."""
    task = asyncio.ensure_future(asyncio.create_subprocess_exec(*args, **kwargs))
    if not await _outlast(task):
        return task.result()
    if not task.cancelled() and task.exception() is None:
        proc = task.result()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if kwargs.get("start_new_session"):
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        await _outlast(asyncio.ensure_future(proc.wait()), KILL_GRACE_S)
    raise asyncio.CancelledError


async def _outlast(fut: asyncio.Future[Any], timeout: float | None = None) -> bool:
    """Wait until `fut` is done (or `timeout` passed) however often we are cancelled
    meanwhile; whether we were."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    cancelled = False
    while not fut.done():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            break
        try:
            await asyncio.wait([fut], timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def killpg(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group of `proc` (started with ``start_new_session``), if it runs."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def drain_capped(stream: asyncio.StreamReader, buf: bytearray, max_output: int) -> bool:
    """Read `stream` to EOF, keeping its first `max_output` bytes; True if any were dropped."""
    truncated = False
    while chunk := await stream.read(CHUNK):
        truncated = append_capped(buf, chunk, max_output) or truncated
    return truncated
