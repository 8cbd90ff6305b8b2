"""The store writer lingers for more writes (server/store.py `LINGER_S`), but never keeps
waiting whoever waits on a commit or a read, and never drops what was queued at close."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from palaestra.sdk.models import Action, EpisodeState, Observation, step_record_json
from palaestra.server import store as store_module
from palaestra.server.db import Database
from palaestra.server.store import Store


def record(index: int) -> str:
    return step_record_json(
        index=index,
        request_id=f"r{index}",
        action=Action(tool="echo", arguments={"text": "hi"}),
        observation=Observation(text="hi"),
        reward=0.0,
        terminated=False,
        truncated=False,
        info={},
        duration_s=0.0,
        at=0.0,
    )


def started(store: Store, episode_id: str) -> int:
    """Queue an episode's row; its number."""
    state = EpisodeState(
        episode_id=episode_id,
        task="palaestra/echo:t",
        family="echo",
        domain="echo",
        split="train",
        status="active",
        step_count=0,
        created_at=0.0,
        updated_at=0.0,
    )
    return store.create_episode(state, "sha256:x", False).number


def stored_steps(path: Path) -> list[tuple[str, int]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT e.id, s.idx FROM step_records s JOIN episodes e ON e.number = s.episode"
            " ORDER BY s.idx"
        )
        return [tuple(row) for row in rows]
    finally:
        db.close()


async def test_a_commit_or_a_read_ends_the_linger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "LINGER_S", 600.0)  # a batch nobody waits on: 10 min
    path = tmp_path / "store.sqlite3"
    store = Store(Database.open(path))
    try:
        e1 = started(store, "e1")
        store.add_step(e1, 0, "r0", record(0))
        # Well inside the linger: the commit is answered by committing what is queued.
        await asyncio.wait_for(store.commit(), 30)
        assert stored_steps(path) == [("e1", 0)]
        store.add_step(e1, 1, "r1", record(1))
        found = await asyncio.wait_for(store.find_step("e1", "r1"), 30)  # a read, likewise
        assert found is not None and found.observation.text == "hi"
    finally:
        await store.aclose()


async def test_writes_queued_after_the_stop_are_written(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = Store(Database.open(path))
    e1 = started(store, "e1")
    store._queue.put(None)  # a stop that raced ahead of a write (close's own comes last)
    store.add_step(e1, 0, None, record(0))
    await store.aclose()
    assert stored_steps(path) == [("e1", 0)]


async def test_steps_behind_the_writer_share_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token past its backlog waits for the writer. Its steps, each queuing a row and
    then waiting, share one commit marker at a time: a marker each ended a transaction
    after every row (64 transactions here) just when the writer was behind."""
    store = Store(Database.open(tmp_path / "store.sqlite3"), token_backlog_bytes=1024)
    slow = threading.Event()
    commits: list[int] = []
    commit = store._commit

    def slow_commit(conn: object, batch: list[tuple[object, object, object, object]]) -> None:
        slow.wait(30)  # the disk is slow until the test lets it go
        commits.append(len(batch))
        commit(conn, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_commit", slow_commit)
    try:
        numbers = [started(store, f"e{i}") for i in range(64)]
        await asyncio.sleep(0.1)  # the writer took the episodes' rows and waits on the disk
        waiting = []
        for number in numbers:  # as 64 steps of a batch: a row queued, then the wait
            store.add_step(number, 0, None, record(0), owner="trainer")
            if store.behind("trainer"):
                waiting.append(asyncio.ensure_future(store.catch_up("trainer")))
                await asyncio.sleep(0)
        assert len(waiting) > 50 and not any(w.done() for w in waiting)
        waiting[0].cancel()  # one step cancelled: the others' wait goes on
        slow.set()
        await asyncio.wait_for(asyncio.gather(*waiting[1:]), 30)
        assert not store.behind("trainer")
        assert len(commits) <= 5, commits  # the episodes', then the steps' in one or two
    finally:
        slow.set()
        await store.aclose()
