"""WarmPool: hits and misses, never handing a sandbox out twice, bounds, refill, close."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from pathlib import Path

import pytest

from palaestra.sandbox.base import Backend, ExecResult, Sandbox, SandboxCreateError, SandboxSpec
from palaestra.sandbox.pool import WarmPool

_ids = itertools.count()


class StubBox(Sandbox):
    def __init__(self, spec: SandboxSpec, owner: StubBackend) -> None:
        self.spec, self.id, self._owner, self._closed = spec, f"stub-{next(_ids)}", owner, False

    async def exec(self, cmd: object, **kw: object) -> ExecResult:  # type: ignore[override]
        return ExecResult(0, "", "")

    async def read_file(self, path: str) -> bytes:
        return b""

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        pass

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        pass

    async def download_tar(self, path: str | None = None) -> bytes:
        return b""

    async def wait_ready(self) -> None:
        await asyncio.sleep(self._owner.ready_delay)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await asyncio.sleep(self._owner.close_delay)
            self._owner.live.discard(self)

    @property
    def alive(self) -> bool:
        return not self._closed


class StubBackend(Backend):
    name = "stub"

    def __init__(self, delay: float = 0.01) -> None:
        self.delay, self.live, self.created, self.fail = delay, set[StubBox](), 0, False
        self.ready_delay = self.close_delay = 0.0
        self.closed = False

    async def create(self, spec: SandboxSpec) -> StubBox:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise SandboxCreateError("stub refuses")
        self.created += 1
        box = StubBox(spec, self)
        self.live.add(box)
        return box

    @property
    def live_count(self) -> int:
        return len(self.live)

    async def aclose(self) -> None:
        self.closed = True


A, B, C = SandboxSpec(), SandboxSpec(memory_mb=512), SandboxSpec(memory_mb=256)


async def _settle(pool: WarmPool, want: int, spec: SandboxSpec = A) -> None:
    for _ in range(500):
        if pool.pooled >= want:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"pool never reached {want} (has {pool.pooled})")


async def test_miss_then_hits_and_refill() -> None:
    inner = StubBackend()
    pool = WarmPool(inner, size=3)
    box = await pool.create(A)
    assert (pool.hits, pool.misses) == (0, 1) and box.alive
    await _settle(pool, 3)
    assert inner.created == 4 and pool.live_count == 1 and inner.live_count == 4
    t0 = time.perf_counter()
    again = await pool.create(A)
    assert time.perf_counter() - t0 < inner.delay  # a hit does not wait for the backend
    assert pool.hits == 1 and again is not box
    await _settle(pool, 3)  # refilled in the background
    s = pool.stats()
    assert (s.hits, s.misses, s.pooled, s.in_use) == (1, 1, 3, 2)
    await pool.aclose()
    assert inner.live_count == 2 and inner.closed  # the pooled 3 closed, the 2 handed out not


async def test_never_handed_out_twice_under_concurrency() -> None:
    inner = StubBackend(delay=0.001)
    pool = WarmPool(inner, size=8)
    pool.prewarm(A)
    await _settle(pool, 8)
    boxes = await asyncio.gather(*(pool.create(A) for _ in range(200)))
    assert len({id(b) for b in boxes}) == 200
    assert pool.hits >= 8 and pool.hits + pool.misses == 200
    assert pool.live_count == 200
    for b in boxes:
        await b.close()
    assert pool.live_count == 0
    again = await asyncio.gather(*(pool.create(A) for _ in range(20)))
    assert not {id(b) for b in again} & {id(b) for b in boxes}  # closed ones never return
    await pool.aclose()


async def test_dead_and_stale_sandboxes_are_skipped() -> None:
    inner = StubBackend()
    pool = WarmPool(inner, size=2, max_age_s=0.05)
    pool.prewarm(A)
    await _settle(pool, 2)
    first = next(iter(pool._slots[A].ready))[1]
    await first.close()  # died while pooled
    got = await pool.create(A)
    assert got is not first and got.alive and pool.hits == 1
    await _settle(pool, 2)
    await asyncio.sleep(0.1)  # everything pooled is now too old
    stale = [b for _, b in pool._slots[A].ready]
    got = await pool.create(A)
    assert got not in stale and pool.misses == 1
    await asyncio.sleep(0.02)
    assert all(not b.alive for b in stale)
    await pool.aclose()


async def test_bounds_total_and_specs_lru() -> None:
    inner = StubBackend(delay=0.001)
    pool = WarmPool(inner, size=4, max_total=6, max_specs=2)
    pool.prewarm(A)
    pool.prewarm(B)
    await asyncio.sleep(0.2)
    assert pool.pooled == 6  # size 4 each, but 6 in all
    await pool.create(A)  # A most recently used; C evicts B
    pool.prewarm(C)
    await asyncio.sleep(0.2)
    assert set(pool._slots) == {A, C} and pool.evicted == 1
    assert pool.pooled <= 6
    await asyncio.sleep(0.02)
    assert inner.live_count == pool.pooled + pool.live_count  # B's sandboxes were closed
    await pool.aclose()
    assert inner.live_count - pool.live_count == 0


async def test_refill_failure_backs_off_and_create_still_works() -> None:
    inner = StubBackend()
    inner.fail = True
    pool = WarmPool(inner, size=2, retry_s=60)
    with pytest.raises(SandboxCreateError):
        await pool.create(A)
    await asyncio.sleep(0.05)
    assert pool.refill_errors == 1 and pool.pooled == 0
    inner.fail = False
    box = await pool.create(A)  # cold, refill still backing off
    assert box.alive and pool.misses == 2 and pool.refill_errors == 1
    await asyncio.sleep(0.05)
    assert pool.pooled == 0
    await pool.aclose()


async def test_aclose_cancels_refills_and_closes_pooled() -> None:
    inner = StubBackend(delay=0.05)
    pool = WarmPool(inner, size=4, refill_concurrency=1)
    pool.prewarm(A)
    await asyncio.sleep(0.12)
    await pool.aclose()
    await asyncio.sleep(0.1)
    assert inner.live_count == 0 and inner.closed
    assert all(s.task is None or s.task.done() for s in pool._slots.values())


async def test_aclose_waits_for_the_sandbox_it_was_readying() -> None:
    """A refill cancelled while its sandbox gets ready closes that sandbox, and aclose returns
    only once it is closed (a bwrap jail left to its event loop's end leaks its process)."""
    inner = StubBackend(delay=0)
    inner.ready_delay, inner.close_delay = 5.0, 0.05
    pool = WarmPool(inner, size=1)
    pool.prewarm(A)
    await asyncio.sleep(0.02)
    assert inner.live_count == 1 and pool.pooled == 0  # created, not ready yet
    await pool.aclose()
    assert inner.live_count == 0


async def test_aclose_waits_for_evicted_and_stale_closes() -> None:
    inner = StubBackend(delay=0)
    inner.close_delay = 0.05
    pool = WarmPool(inner, size=1, max_specs=1)
    pool.prewarm(A)
    await _settle(pool, 1, A)
    pool.prewarm(B)  # evicts A's queue: its sandbox is closed in the background
    await pool.aclose()
    assert inner.live_count == 0


async def test_warm_pool_latency_vs_cold_bwrap(tmp_path: Path) -> None:
    """Create latency p50 over 50: from a warm pool vs a cold bwrap create (printed)."""
    from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available

    ok, why = bwrap_available()
    if not ok:
        pytest.skip(f"bwrap unusable: {why}")
    import os

    rt = None if os.geteuid() == 0 else tmp_path / "rt"
    spec = SandboxSpec(workspace_mb=16)
    cold_b = BwrapBackend(rt)
    cold: list[float] = []
    for _ in range(50):
        t0 = time.perf_counter()
        box = await cold_b.create(spec)
        cold.append(time.perf_counter() - t0)
        await box.close()
    await cold_b.aclose()
    pool = WarmPool(BwrapBackend(rt), size=4)
    pool.prewarm(spec)
    warm: list[float] = []
    for _ in range(50):
        await _settle(pool, 1, spec)
        t0 = time.perf_counter()
        box = await pool.create(spec)
        warm.append(time.perf_counter() - t0)
        await box.close()
    await pool.aclose()
    cold_p50, warm_p50 = statistics.median(cold) * 1e3, statistics.median(warm) * 1e3
    print(f"\ncreate p50 over 50: cold bwrap {cold_p50:.3f} ms, warm pool {warm_p50:.3f} ms")
    assert pool.hits == 50
    assert warm_p50 < cold_p50
