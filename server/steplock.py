"""An episode's lock: one step (or verify, or close) at a time, in arrival order.

Every step takes it, and nearly always nobody holds it: `asyncio.Lock` costs two coroutines
(`__aenter__`, `__aexit__`) a step even then, about half a microsecond of the batch path's
fifteen. `try_acquire` takes a free lock without a coroutine; a waiter gets it handed over
by `release`, first come first served, so a newcomer never overtakes a waiter.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class EpisodeLock:
    """A FIFO asyncio lock with a synchronous fast path (`try_acquire`)."""

    __slots__ = ("_held", "_waiters")

    def __init__(self) -> None:
        self._held = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        return self._held

    def try_acquire(self) -> bool:
        """Take the lock if it is free (then the caller must `release` it); False if not."""
        if self._held:
            return False
        self._held = True
        return True

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # done by `release`: the lock is this caller's now
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over, then cancelled before it ran: pass it on
            raise

    def release(self) -> None:
        """Hand the lock to the first waiter still waiting, or free it."""
        if not self._held:
            raise RuntimeError("EpisodeLock released while not held")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter is done: skipped
                waiter.set_result(None)
                return
        self._held = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
