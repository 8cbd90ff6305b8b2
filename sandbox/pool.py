"""A warm pool of ready sandboxes per spec (DESIGN §5), in front of any backend.

`WarmPool(inner, size=4)` is itself a `Backend`.  For each `SandboxSpec` (a frozen,
hashable dataclass) it keeps a queue of sandboxes created ahead of time and never used:

* `create(spec)` never waits on the pool: it pops a ready sandbox (a *hit*) or, when
  the queue is empty, creates one cold through the inner backend (a *miss*); either way
  it schedules a background refill of that spec's queue up to `size`;
* a pooled sandbox is handed out at most once: it leaves its queue in the same
  synchronous step that checks it (no `await` in between), and closed sandboxes never go
  back -- every hand-out is a sandbox no episode has touched;
* before hand-out a sandbox must still be `alive` and younger than `max_age_s` (cloud
  sandboxes expire); stale ones are closed and skipped;
* bounded: at most `size` ready per spec, at most `max_total` ready over all specs, at
  most `max_specs` specs (least recently used spec evicted, its sandboxes closed), and at
  most `refill_concurrency` creates in flight for refills at once;
* a refilled sandbox is pooled once it is ready to run (a backend's ``wait_ready()``,
  where it has one: the bwrap backend's jail for the first exec is up);
* the refill a hand-out schedules starts `refill_delay_s` (50 ms) later, so the handed-out
  sandbox's first exec does not compete with it for the CPU;
* a refill that fails backs off (`retry_s`) instead of spinning; `create` stays correct
  (it goes cold) whatever the refills do;
* `aclose()` cancels refills, closes the pooled sandboxes, then closes the inner backend.

`live_count` counts sandboxes handed out and not yet closed (what episodes hold), not
the ready ones, so a freed episode shows 0; `pooled` is the ready count, and `stats()`
gives hits, misses, pooled and refill errors for metrics.
`prewarm(spec)` starts filling a spec's queue ahead of its first `create`.

A spec with `gateway` is never pooled: its key names one harness episode's model session,
so each such sandbox is made for that episode (`create` goes to the inner backend, no
queue, no refill; `prewarm` ignores it).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from palaestra.sandbox.base import Backend, Sandbox, SandboxSpec

log = logging.getLogger(__name__)


@dataclass
class PoolStats:
    hits: int = 0
    misses: int = 0
    pooled: int = 0
    in_use: int = 0
    refill_errors: int = 0
    evicted: int = 0
    specs: int = 0


@dataclass
class _Slot:
    ready: deque[tuple[float, Sandbox]] = field(default_factory=deque)
    creating: int = 0
    task: asyncio.Task[None] | None = None
    backoff_until: float = 0.0


class WarmPool(Backend):
    def __init__(
        self,
        inner: Backend,
        *,
        size: int = 4,
        max_total: int = 64,
        max_specs: int = 8,
        refill_concurrency: int = 2,
        max_age_s: float = 600.0,
        retry_s: float = 2.0,
        refill_delay_s: float = 0.05,
    ) -> None:
        if size < 1:
            raise ValueError("a warm pool needs size >= 1 (size 0: do not wrap the backend)")
        self.inner = inner
        self.name = inner.name
        self.size = size
        self.max_total = max(max_total, size)
        self.max_specs = max(1, max_specs)
        self.max_age_s = max_age_s
        self.retry_s = retry_s
        self.refill_delay_s = refill_delay_s
        self._sem = asyncio.Semaphore(max(1, refill_concurrency))
        self._slots: OrderedDict[SandboxSpec, _Slot] = OrderedDict()
        self._handed: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        self._closing: set[asyncio.Future[None]] = set()  # `_close_later`s; aclose waits
        self._closed = False
        self.hits = 0
        self.misses = 0
        self.refill_errors = 0
        self.evicted = 0

    # ---- Backend ---------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if self._closed:
            return await self.inner.create(spec)
        if spec.gateway is not None:  # one episode's: never pooled (module docstring)
            own = await self.inner.create(spec)
            self._handed.add(own)
            return own
        slot = self._slot(spec)
        box = self._pop(slot)
        if box is not None:
            self.hits += 1
            self._handed.add(box)
            self._schedule(spec, slot, self.refill_delay_s)
            return box
        self.misses += 1
        self._schedule(spec, slot)
        box = await self.inner.create(spec)
        self._handed.add(box)
        return box

    @property
    def live_count(self) -> int:
        return sum(1 for b in list(self._handed) if b.alive)

    @property
    def pooled(self) -> int:
        return sum(len(s.ready) for s in self._slots.values())

    def stats(self) -> PoolStats:
        return PoolStats(
            self.hits,
            self.misses,
            self.pooled,
            self.live_count,
            self.refill_errors,
            self.evicted,
            len(self._slots),
        )

    def prewarm(self, spec: SandboxSpec) -> None:
        """Start filling `spec`'s queue now (call inside the event loop)."""
        if not self._closed and spec.gateway is None:
            self._schedule(spec, self._slot(spec))

    async def aclose(self) -> None:
        self._closed = True
        slots = list(self._slots.values())
        self._slots.clear()
        tasks = [s.task for s in slots if s.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        boxes = [b for s in slots for _, b in s.ready]
        for s in slots:
            s.ready.clear()
        await asyncio.gather(*(b.close() for b in boxes), *self._closing, return_exceptions=True)
        await self.inner.aclose()

    # ---- internals -------------------------------------------------------------------------

    def _slot(self, spec: SandboxSpec) -> _Slot:
        slot = self._slots.get(spec)
        if slot is None:
            slot = self._slots[spec] = _Slot()
            while len(self._slots) > self.max_specs:
                _, old = self._slots.popitem(last=False)
                self._evict(old)
        else:
            self._slots.move_to_end(spec)
        return slot

    def _evict(self, slot: _Slot) -> None:
        self.evicted += 1
        if slot.task is not None:
            slot.task.cancel()
        boxes = [b for _, b in slot.ready]
        slot.ready.clear()
        for b in boxes:
            self._close_later(b)

    def _close_later(self, box: Sandbox) -> None:
        task = asyncio.ensure_future(box.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(_log_failure)

    def _pop(self, slot: _Slot) -> Sandbox | None:
        """Take the oldest usable ready sandbox; synchronous, so no two callers get one box."""
        now = time.monotonic()
        while slot.ready:
            born, box = slot.ready.popleft()
            if box.alive and now - born <= self.max_age_s:
                return box
            self._close_later(box)
        return None

    def _want(self, slot: _Slot) -> bool:
        total = self.pooled + sum(s.creating for s in self._slots.values())
        return len(slot.ready) + slot.creating < self.size and total < self.max_total

    def _schedule(self, spec: SandboxSpec, slot: _Slot, delay: float = 0.0) -> None:
        if self._closed or (slot.task is not None and not slot.task.done()):
            return
        if time.monotonic() < slot.backoff_until or not self._want(slot):
            return
        slot.task = asyncio.create_task(
            self._refill(spec, slot, delay), name="palaestra-pool-refill"
        )

    async def _refill(self, spec: SandboxSpec, slot: _Slot, delay: float = 0.0) -> None:
        if delay > 0:
            # after a hand-out: let its first exec (an episode's reset, first step) run before
            # the refill's CPU-heavy set-up competes with it
            await asyncio.sleep(delay)
        while not self._closed and self._slots.get(spec) is slot and self._want(slot):
            slot.creating += 1
            try:
                async with self._sem:
                    box = await self.inner.create(spec)
                    try:
                        await _wait_ready(box)
                    except BaseException:
                        self._close_later(box)
                        raise
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.refill_errors += 1
                slot.backoff_until = time.monotonic() + self.retry_s
                log.warning("warm pool: creating a sandbox for %s failed: %s", spec, e)
                return
            finally:
                slot.creating -= 1
            if self._closed or self._slots.get(spec) is not slot:
                self._close_later(box)
                return
            slot.ready.append((time.monotonic(), box))


async def _wait_ready(box: Sandbox) -> None:
    """Let a sandbox finish what it starts ahead (the bwrap backend's jail for its first
    exec) before it is pooled, so a hand-out is ready to run at once."""
    ready = getattr(box, "wait_ready", None)
    if ready is not None:
        await ready()


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("warm pool: closing a sandbox failed: %s", task.exception())


__all__ = ["PoolStats", "WarmPool"]
