"""The store of episodes, every step of every trajectory, every verdict, and where each
episode runs (its placement on a worker), on either engine of server/db.py.

Writes go through one writer thread that batches them into transactions, so the
event loop never waits on the disk; `flush()` waits until everything queued is
committed (on shutdown, and before a read that must see the latest writes). Several
processes may share one database (SQLite in WAL mode with a busy timeout, or PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from palaestra.sdk.errors import ServerError, UnavailableError
from palaestra.sdk.models import (
    EpisodeMetrics,
    EpisodeState,
    GroupReward,
    StepRecord,
    StepResponse,
    Verdict,
)
from palaestra.server.db import Connection, Database

# A queued write: statement, parameters, and the future its caller may wait on (or None).
_Write = tuple[str, tuple[Any, ...], "Future[None] | None"]
_Item = _Write | threading.Event | None

log = logging.getLogger("palaestra.store")


class StoreWriteError(ServerError):
    """A queued write failed (a value SQLite cannot bind, a constraint): it was dropped and
    the writer went on. Input that reaches the store is validated first, so this is a bug."""

    default_code = "store_write_failed"


class _ConnectionLost(Exception):
    """The writer's connection to the database is gone (not one statement's fault)."""


def _writer_down(reason: str | None) -> UnavailableError:
    return UnavailableError(
        f"the store writer stopped ({reason}); this server cannot record episodes",
        code="store_unavailable",
    )


def _runs(batch: list[_Write]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Consecutive writes of one statement grouped for `executemany` (order kept)."""
    runs: list[tuple[str, list[tuple[Any, ...]]]] = []
    for sql, params, _ in batch:
        if runs and runs[-1][0] == sql:
            runs[-1][1].append(params)
        else:
            runs.append((sql, [params]))
    return runs


def _group_reward(row: Any) -> GroupReward | None:
    """An episode's group reward from its (reward, scorer, method, digest) row."""
    if row is None:
        return None
    return GroupReward(reward=row[0], scorer=row[1], method=row[2], group_digest=row[3])


class Store:
    """Episodes, steps, verdicts and placements in `db` (which the store then owns: closing
    the store closes it)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self.write_errors = 0  # writes dropped because their statement failed
        self.writer_error: str | None = None  # why the writer thread stopped, if it did
        self._writer = threading.Thread(
            target=self._write_loop, name="palaestra-store", daemon=True
        )
        self._writer.start()
        self._closed = False

    @property
    def writer_alive(self) -> bool:
        """Whether queued writes are still committed (readiness, /readyz)."""
        return self._writer.is_alive() and not self._closed

    def _write_loop(self) -> None:
        try:
            conn = self.db.open_connection()
        except Exception as exc:
            self._die(exc)
            return
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
                    conn = self._commit_or_reconnect(conn, batch)
                for event in events:
                    event.set()
                if stop:
                    return
        except Exception as exc:  # a bug here, or a database gone: readiness must show it
            log.exception("the store writer failed")
            self._die(exc)
        finally:
            conn.close()

    def _commit_or_reconnect(self, conn: Connection, batch: list[_Write]) -> Connection:
        """Commit the batch; on a lost connection (PostgreSQL restarted), once more on a new
        one. A database that stays unreachable stops the writer: every caller of the batch
        is told `store_unavailable` and readiness fails."""
        try:
            self._commit(conn, batch)
            return conn
        except _ConnectionLost:
            conn.close()
        try:
            conn = self.db.open_connection()
            self._commit(conn, batch)
            return conn
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            for _, _, done in batch:
                if done is not None and not done.done():
                    done.set_exception(_writer_down(reason))
            raise

    def _commit(self, conn: Connection, batch: list[_Write]) -> None:
        """One transaction for the batch; when a statement fails, the batch is replayed one
        write at a time so that only the failing writes are dropped (their callers' futures
        get the error) and everyone else's are committed."""
        try:
            with conn.transaction():
                for sql, rows in _runs(batch):
                    conn.executemany(sql, rows)
        except Exception as exc:
            if conn.broken:
                raise _ConnectionLost(str(exc)) from exc
            for sql, params, done in batch:
                try:
                    with conn.transaction():
                        conn.execute(sql, params)
                except Exception as exc:
                    if conn.broken:
                        raise _ConnectionLost(str(exc)) from exc
                    self.write_errors += 1
                    log.error("store write dropped (%s: %s): %s", type(exc).__name__, exc, sql)
                    if done is not None and not done.done():
                        done.set_exception(StoreWriteError(f"{type(exc).__name__}: {exc}"))
                else:
                    if done is not None and not done.done():
                        done.set_result(None)
            return
        for _, _, done in batch:
            if done is not None and not done.done():
                done.set_result(None)

    def _die(self, exc: BaseException) -> None:
        self.writer_error = f"{type(exc).__name__}: {exc}"
        log.critical("the store writer stopped: %s", self.writer_error)
        # Nobody may wait forever on a writer that is gone: release every waiter.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, threading.Event):
                item.set()
            elif item is not None and item[2] is not None and not item[2].done():
                item[2].set_exception(_writer_down(self.writer_error))

    def _put(self, sql: str, params: tuple[Any, ...], wait: bool = False) -> Future[None] | None:
        """Queue a write; with `wait`, a future that ends when it is committed (or failed)."""
        done: Future[None] | None = Future() if wait else None
        if not self._writer.is_alive():
            error = _writer_down(self.writer_error)
            if done is None:
                raise error
            done.set_exception(error)
            return done
        self._queue.put((sql, params, done))
        return done

    # -- writes (queued) ------------------------------------------------------------------
    def create_episode(
        self, state: EpisodeState, task_digest: str, sealed: bool, owner: str | None = None
    ) -> Future[None] | None:
        """Queued; the future fails (StoreWriteError) when the row cannot be stored.
        `owner`: the token id that started it (server/tenancy.py)."""
        return self._put(
            "INSERT INTO episodes (id, task, task_digest, family, domain, split, sealed, status,"
            " step_count, created_at, updated_at, owner) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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
                owner,
            ),
            wait=True,
        )

    def add_step(self, episode_id: str, index: int, request_id: str | None, record: str) -> None:
        """One step; `record` is a StepRecord's JSON (`models.step_record_json`)."""
        self._put(
            "INSERT INTO steps (episode_id, idx, request_id, record) VALUES (?,?,?,?)"
            " ON CONFLICT (episode_id, idx) DO UPDATE"
            " SET request_id=excluded.request_id, record=excluded.record",
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
            "INSERT INTO verdicts (episode_id, verdict) VALUES (?,?)"
            " ON CONFLICT (episode_id) DO UPDATE SET verdict=excluded.verdict",
            (episode_id, verdict.model_dump_json()),
        )

    def put_placement(self, episode_id: str, worker: str, node: str) -> None:
        """Queued: `episode_id` runs on `worker` of `node` (cluster mode; await aflush())."""
        self._put(
            "INSERT INTO placements (episode_id, worker, node, created_at) VALUES (?,?,?,?)"
            " ON CONFLICT (episode_id) DO UPDATE"
            " SET worker=excluded.worker, node=excluded.node, created_at=excluded.created_at",
            (episode_id, worker, node, time.time()),
        )

    def put_blob(self, digest: str, data: bytes) -> None:
        """Store content-addressed bytes now (synchronous); the same digest again is a no-op."""
        self.db.run(
            "INSERT INTO blobs (digest, data, created_at) VALUES (?,?,?)"
            " ON CONFLICT (digest) DO NOTHING",
            (digest, data, time.time()),
        )

    def put_group(
        self,
        digest: str,
        task: str,
        scorer: str,
        method: str,
        owner: str | None,
        result: str,
        rewards: dict[str, float],
    ) -> None:
        """Store a judged group and its members' rewards now, in one transaction (blocking:
        call it through asyncio.to_thread). IntegrityError where the group, or one of its
        episodes in another group, is stored already (a group reward is given once)."""
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO group_verdicts (digest, task, scorer, method, owner, result,"
                " created_at) VALUES (?,?,?,?,?,?,?)",
                (digest, task, scorer, method, owner, result, time.time()),
            )
            for episode_id, reward in rewards.items():
                conn.execute(
                    "INSERT INTO group_rewards (episode_id, group_digest, reward) VALUES (?,?,?)",
                    (episode_id, digest, reward),
                )

    def group_result(self, digest: str) -> str | None:
        """The stored result (JSON) of the group `digest` (None: never judged)."""
        row = self.db.one("SELECT result FROM group_verdicts WHERE digest=?", (digest,))
        return str(row[0]) if row else None

    def groups_of(self, keys: tuple[str, ...]) -> dict[str, str]:
        """The group digest of each episode among `keys` judged in a group already."""
        marks = ",".join("?" * len(keys))
        rows = self.db.all(
            f"SELECT episode_id, group_digest FROM group_rewards WHERE episode_id IN ({marks})",
            keys,
        )
        return {row[0]: row[1] for row in rows}

    def flush(self) -> None:
        """Wait until everything queued before is committed (or dropped, or the writer died)."""
        if not self._writer.is_alive():
            return
        event = threading.Event()
        self._queue.put(event)
        while not event.wait(1.0):
            if not self._writer.is_alive():  # died between the check and the put
                return

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)

    def close(self) -> None:
        """Commit what is queued, stop the writer and close the database."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._writer.join()
            self.db.close()

    # -- reads (blocking; call through asyncio.to_thread from the server) ---------------
    def load_episode(self, episode_id: str, with_trajectory: bool = True) -> EpisodeState | None:
        with self.db.connection() as db:
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
            group = db.execute(
                "SELECT r.reward, g.scorer, g.method, g.digest FROM group_rewards r"
                " JOIN group_verdicts g ON g.digest = r.group_digest WHERE r.episode_id=?",
                (episode_id,),
            ).fetchone()
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
            group_reward=_group_reward(group),
        )

    def load_steps(self, episode_id: str, count: int | None = None) -> list[StepRecord]:
        """An episode's trajectory, its first `count` steps (flush first to see the latest)."""
        with self.db.connection() as db:
            return self._steps(db, episode_id, count)

    @staticmethod
    def _steps(db: Connection, episode_id: str, count: int | None = None) -> list[StepRecord]:
        rows = db.execute(
            "SELECT record FROM steps WHERE episode_id=? AND idx < ? ORDER BY idx",
            (episode_id, 2**62 if count is None else count),
        ).fetchall()
        return [StepRecord.model_validate_json(row[0]) for row in rows]

    def find_step(self, episode_id: str, request_id: str) -> StepResponse | None:
        row = self.db.one(
            "SELECT record FROM steps WHERE episode_id=? AND request_id=?",
            (episode_id, request_id),
        )
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
        row = self.db.one("SELECT sealed FROM episodes WHERE id=?", (episode_id,))
        return bool(row and row[0])

    def owners(self, keys: tuple[str, ...]) -> dict[str, tuple[str | None, bool]]:
        """(owner token id, sealed) of the stored episodes among `keys` (absent: unknown)."""
        marks = ",".join("?" * len(keys))
        rows = self.db.all(f"SELECT id, owner, sealed FROM episodes WHERE id IN ({marks})", keys)
        return {row[0]: (row[1], bool(row[2])) for row in rows}

    def starts_since(self, since: float) -> list[tuple[str, float]]:
        """(owner, created_at) of the episodes started since `since` (quota windows)."""
        rows = self.db.all(
            "SELECT owner, created_at FROM episodes WHERE created_at > ? AND owner IS NOT NULL",
            (since,),
        )
        return [(row[0], float(row[1])) for row in rows]

    def placement(self, episode_id: str) -> tuple[str, str] | None:
        """(worker, node) the episode was placed on (None: never placed)."""
        row = self.db.one("SELECT worker, node FROM placements WHERE episode_id=?", (episode_id,))
        return (row[0], row[1]) if row else None

    def active_on(self, worker: str) -> list[str]:
        """Ids of the `active` episodes placed on `worker`."""
        rows = self.db.all(
            "SELECT p.episode_id FROM placements p JOIN episodes e ON e.id = p.episode_id"
            " WHERE p.worker=? AND e.status='active' ORDER BY p.episode_id",
            (worker,),
        )
        return [row[0] for row in rows]

    def get_blob(self, digest: str) -> bytes | None:
        row = self.db.one("SELECT data FROM blobs WHERE digest=?", (digest,))
        return bytes(row[0]) if row else None

    def add_sampler_release(self, task: str, at: float) -> None:
        self._put("INSERT INTO sampler_releases (task, at) VALUES (?,?)", (task, at))

    def sampler_history(self, limit: int) -> list[tuple[float, str, str, float, bool, str | None]]:
        """The last `limit` done/void episodes and the admin releases since, oldest first:
        (ended_at, task, status, reward, passed, void_reason); status `release` for a release."""
        if limit <= 0:
            return []
        with self.db.connection() as db:
            reward = db.json_field("v.verdict", "reward")
            passed = db.json_field("v.verdict", "passed")
            rows = db.execute(
                f"SELECT e.ended_at, e.task, e.status, {reward}, {passed}, e.void_reason"
                " FROM episodes e LEFT JOIN verdicts v ON v.episode_id = e.id"
                " WHERE e.ended_at IS NOT NULL AND e.status IN ('done', 'void')"
                " ORDER BY e.ended_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
            since = rows[-1][0] if rows else 0.0
            releases = db.execute(
                "SELECT at, task FROM sampler_releases WHERE at >= ?", (since,)
            ).fetchall()
        history = [(r[0], r[1], r[2], float(r[3] or 0.0), r[4] in (1, "true"), r[5]) for r in rows]
        history += [(at, task, "release", 0.0, False, None) for at, task in releases]
        history.sort(key=lambda h: h[0])
        return history

    def count_by_status(self) -> dict[str, int]:
        return dict(self.db.all("SELECT status, COUNT(*) FROM episodes GROUP BY status"))

    def mark_unfinished(self, status: str, reason: str, now: float) -> int:
        """At start-up: episodes left `active` by a previous process can never resume."""
        return self.db.run(
            "UPDATE episodes SET status=?, void_reason=?, ended_at=?, updated_at=?"
            " WHERE status='active'",
            (status, reason, now, now),
        )
