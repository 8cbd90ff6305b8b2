"""An episode's lock (server/steplock.py): one holder at a time, waiters served in arrival
order, a free lock taken without waiting, and a cancelled waiter never keeps it."""

from __future__ import annotations

import asyncio

import pytest

from palaestra.server.steplock import EpisodeLock


async def test_one_holder_at_a_time_in_arrival_order() -> None:
    lock, inside, order = EpisodeLock(), 0, []

    async def hold(name: int) -> None:
        nonlocal inside
        async with lock:
            inside += 1
            assert inside == 1  # nobody else holds it
            order.append(name)
            await asyncio.sleep(0.001)
            inside -= 1

    await asyncio.gather(*(hold(n) for n in range(20)))
    assert order == list(range(20)) and not lock.locked()


async def test_a_newcomer_does_not_overtake_a_waiter() -> None:
    lock, order = EpisodeLock(), []
    assert lock.try_acquire()

    async def wait() -> None:
        await lock.acquire()
        order.append("waiter")
        lock.release()

    waiting = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    lock.release()  # handed to the waiter, who has not run yet
    assert lock.locked() and not lock.try_acquire()
    await waiting
    assert order == ["waiter"] and lock.try_acquire()


async def test_a_cancelled_waiter_never_keeps_the_lock() -> None:
    lock = EpisodeLock()
    assert lock.try_acquire()
    skipped = asyncio.ensure_future(lock.acquire())
    handed = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0)
    skipped.cancel()  # cancelled while waiting: release skips it
    await asyncio.sleep(0)
    lock.release()
    await asyncio.sleep(0)
    assert handed.done() and lock.locked()
    late = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0)
    lock.release()  # handed to `late` ...
    late.cancel()  # ... which is cancelled before it runs: it passes the lock on
    with pytest.raises(asyncio.CancelledError):
        await late
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
