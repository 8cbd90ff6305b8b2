"""SQLite store of episodes, every step of every trajectory, and every verdict.

Writes go through one writer thread that batches them into transactions, so the
event loop never waits on the disk; `flush()` waits until everything queued is
committed (on shutdown, and before a read that must see the latest writes).
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
from pathlib import Path
from typing import Any

from palaestra.sdk.models import EpisodeMetrics, EpisodeState, StepRecord, StepResponse, Verdict

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    task_digest TEXT NOT NULL,
    family TEXT NOT NULL,
    domain TEXT NOT NULL,
    split TEXT NOT NULL,
    sealed INTEGER NOT NULL,
    status TEXT NOT NULL,
    step_count INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ended_at REAL,
    void_reason TEXT,
    timings TEXT NOT NULL DEFAULT '{}',
    info TEXT NOT NULL DEFAULT '{}',
    metrics TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS steps (
    episode_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    request_id TEXT,
    record TEXT NOT NULL,
    PRIMARY KEY (episode_id, idx)
);
-- No index on request_id: a replay lookup scans one episode's steps through the primary
-- key, and a second index would double the cost of every step's insert (the hot path).
DROP INDEX IF EXISTS steps_request;
CREATE TABLE IF NOT EXISTS verdicts (
    episode_id TEXT PRIMARY KEY,
    verdict TEXT NOT NULL
);
"""

# Bearer tokens (server/auth.py): only the sha256 of a token is kept.
TOKENS_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL UNIQUE,
    scopes TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);
"""

# The index of the content-addressed pack store (server/registry.py): the pack itself is
# under <data_dir>/packs/sha256/<hex>/; a row here is what makes a published version live.
PACKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS published_packs (
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    digest TEXT NOT NULL,
    published_at REAL NOT NULL,
    publisher TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
"""

# The sampler (server/sampler.py) rebuilds its stats from episodes; admin releases of
# quarantined tasks are kept here so a restart does not quarantine them again.
SAMPLER_SCHEMA = """
CREATE INDEX IF NOT EXISTS episodes_ended ON episodes (ended_at);
CREATE TABLE IF NOT EXISTS sampler_releases (
    task TEXT NOT NULL,
    at REAL NOT NULL
);
"""

SCHEMA += TOKENS_SCHEMA + PACKS_SCHEMA + SAMPLER_SCHEMA

_Write = tuple[str, tuple[Any, ...]]


def _runs(batch: list[_Write]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Consecutive writes of one statement grouped for `executemany` (order kept)."""
    runs: list[tuple[str, list[tuple[Any, ...]]]] = []
    for sql, params in batch:
        if runs and runs[-1][0] == sql:
            runs[-1][1].append(params)
        else:
            runs.append((sql, [params]))
    return runs


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(episodes)")}
            if "metrics" not in columns:  # a store made before per-episode metrics
                db.execute("ALTER TABLE episodes ADD COLUMN metrics TEXT NOT NULL DEFAULT '{}'")
        self._queue: queue.SimpleQueue[_Write | threading.Event | None] = queue.SimpleQueue()
        self._writer = threading.Thread(
            target=self._write_loop, name="palaestra-store", daemon=True
        )
        self._writer.start()
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _write_loop(self) -> None:
        db = self._connect()
        try:
            while True:
                item = self._queue.get()
                batch: list[_Write] = []
                events: list[threading.Event] = []
                stop = False
                while True:
                    if item is None:
                        stop = True
                    elif isinstance(item, threading.Event):
                        events.append(item)
                    else:
                        batch.append(item)
                    if len(batch) >= 1000:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    with db:
                        for sql, rows in _runs(batch):
                            db.executemany(sql, rows)
                for event in events:
                    event.set()
                if stop:
                    return
        finally:
            db.close()

    def _put(self, sql: str, params: tuple[Any, ...]) -> None:
        self._queue.put((sql, params))

    # -- writes (queued) ------------------------------------------------------------------
    def create_episode(self, state: EpisodeState, task_digest: str, sealed: bool) -> None:
        self._put(
            "INSERT INTO episodes (id, task, task_digest, family, domain, split, sealed, status,"
            " step_count, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                state.episode_id,
                state.task,
                task_digest,
                state.family,
                state.domain,
                state.split,
                int(sealed),
                state.status.value,
                0,
                state.created_at,
                state.updated_at,
            ),
        )

    def add_step(self, episode_id: str, index: int, request_id: str | None, record: str) -> None:
        """One step; `record` is a StepRecord's JSON (`models.step_record_json`)."""
        self._put(
            "INSERT OR REPLACE INTO steps (episode_id, idx, request_id, record) VALUES (?,?,?,?)",
            (episode_id, index, request_id, record),
        )

    def update_episode(self, state: EpisodeState) -> None:
        self._put(
            "UPDATE episodes SET status=?, step_count=?, updated_at=?, ended_at=?, void_reason=?,"
            " timings=?, metrics=? WHERE id=?",
            (
                state.status.value,
                state.step_count,
                state.updated_at,
                state.ended_at,
                state.void_reason,
                json.dumps(state.timings),
                state.metrics.model_dump_json(),
                state.episode_id,
            ),
        )

    def put_verdict(self, episode_id: str, verdict: Verdict) -> None:
        self._put(
            "INSERT OR REPLACE INTO verdicts (episode_id, verdict) VALUES (?,?)",
            (episode_id, verdict.model_dump_json()),
        )

    def flush(self) -> None:
        event = threading.Event()
        self._queue.put(event)
        event.wait()

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._writer.join()

    # -- reads (blocking; call through asyncio.to_thread from the server) ---------------
    def load_episode(self, episode_id: str, with_trajectory: bool = True) -> EpisodeState | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT id, task, family, domain, split, status, step_count, created_at,"
                " updated_at, ended_at, void_reason, timings, metrics FROM episodes WHERE id=?",
                (episode_id,),
            ).fetchone()
            if row is None:
                return None
            verdict_row = db.execute(
                "SELECT verdict FROM verdicts WHERE episode_id=?", (episode_id,)
            ).fetchone()
            steps = self._steps(db, episode_id) if with_trajectory else []
        return EpisodeState(
            episode_id=row[0],
            task=row[1],
            family=row[2],
            domain=row[3],
            split=row[4],
            status=row[5],
            step_count=row[6],
            created_at=row[7],
            updated_at=row[8],
            ended_at=row[9],
            void_reason=row[10],
            timings=json.loads(row[11]),
            metrics=EpisodeMetrics.model_validate_json(row[12] or "{}"),
            verdict=Verdict.model_validate_json(verdict_row[0]) if verdict_row else None,
            trajectory=steps,
        )

    def load_steps(self, episode_id: str, count: int | None = None) -> list[StepRecord]:
        """An episode's trajectory, its first `count` steps (flush first to see the latest)."""
        with self._connect() as db:
            return self._steps(db, episode_id, count)

    @staticmethod
    def _steps(
        db: sqlite3.Connection, episode_id: str, count: int | None = None
    ) -> list[StepRecord]:
        rows = db.execute(
            "SELECT record FROM steps WHERE episode_id=? AND idx < ? ORDER BY idx",
            (episode_id, 2**62 if count is None else count),
        ).fetchall()
        return [StepRecord.model_validate_json(row[0]) for row in rows]

    def find_step(self, episode_id: str, request_id: str) -> StepResponse | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT record FROM steps WHERE episode_id=? AND request_id=?",
                (episode_id, request_id),
            ).fetchone()
        if row is None:
            return None
        record = StepRecord.model_validate_json(row[0])
        return StepResponse(
            observation=record.observation,
            reward=record.reward,
            terminated=record.terminated,
            truncated=record.truncated,
            info=record.info,
        )

    def is_sealed(self, episode_id: str) -> bool:
        """Whether a stored episode ran on a sealed split (unknown episodes: False)."""
        with self._connect() as db:
            row = db.execute("SELECT sealed FROM episodes WHERE id=?", (episode_id,)).fetchone()
        return bool(row and row[0])

    def add_sampler_release(self, task: str, at: float) -> None:
        self._put("INSERT INTO sampler_releases (task, at) VALUES (?,?)", (task, at))

    def sampler_history(self, limit: int) -> list[tuple[float, str, str, float, bool, str | None]]:
        """The last `limit` done/void episodes and the admin releases since, oldest first:
        (ended_at, task, status, reward, passed, void_reason); status `release` for a release."""
        if limit <= 0:
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT e.ended_at, e.task, e.status,"
                " COALESCE(json_extract(v.verdict, '$.reward'), 0.0),"
                " COALESCE(json_extract(v.verdict, '$.passed'), 0), e.void_reason"
                " FROM episodes e LEFT JOIN verdicts v ON v.episode_id = e.id"
                " WHERE e.ended_at IS NOT NULL AND e.status IN ('done', 'void')"
                " ORDER BY e.ended_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
            since = rows[-1][0] if rows else 0.0
            releases = db.execute(
                "SELECT at, task FROM sampler_releases WHERE at >= ?", (since,)
            ).fetchall()
        history = [(r[0], r[1], r[2], float(r[3]), bool(r[4]), r[5]) for r in rows]
        history += [(at, task, "release", 0.0, False, None) for at, task in releases]
        history.sort(key=lambda h: h[0])
        return history

    def count_by_status(self) -> dict[str, int]:
        with self._connect() as db:
            return dict(
                db.execute("SELECT status, COUNT(*) FROM episodes GROUP BY status").fetchall()
            )

    def mark_unfinished(self, status: str, reason: str, now: float) -> int:
        """At start-up: episodes left `active` by a previous process can never resume."""
        with self._connect() as db:
            cur = db.execute(
                "UPDATE episodes SET status=?, void_reason=?, ended_at=?, updated_at=?"
                " WHERE status='active'",
                (status, reason, now, now),
            )
            return cur.rowcount
