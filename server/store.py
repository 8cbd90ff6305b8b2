"""The store of episodes, every step of every trajectory, every verdict, and where each
episode runs (its placement on a worker), on either engine of server/db.py.

Writes go through one writer thread that batches them into transactions, so the event
loop never waits on the disk. Reads are async and see every write queued before them
(`_after_queued`: they wait for the writer, then run off the event loop); `commit()` is the one
explicit durable point, where the contract says a client is told only what is on disk.
Callers never flush or wrap store calls in threads (`flush()` and the blocking
`StoreReads` are for code on a thread of its own). Several processes may share one
database (SQLite in WAL mode with a busy timeout, or PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from palaestra.sdk.errors import ServerError, UnavailableError
from palaestra.sdk.failures import Failure
from palaestra.sdk.models import (
    EpisodeState,
    StepRecord,
    StepResponse,
    Verdict,
)
from palaestra.server.db import Connection, Database
from palaestra.server.schema import BLOCK_BITS, reserve_block
from palaestra.server.store_reads import StoreReads
from palaestra.server.store_rows import ADD_STEP, Write, runs, statements

_T = TypeVar("_T")

# A marker the writer sets once everything queued before it is committed: an Event for a
# thread that waits, a Future for a coroutine (`commit`).
_Marker = threading.Event | Future[None]
_Item = Write | _Marker | None

log = logging.getLogger("palaestra.store")


def _set(marker: _Marker) -> None:
    if isinstance(marker, threading.Event):
        marker.set()
    elif not marker.done():
        marker.set_result(None)


@dataclass(frozen=True)
class EpisodeRow:
    """A queued episode row: its number (what its steps are stored under) and the future
    that ends when the row is committed (StoreWriteError: it could not be)."""

    number: int
    written: Future[None]


def storable(text: str) -> str:
    """Free text (a void reason quoting a sandbox's output) as every engine stores it alike:
    a NUL (PostgreSQL's text cannot hold one; SQLite's can) becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


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


# Writes in one transaction at most. A commit writes every page the transaction touched, and
# the steps' primary key puts each live episode's next row on a page of its own: with 256
# episodes stepping, a 2,000-row cap made every row pay for ~1/8 of a page (the writer's
# commit cost 1.6 µs a row in bench/batch_inprocess.py; 1.2 µs at 20,000). Bounded in bytes by
# the backlog caps (`Store.behind`).
BATCH_ROWS = 20_000
# How long a batch waits for more writes when nobody waits on it. Steps of one episode
# committed together are chunked into one row (store_rows.py) and share one index page: with
# 256 episodes batch-stepped, 100 ms holds several steps of each, and the writer's CPU a step
# fell from 7.5–8.2 µs at 20 ms to 4.4–4.7 µs (bench/api.py --batch-only, per thread). A
# `kill -9` loses at most this window of mid-episode steps, whose episodes come back void
# either way.
LINGER_S = 0.1


class Store:
    """Episodes, steps, verdicts and placements in `db` (which the store then owns: closing
    the store closes it)."""

    def __init__(
        self, db: Database, max_backlog_bytes: int = 64 << 20, token_backlog_bytes: int = 4 << 20
    ) -> None:
        self.db = db
        # Step records queued and not yet handled by the writer, in bytes: counted in by the
        # event loop's thread and out by the writer's (each counter has one writer thread).
        self.max_backlog_bytes = max_backlog_bytes
        self.token_backlog_bytes = token_backlog_bytes
        self._step_bytes_in = 0
        self._step_bytes_out = 0
        self._queued_by: dict[str, int] = {}  # owner -> bytes queued (the loop's thread)
        self._written_by: dict[str, int] = {}  # owner -> bytes handled (the writer's)
        self.reads = StoreReads(db)  # blocking, for code on a thread of its own
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._urgent = threading.Event()  # set with every marker and stop (`_mark`)
        self.write_errors = 0  # writes dropped because their statement failed
        self.writer_error: str | None = None  # why the writer thread stopped, if it did
        # False once the writer stops (a flag: `Thread.is_alive` costs a lock on every write)
        self._writing = True
        self._writer = threading.Thread(
            target=self._write_loop, name="palaestra-store", daemon=True
        )
        self._writer.start()
        self._closed = False
        self._numbers: range = range(0)  # the episode numbers of the block in hand
        self._catch_up: Future[None] | None = None  # the commit marker `catch_up` waits on

    @property
    def writer_alive(self) -> bool:
        """Whether queued writes are still committed (readiness, /readyz)."""
        return self._writing and self._writer.is_alive() and not self._closed

    def _write_loop(self) -> None:
        try:
            self._write_batches()
        finally:
            self._writing = False

    def _write_batches(self) -> None:
        try:
            conn = self.db.open_connection()
        except Exception as exc:
            self._die(exc)
            return
        events: list[_Marker] = []  # the markers taken off the queue, not yet set
        try:
            while True:
                item = self._queue.get()
                self._urgent.clear()  # a marker already taken (or drained below) woke nobody
                batch: list[Write] = []
                events = []
                stop = False
                linger_until = time.monotonic() + LINGER_S
                while True:
                    if item is None:
                        stop = True
                    elif isinstance(item, threading.Event | Future):
                        events.append(item)
                    else:
                        batch.append(item)
                    if events or len(batch) >= BATCH_ROWS:
                        break  # someone waits on what was queued up to here: commit it now
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        # A busy server's next writes are on their way: one transaction for
                        # them too (an episode's rows share their index pages then). The
                        # writer sleeps through the wait, woken early only by a marker or a
                        # stop: waking at every queued step would cost the event loop a
                        # thread switch and the GIL's hand-over a step.
                        left = linger_until - time.monotonic()
                        if stop or left <= 0:
                            break
                        self._urgent.wait(left)
                        self._urgent.clear()
                        try:
                            item = self._queue.get_nowait()
                        except queue.Empty:
                            break
                if batch:
                    try:
                        conn = self._commit_or_reconnect(conn, batch)
                    finally:
                        self._handled(batch)
                for event in events:
                    _set(event)
                if stop:
                    if self._queue.empty():
                        return
                    self._mark(None)  # what was queued after the stop is written first
        except Exception as exc:  # a bug here, or a database gone: readiness must show it
            log.exception("the store writer failed")
            self._die(exc, events)  # who waits on the batch it failed on is released too
        finally:
            conn.close()

    def _commit_or_reconnect(self, conn: Connection, batch: list[Write]) -> Connection:
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
            for _, _, done, _ in batch:
                if done is not None and not done.done():
                    done.set_exception(_writer_down(reason))
            raise

    def _commit(self, conn: Connection, batch: list[Write]) -> None:
        """One transaction for the batch. When a statement fails, the batch is replayed in
        halves, each half that fails halved again, so that only the failing writes are
        dropped (their callers' futures get the error) and everyone else's are committed:
        a failure costs about 2·log2(n) transactions, not one a write (up to BATCH_ROWS
        durable commits on PostgreSQL)."""
        if len(batch) == 1:
            [(sql, params, done, _)] = batch
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
                return
        else:
            try:
                with conn.transaction():
                    for sql, rows in runs(batch):
                        for statement, bound in statements(sql, rows):
                            conn.executemany(statement, bound)
            except Exception as exc:
                if conn.broken:
                    raise _ConnectionLost(str(exc)) from exc
                half = len(batch) // 2
                self._commit(conn, batch[:half])
                self._commit(conn, batch[half:])
                return
        for _, _, done, _ in batch:
            if done is not None and not done.done():
                done.set_result(None)

    def _die(self, exc: BaseException, taken: list[_Marker] | None = None) -> None:
        self._writing = False  # before the waiters are released: no write is queued after
        self.writer_error = f"{type(exc).__name__}: {exc}"
        log.critical("the store writer stopped: %s", self.writer_error)
        # Nobody may wait forever on a writer that is gone: release every waiter, those of
        # the batch it failed on (`taken` off the queue already) first.
        for marker in taken or ():
            _set(marker)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, threading.Event | Future):
                _set(item)
            elif item is not None and item[2] is not None and not item[2].done():
                item[2].set_exception(_writer_down(self.writer_error))

    def _mark(self, item: _Marker | None) -> None:
        """Queue a marker (someone waits for the writes before it) or the stop, and wake a
        writer that lingers for more writes: it commits now."""
        self._queue.put(item)
        self._urgent.set()

    def _put(
        self,
        sql: str,
        params: tuple[Any, ...],
        wait: bool = False,
        cost: tuple[str, int] | None = None,
    ) -> Future[None] | None:
        """Queue a write; with `wait`, a future that ends when it is committed (or failed).
        A text PostgreSQL cannot hold (a NUL) is refused here, on every engine alike, never
        queued to be dropped by the writer after its caller went on: StoreWriteError, raised
        (or on the future). Wire ids are refused before (sdk/models.py `PlainStr`), JSON
        escapes a NUL, and free text is `storable`: reaching this is a bug, said loudly."""
        done: Future[None] | None = Future() if wait else None
        if any(type(p) is str and "\x00" in p for p in params):
            self.write_errors += 1
            refused = StoreWriteError(f"a NUL character in a text value; not written: {sql[:60]}")
            log.error("store write refused: %s", refused.message)
            if done is None:
                raise refused
            done.set_exception(refused)
            return done
        if not self._writing:
            error = _writer_down(self.writer_error)
            if done is None:
                raise error
            done.set_exception(error)
            return done
        self._queue.put((sql, params, done, cost))
        return done

    # -- writes (queued) ------------------------------------------------------------------
    def create_episode(
        self, state: EpisodeState, task_digest: str, sealed: bool, owner: str | None = None
    ) -> EpisodeRow:
        """Queued, under a new episode number. `owner`: the token id that started it
        (server/tenancy.py)."""
        number = self._next_number()
        written = self._put(
            "INSERT INTO episodes (id, task, task_digest, family, domain, split, sealed, status,"
            " step_count, created_at, updated_at, owner, number)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
                number,
            ),
            wait=True,
        )
        assert written is not None
        return EpisodeRow(number, written)

    def _next_number(self) -> int:
        """A number no other episode of the database has: from the block in hand, or a new
        block (one blocking statement per 2**32 episodes of this process)."""
        if not self._numbers:
            with self.db.transaction() as conn:
                block = reserve_block(conn)
            self._numbers = range(block << BLOCK_BITS, (block + 1) << BLOCK_BITS)
        number = self._numbers[0]
        self._numbers = self._numbers[1:]
        return number

    def add_step(
        self, episode: int, index: int, request_id: str | None, record: str, owner: str = ""
    ) -> None:
        """One step of the episode numbered `episode` (`create_episode`), whose token is
        `owner`; `record` is a StepRecord's JSON (`models.step_record_json`: a NUL in it is
        escaped, so only the request id is scanned, not every value: the hot path). A
        caller that may queue steps faster than the disk takes them waits on `catch_up`
        while the store is `behind` for its owner."""
        if request_id is not None and "\x00" in request_id:
            self._put(ADD_STEP, (episode, index, request_id, record))  # refused there
            return
        if not self._writing:
            raise _writer_down(self.writer_error)
        size = len(record)
        self._queue.put((ADD_STEP, (episode, index, request_id, record), None, (owner, size)))
        self._step_bytes_in += size
        self._queued_by[owner] = self._queued_by.get(owner, 0) + size

    def copy_steps(self, parent: int, child: int, count: int) -> None:
        """Queue a copy of the first `count` step records of the episode numbered `parent`
        under `child` (a fork's trajectory so far): one statement in the database, after
        every record queued before it, never the records through the server."""
        self._put(
            "INSERT INTO step_records (episode, idx, request_id, record)"
            " SELECT ?, idx, request_id, record FROM step_records WHERE episode=? AND idx < ?",
            (child, parent, count),
        )

    def behind(self, owner: str) -> bool:
        """Whether `owner`'s next step must wait for the writer: `owner`'s step records
        queued in memory pass `token_backlog_bytes` (so another token's commit never waits
        behind more than that of it), or everyone's pass `max_backlog_bytes` (memory stays
        bounded whoever fills it)."""
        backlog = self._step_bytes_in - self._step_bytes_out
        if backlog <= self.token_backlog_bytes:  # nobody's is past it: the hot path
            return False
        mine = self._queued_by.get(owner, 0) - self._written_by.get(owner, 0)
        return mine > self.token_backlog_bytes or backlog > self.max_backlog_bytes

    async def catch_up(self, owner: str) -> None:
        """Back-pressure on a step: while `owner` is `behind`, wait for the writer's next
        commit and look again. Every step waiting shares one commit marker: a marker each
        cut the writer's transactions down to a row apiece just when it was behind (2,232
        one-row commits in 4 s of bench/batch_inprocess.py, one per step of a 256-episode
        token), and so kept it behind."""
        while self.behind(owner) and self._writing:
            marker = self._catch_up
            if marker is None or marker.done():
                marker = self._catch_up = Future()
                self._mark(marker)
                if not self._writing:  # `_die` clears it before it releases the queue
                    _set(marker)
            # Shielded: a cancelled step leaves the shared marker to the others. Bounded: a
            # writer that stopped after its last look at the queue never sets it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(marker)), 1.0)

    def _handled(self, batch: list[Write]) -> None:
        """On the writer's thread: the step records of `batch` left the backlog."""
        for _, _, _, cost in batch:
            if cost is not None:
                owner, size = cost
                self._written_by[owner] = self._written_by.get(owner, 0) + size
                self._step_bytes_out += size

    def update_episode(self, state: EpisodeState) -> None:
        self._put(
            "UPDATE episodes SET status=?, step_count=?, updated_at=?, ended_at=?, void_reason=?,"
            " timings=?, metrics=?, failure=? WHERE id=?",
            (
                state.status.value,
                state.step_count,
                state.updated_at,
                state.ended_at,
                None if state.void_reason is None else storable(state.void_reason),
                json.dumps(state.timings),
                state.metrics.model_dump_json(),
                None if state.failure is None else storable(state.failure.model_dump_json()),
                state.episode_id,
            ),
        )

    def put_verdict(self, episode_id: str, verdict: Verdict) -> None:
        self._put(
            "INSERT INTO verdicts (episode_id, verdict) VALUES (?,?)"
            " ON CONFLICT (episode_id) DO UPDATE SET verdict=excluded.verdict",
            (episode_id, verdict.model_dump_json()),
        )

    def put_final_state(self, episode_id: str, record: str) -> None:
        """Queued: what was kept of the episode's final state (server/final_state.py)."""
        self._put("UPDATE episodes SET final_state=? WHERE id=?", (storable(record), episode_id))

    def put_placement(self, episode_id: str, worker: str, node: str) -> None:
        """Queued: `episode_id` runs on `worker` of `node` (cluster mode; `commit` where it
        must be on disk)."""
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

    async def put_group(
        self,
        digest: str,
        task: str,
        scorer: str,
        method: str,
        owner: str | None,
        result: str,
        rewards: dict[str, float],
    ) -> None:
        """Store a judged group and its members' rewards now, in one transaction.
        IntegrityError where the group, or one of its episodes in another group, is stored
        already (a group reward is given once)."""

        def write() -> None:
            with self.db.transaction() as conn:
                conn.execute(
                    "INSERT INTO group_verdicts (digest, task, scorer, method, owner, result,"
                    " created_at) VALUES (?,?,?,?,?,?,?)",
                    (digest, task, scorer, method, owner, result, time.time()),
                )
                for episode_id, reward in rewards.items():
                    conn.execute(
                        "INSERT INTO group_rewards (episode_id, group_digest, reward)"
                        " VALUES (?,?,?)",
                        (episode_id, digest, reward),
                    )

        await self._after_queued(write)

    def add_sampler_release(self, task: str, at: float) -> None:
        self._put("INSERT INTO sampler_releases (task, at) VALUES (?,?)", (task, at))

    def flush(self) -> None:
        """Wait until everything queued before is committed (or dropped, or the writer died)."""
        if not self._writer.is_alive():
            return
        event = threading.Event()
        self._mark(event)
        while not event.wait(1.0):
            if not self._writer.is_alive():  # died between the check and the put
                return

    async def commit(self) -> None:
        """Return once everything queued before is committed: where the contract says a
        client is told only what is on disk (an episode started, ended or verified)."""
        if not self._writer.is_alive():
            return
        marker: Future[None] = Future()
        self._mark(marker)
        if not self._writer.is_alive():  # died between the check and the put
            _set(marker)
        await asyncio.wrap_future(marker)

    async def _after_queued(self, call: Callable[..., _T], *args: Any) -> _T:
        """`call` (a `StoreReads` read, or a direct statement) once every write queued
        before is committed, off the event loop: it never misses a write made before it."""
        await self.commit()
        return await asyncio.to_thread(call, *args)

    # -- reads (async; each sees every write queued before it) --------------------------
    async def load_episode(
        self, episode_id: str, with_trajectory: bool = True
    ) -> EpisodeState | None:
        return await self._after_queued(self.reads.load_episode, episode_id, with_trajectory)

    async def load_steps(self, episode_id: str, count: int | None = None) -> list[StepRecord]:
        return await self._after_queued(self.reads.load_steps, episode_id, count)

    async def find_step(self, episode_id: str, request_id: str) -> StepResponse | None:
        return await self._after_queued(self.reads.find_step, episode_id, request_id)

    async def owners(self, keys: tuple[str, ...]) -> dict[str, tuple[str | None, bool]]:
        return await self._after_queued(self.reads.owners, keys)

    async def starts_since(self, since: float) -> list[tuple[str, float]]:
        return await self._after_queued(self.reads.starts_since, since)

    async def sampler_history(
        self, limit: int
    ) -> list[tuple[float, str, str, float, bool, str | None]]:
        return await self._after_queued(self.reads.sampler_history, limit)

    async def placement(self, episode_id: str) -> tuple[str, str] | None:
        return await self._after_queued(self.reads.placement, episode_id)

    async def active_on(self, worker: str) -> list[str]:
        return await self._after_queued(self.reads.active_on, worker)

    async def final_state(self, episode_id: str) -> str | None:
        return await self._after_queued(self.reads.final_state, episode_id)

    async def group_result(self, digest: str) -> str | None:
        return await self._after_queued(self.reads.group_result, digest)

    async def groups_of(self, keys: tuple[str, ...]) -> dict[str, str]:
        return await self._after_queued(self.reads.groups_of, keys)

    async def mark_unfinished(
        self, status: str, reason: str, now: float, failure: Failure | None = None
    ) -> int:
        """At start-up: episodes left `active` by a previous process can never resume."""
        sql = (
            "UPDATE episodes SET status=?, void_reason=?, ended_at=?, updated_at=?, failure=?"
            " WHERE status='active'"
        )
        typed = None if failure is None else failure.model_dump_json()
        return await self._after_queued(self.db.run, sql, (status, reason, now, now, typed))

    async def aclose(self) -> None:
        """`close`, off the event loop (it waits for the writer to commit what is queued)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Commit what is queued, stop the writer and close the database."""
        if not self._closed:
            self._closed = True
            self._mark(None)
            self._writer.join()
            self.db.close()
