"""One bad write cannot kill the store's writer thread (and with it every later write).

Before: a statement that failed inside the writer's batch transaction (a duplicate primary
key, a string SQLite cannot encode, an int over 64 bits) raised out of `_write_loop`; the
thread died, every later write was silently lost, `flush()` (awaited by every reset and
close) hung forever, and `/readyz` still said ready.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server.test_store_engines import state
from server.test_store_linger import record

from palaestra.server.db import Connection, Database
from palaestra.server.manager import EpisodeManager
from palaestra.server.store import Store, StoreWriteError

ECHO = "palaestra/echo:say-birch"


def flushes(store: Store, within: float = 10.0) -> bool:
    """Whether `store.flush()` returns in time (a dead writer used to hang it forever)."""
    done = threading.Event()
    threading.Thread(target=lambda: (store.flush(), done.set()), daemon=True).start()
    return done.wait(within)


@pytest.mark.parametrize(
    "poison",
    [
        pytest.param("dup", id="integrity-error"),
        pytest.param("\ud800", id="lone-surrogate"),
        pytest.param(2**70, id="huge-int"),
    ],
)
def test_a_failing_write_fails_alone(tmp_path: Path, poison: object) -> None:
    store = Store(Database.open(tmp_path / "s.sqlite3"))
    try:
        before = store.create_episode(state("before"), "sha256:x", False)
        if poison == "dup":
            bad = store.create_episode(state("before"), "sha256:x", False).written
        elif isinstance(poison, str):
            bad = store.create_episode(state(poison), "sha256:x", False).written
        else:  # an int SQLite cannot hold, through a write nobody waits on
            store.add_step(before.number, poison, None, "{}")  # type: ignore[arg-type]
            bad = None
        after = store.create_episode(state("after"), "sha256:x", False)
        store.add_step(after.number, 0, "r0", "{}")
        assert flushes(store), "flush() hung: the writer thread died"
        if bad is not None:
            with pytest.raises(StoreWriteError):
                bad.result(timeout=5)
        assert after.written.result(timeout=5) is None
        assert store.writer_alive and store.writer_error is None
        assert store.write_errors == 1
        assert store.reads.load_episode("before") is not None
        loaded = store.reads.load_episode("after", with_trajectory=False)
        assert loaded is not None and loaded.task == ECHO
    finally:
        store.close()


def test_a_dead_writer_is_reported_and_never_hangs(tmp_path: Path) -> None:
    store = Store(Database.open(tmp_path / "s.sqlite3"))
    store.close()  # the writer is gone, as after a crash of its thread
    assert not store.writer_alive
    assert flushes(store, 5), "flush() on a stopped writer must return"
    with pytest.raises(Exception, match="store writer stopped"):
        store.add_step(1, 0, None, "{}")


async def test_lone_surrogate_through_batch_reset_cannot_kill_the_writer(
    manager: EpisodeManager, api: httpx.AsyncClient
) -> None:
    """The attack over HTTP: the batch route used to fall back to `json.loads`, which lets a
    lone surrogate through to SQLite, whose UTF-8 encoding of it raised in the writer."""
    raw = b'{"items": [{"task": "%s", "episode_id": "a\\ud800"}]}' % ECHO.encode()
    reply = await api.post(
        "/v1/batch/reset", content=raw, headers={"content-type": "application/json"}
    )
    assert reply.status_code in (200, 422), reply.text
    if reply.status_code == 200:  # answered per item: that item is refused
        assert reply.json()["items"][0]["error"]["status"] == 422
    assert manager.store.writer_alive, manager.store.writer_error
    ready = await api.get("/readyz")
    assert ready.status_code == 200, ready.text
    # Everyone else's writes still land.
    reset = await api.post("/v1/episodes", json={"task": ECHO})
    assert reset.status_code == 200, reset.text
    eid = reset.json()["episode_id"]
    step = await api.post(
        f"/v1/episodes/{eid}/step",
        json={"action": {"tool": "submit", "arguments": {"answer": "hcrib"}}},
    )
    assert step.status_code == 200, step.text
    await manager.store.commit()
    saved = manager.store.reads.load_episode(eid)
    assert saved is not None and saved.step_count == 1


async def test_readyz_reports_a_dead_writer_and_healthz_stays_live(
    manager: EpisodeManager, api: httpx.AsyncClient
) -> None:
    assert (await api.get("/readyz")).status_code == 200
    manager.store._queue.put(("NOT SQL", (), None, None))  # a statement that cannot parse
    await manager.store.commit()
    assert manager.store.writer_alive, "a failing statement must not stop the writer"
    assert manager.store.write_errors == 1
    # Kill the writer for real (a bug in the loop itself): readiness must say so.
    manager.store._queue.put("not a write")  # type: ignore[arg-type]
    for _ in range(100):
        if not manager.store.writer_alive:
            break
        await _sleep()
    ready = await api.get("/readyz")
    assert ready.status_code == 503, ready.text
    assert ready.json()["error"]["code"] == "store_down"
    assert (await api.get("/healthz")).status_code == 200


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.02)


async def test_steps_faster_than_the_disk_wait_for_it(tmp_path: Path) -> None:
    """Step records wait in memory for the writer: a producer faster than the disk (large
    outputs, many episodes) used to grow that queue without bound (1.2 GB in 5 s of 64 x
    60 KB batch steps). Past `store_token_backlog_mb` the token whose records fill it waits
    for the writer; another token's small steps go on, and its episode's start and end
    (told only once on disk, so behind every record queued before) wait for at most that
    much of the flood (with the whole `store_max_backlog_mb` queued ahead, the quiet
    token's p99 step in `bench/abuse.py`'s `big-batch` class was 154 ms; 12 ms now)."""
    from conftest import make_settings

    from palaestra.sdk.models import ResetRequest, StepRequest
    from palaestra.server.auth import Principal
    from palaestra.server.runtime import build_manager

    settings = make_settings(
        data_dir=tmp_path / "data", store_max_backlog_mb=8, store_token_backlog_mb=1
    )
    manager = build_manager(settings)
    store = manager.store
    slow_commit = store._commit

    def commit(conn: object, batch: list[tuple[object, object, object, object]]) -> None:
        size = sum(cost[1] for *_, cost in batch if isinstance(cost, tuple))
        time.sleep(0.005 + size / 20e6)  # a disk slower than the steps: 20 MB/s
        slow_commit(conn, batch)  # type: ignore[arg-type]

    store._commit = commit  # type: ignore[method-assign]
    hostile = Principal(name="hostile", scopes=frozenset({"train"}), token_id="hostile")
    quiet = Principal(name="quiet", scopes=frozenset({"train"}), token_id="quiet")
    await manager.start()
    try:
        flood = (
            await manager.reset(ResetRequest(task=ECHO, options={"max_steps": 1000}), hostile)
        ).episode_id
        big = StepRequest.model_validate(
            {"action": {"tool": "echo", "arguments": {"text": "x" * 60_000}}}
        )
        small = StepRequest.model_validate({"action": {"tool": "echo", "arguments": {"text": "."}}})
        most, held, quiet_waited, quiet_ends = 0, 0, [], []

        async def flooding() -> None:
            nonlocal most, held
            for _ in range(240):
                began = time.monotonic()
                await manager.step(flood, big, hostile)
                held += time.monotonic() - began > 0.04  # it waited for the writer
                most = max(most, store._step_bytes_in - store._step_bytes_out)

        async def stepping() -> None:
            while not flooded.done():
                began = time.monotonic()
                two = ResetRequest(task=ECHO, options={"max_steps": 2})
                calm = (await manager.reset(two, quiet)).episode_id
                stepped = time.monotonic()
                await manager.step(calm, small, quiet)
                ending = time.monotonic()
                quiet_waited.append(ending - stepped)
                ended = await manager.step(calm, small, quiet)
                assert ended.truncated or ended.terminated
                quiet_ends.append(max(stepped - began, time.monotonic() - ending))
                await asyncio.sleep(0.005)

        flooded = asyncio.ensure_future(flooding())
        await asyncio.gather(flooded, stepping())
        assert most <= (1 << 20) + 70_000, f"{most} bytes of step records held in memory"
        assert store._step_bytes_in > 240 * 60_000  # every step was recorded
        assert held > 10, held  # the flood waited for the writer, many times
        assert len(quiet_waited) > 10 and max(quiet_waited) < 0.05, quiet_waited  # it never did
        # 1 MiB of the flood at 20 MB/s is 52 ms; the whole 8 MiB would be 420 ms
        assert max(quiet_ends) < 0.2, sorted(quiet_ends)[-5:]
        await store.commit()
        assert not store.behind("hostile")
        saved = await store.load_episode(flood)
        assert saved is not None and len(saved.trajectory) == 240
    finally:
        await manager.shutdown()


def test_a_failing_write_in_a_large_batch_is_found_in_few_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay of a failed batch halves it (about 2·log2(n) transactions), not one
    transaction a write: a transaction holds up to BATCH_ROWS writes, and on PostgreSQL
    each of those would be a durable commit while every waiter waits."""
    store = Store(Database.open(tmp_path / "s.sqlite3"))
    transactions = 0
    begin = Connection.transaction

    def counted(self: Connection) -> Any:
        nonlocal transactions
        transactions += 1
        return begin(self)

    try:
        number = store.create_episode(state("many"), "sha256:x", False).number
        assert flushes(store)
        monkeypatch.setattr(Connection, "transaction", counted)
        for index in range(2000):  # one batch: its poison in the middle
            store.add_step(number, 2**70 if index == 1234 else index, None, record(index))
        assert flushes(store)
        assert store.write_errors == 1 and store.writer_alive
        assert transactions <= 2 + 2 * 11, transactions
        loaded = store.reads.load_episode("many")
        assert loaded is not None
        assert [s.index for s in loaded.trajectory] == [i for i in range(2000) if i != 1234]
    finally:
        store.close()


async def test_waiters_on_a_writer_that_dies_are_released(tmp_path: Path) -> None:
    """A writer that dies mid-commit (its database gone for good) releases whoever waits on
    that commit: a step behind the writer (`catch_up`) and a durable `commit()` alike."""
    store = Store(Database.open(tmp_path / "s.sqlite3"), token_backlog_bytes=100)
    go = threading.Event()

    def lost(conn: object, batch: object) -> object:
        go.wait(10)
        raise RuntimeError("the database is gone")

    try:
        number = store.create_episode(state("e"), "sha256:x", False).number
        await store.commit()
        store._commit_or_reconnect = lost  # type: ignore[method-assign,assignment]
        store.add_step(number, 0, None, "x" * 1000, owner="t")
        assert store.behind("t")
        waiting = [asyncio.ensure_future(store.catch_up("t")) for _ in range(3)]
        waiting.append(asyncio.ensure_future(store.commit()))
        await asyncio.sleep(0.1)
        go.set()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert not store.writer_alive and store.writer_error
    finally:
        go.set()
        store.close()
