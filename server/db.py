"""The one database of a server: embedded SQLite (a file) or PostgreSQL (a URL).

`Database.open(target)` connects, checks and migrates (server/schema.py). SQL is written
once, the SQLite way: `?` parameters and the standard upserts both engines speak
(`INSERT … ON CONFLICT (…) DO UPDATE/NOTHING`); the PostgreSQL dialect rewrites the
parameters, and in migrations the column types. Connections are pooled (a few idle ones
kept), never opened per query; `connection()` runs statements in autocommit,
`transaction()` groups them (`BEGIN IMMEDIATE` on SQLite, so writers queue on the busy
timeout instead of failing). A PostgreSQL that cannot be reached is `store_unavailable`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from palaestra.sdk.errors import UnavailableError
from palaestra.server.schema import MIGRATIONS, Migration

IDLE_CONNECTIONS = 8  # kept open between uses; more may be open at once
BUSY_TIMEOUT_S = 30.0  # SQLite: how long a writer waits for another process's lock
CONNECT_TIMEOUT_S = 10  # PostgreSQL: how long to wait for the server to answer
MIGRATION_LOCK = 0x70616C61  # PostgreSQL advisory lock: one process migrates at a time
SCHEMES = "a path, sqlite://PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"


class StoreUnavailableError(UnavailableError):
    """The database cannot be opened or reached (a wrong URL, a server that is down)."""

    default_code = "store_unavailable"


class IntegrityError(Exception):
    """A constraint refused a write (a duplicate key), on either engine."""


class Cursor(Protocol):
    rowcount: int
    description: Any

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class _Rows:
    """A statement's rows and row count, fetched while its connection was held."""

    def __init__(self, cursor: Cursor) -> None:
        self.rowcount = cursor.rowcount
        self.rows = cursor.fetchall() if cursor.description is not None else []


def redact(url: str) -> str:
    """`url` without its password (safe to log and to show)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


@functools.lru_cache(maxsize=1024)
def pg_sql(sql: str) -> str:
    """qmark parameters → psycopg's `%s` (a literal `%` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


_PG_TYPES = {"REAL": "DOUBLE PRECISION", "INTEGER": "BIGINT", "BLOB": "BYTEA"}
_TYPE_WORD = re.compile(r"\b(REAL|INTEGER|BLOB)\b")


def pg_ddl(sql: str) -> str:
    """SQLite column types → PostgreSQL's (REAL is 4 bytes there, INTEGER 4: too small)."""
    return _TYPE_WORD.sub(lambda m: _PG_TYPES[m.group(1)], sql)


class Connection:
    """One driver connection and its dialect; `execute` takes SQLite-flavoured SQL."""

    def __init__(self, raw: Any, engine: str) -> None:
        self.raw = raw
        self.engine = engine
        self.postgres = engine == "postgresql"
        if self.postgres:
            import psycopg

            self._integrity: type[Exception] = psycopg.IntegrityError
        else:
            self._integrity = sqlite3.IntegrityError

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        try:
            if self.postgres:
                cursor: Cursor = self.raw.execute(pg_sql(sql), params)
                return cursor
            return self.raw.execute(sql, params)  # type: ignore[no-any-return]
        except self._integrity as exc:
            raise IntegrityError(str(exc)) from exc

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self.postgres:
            with self.raw.cursor() as cursor:
                cursor.executemany(pg_sql(sql), rows)
        else:
            self.raw.executemany(sql, rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """The block as one transaction: committed at its end, rolled back on an error."""
        if self.postgres:
            with self.raw.transaction():
                yield self
            return
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.raw.execute("ROLLBACK")
            raise
        self.raw.execute("COMMIT")

    @property
    def broken(self) -> bool:
        """Whether the connection is lost (PostgreSQL down or restarted)."""
        return bool(self.postgres and (self.raw.broken or self.raw.closed))

    def columns(self, table: str) -> set[str]:
        if self.postgres:
            rows = self.all(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = ?",
                (table,),
            )
            return {row[0] for row in rows}
        return {row[1] for row in self.raw.execute(f"PRAGMA table_info({table})")}

    def json_field(self, column: str, key: str) -> str:
        """An SQL expression: the JSON text `column`'s top-level `key` (a number or a bool:
        SQLite gives 1/0 for a bool, PostgreSQL 'true'/'false' text; compare in Python)."""
        if self.postgres:
            return f"(CAST({column} AS jsonb) ->> '{key}')"
        return f"json_extract({column}, '$.{key}')"

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a lost connection may fail to close: it is gone
            self.raw.close()


class Database:
    """A database by URL, its pool of connections and its schema version."""

    def __init__(self, url: str, engine: str, target: str) -> None:
        self.url = url  # as given, with its password: never log it, log `shown`
        self.shown = redact(url)
        self.engine = engine
        self._target = target  # the SQLite file or the PostgreSQL URL
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, target: str | Path) -> Database:
        """Connect, check and migrate; StoreUnavailableError names what to fix."""
        text = str(target)
        scheme = urlsplit(text).scheme if "://" in text else ""
        if scheme in ("postgresql", "postgres"):
            db = cls(text, "postgresql", text)
        elif scheme in ("", "sqlite"):
            # sqlite://PATH: sqlite:///abs/file or sqlite://relative/file
            path = Path(text.removeprefix("sqlite://")).expanduser()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailableError(
                    f"store {text}: cannot make its folder: {exc}"
                ) from None
            db = cls(text, "sqlite", str(path))
        else:
            raise StoreUnavailableError(
                f"store {redact(text)!r}: scheme {scheme!r} is not supported; use {SCHEMES}",
                code="bad_store",
                retryable=False,
            )
        try:
            db.migrate()
        except BaseException:
            db.close()
            raise
        return db

    # -- connections ------------------------------------------------------------------------
    def open_connection(self) -> Connection:
        """A new connection of its own (the store writer holds one); close it when done."""
        if self.engine == "postgresql":
            import psycopg

            try:
                pg = psycopg.connect(
                    self._target, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                )
            except psycopg.Error as exc:
                raise StoreUnavailableError(self._why(exc)) from None
            return Connection(pg, self.engine)
        try:
            raw = sqlite3.connect(
                self._target, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
            )
            raw.execute("PRAGMA journal_mode=WAL")  # readers never wait on the writer
            raw.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"store {self.shown}: cannot open it: {exc}") from None
        return Connection(raw, self.engine)

    def _why(self, exc: Exception) -> str:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = "; ".join(lines) or type(exc).__name__
        parts = urlsplit(self.url)
        if parts.password:
            detail = detail.replace(parts.password, "***")
        if "does not exist" in detail:
            fix = "create the database (createdb) or fix the URL's database name"
        elif "authentication failed" in detail or "password" in detail:
            fix = "fix the user or password in the URL"
        else:
            host = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
            fix = f"is PostgreSQL running and reachable at {host}? check the URL's host and port"
        return f"cannot open the store {self.shown}: {detail} ({fix}; the --store setting)"

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection (autocommit); a lost one is dropped and reported 503."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self.open_connection()
        try:
            yield conn
        except Exception as exc:
            if conn.broken:  # the server restarted or went away: so did the idle ones
                conn.close()
                with self._lock:
                    idle, self._idle = self._idle, []
                for other in idle:
                    other.close()
                raise StoreUnavailableError(self._why(exc)) from None
            self._release(conn)
            raise
        self._release(conn)

    def _release(self, conn: Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.connection() as conn, conn.transaction():
            yield conn

    def _once_more(self, sql: str, params: Sequence[Any]) -> _Rows:
        """One statement; when the pooled connection it ran on was lost (a PostgreSQL that
        restarted since), once more on a new one."""
        try:
            with self.connection() as conn:
                return _Rows(conn.execute(sql, params))
        except StoreUnavailableError:
            pass  # that connection was stale: a new one, or the same error again
        with self.connection() as conn:
            return _Rows(conn.execute(sql, params))

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._once_more(sql, params).rows
        return rows[0] if rows else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._once_more(sql, params).rows

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One write statement (atomic on its own); the rows it changed."""
        return self._once_more(sql, params).rowcount

    def ping(self) -> str | None:
        """Why the database cannot be reached now (None: it answers)."""
        try:
            self.one("SELECT 1")
        except StoreUnavailableError as exc:
            return exc.message
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- schema -----------------------------------------------------------------------------
    def version(self) -> int:
        row = self.one("SELECT MAX(version) FROM schema_migrations")
        return int(row[0] or 0)

    def migrate(self) -> list[int]:
        """Apply the migrations this database lacks, in one transaction; the versions run."""
        latest = MIGRATIONS[-1].version
        with self.transaction() as conn:
            if conn.postgres:  # SQLite's BEGIN IMMEDIATE already serialises writers
                conn.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            self._ddl(
                conn,
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)",
            )
            done = {row[0] for row in conn.all("SELECT version FROM schema_migrations")}
            if done and max(done) > latest:
                raise StoreUnavailableError(
                    f"the store {self.shown} is at schema version {max(done)}, made by a newer "
                    f"palaestra (this one knows up to {latest}): upgrade palaestra",
                    retryable=False,
                )
            ran = []
            for migration in MIGRATIONS:
                if migration.version not in done:
                    self._apply(conn, migration)
                    ran.append(migration.version)
        return ran

    def _apply(self, conn: Connection, migration: Migration) -> None:
        for statement in migration.statements:
            self._ddl(conn, statement)
        for table, column, decl in migration.columns:
            if column not in conn.columns(table):
                self._ddl(conn, f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        if migration.then is not None:
            migration.then(conn)
        conn.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?,?,?)",
            (migration.version, migration.name, time.time()),
        )

    @staticmethod
    def _ddl(conn: Connection, statement: str) -> None:
        conn.execute(pg_ddl(statement) if conn.postgres else statement)
