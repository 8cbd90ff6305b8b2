"""The store's tables as an ordered list of migrations, the same on SQLite and PostgreSQL.

A migration runs once per database (table `schema_migrations`); each is idempotent, so a
store made before the migrations were versioned (which already has some tables and
columns) is upgraded by running them all. Column types are written the SQLite way and
translated for PostgreSQL by server/db.py (REAL, INTEGER, BLOB). Never edit a migration
that has shipped: append a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from palaestra.server.db import Connection

# Episode numbers are handed out in blocks (`Store` reserves one at a time, one process or
# several sharing the database): a number is `block << BLOCK_BITS | n`, under 2**63.
BLOCK_BITS = 32
RESERVE_BLOCK = (
    "INSERT INTO counters (name, value) VALUES ('episode_blocks', 1)"
    " ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value"
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...] = ()
    # (table, column, declaration): added where the column is missing
    columns: tuple[tuple[str, str, str], ...] = ()
    # what SQL alone cannot say, run last (it must be idempotent too)
    then: Callable[[Connection], None] | None = None


def reserve_block(conn: Connection) -> int:
    """The next block of episode numbers (inside the caller's transaction)."""
    return int(conn.one(RESERVE_BLOCK)[0])


def _number_stepped_episodes(conn: Connection) -> None:
    """Move the steps of a store made before migration 7 under their episode's number."""
    conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS episodes_number ON episodes (number)")
    if not conn.columns("steps"):
        return
    stepped = [row[0] for row in conn.all("SELECT DISTINCT episode_id FROM steps")]
    for start in range(0, len(stepped), 1 << BLOCK_BITS):
        block = reserve_block(conn)
        for n, episode_id in enumerate(stepped[start : start + (1 << BLOCK_BITS)]):
            number = block << BLOCK_BITS | n
            conn.execute("UPDATE episodes SET number=? WHERE id=?", (number, episode_id))
            conn.execute(
                "INSERT INTO step_records (episode, idx, request_id, record)"
                " SELECT ?, idx, request_id, record FROM steps WHERE episode_id=?",
                (number, episode_id),
            )
    conn.execute("DROP TABLE steps")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "episodes, steps, verdicts, tokens, the pack index, sampler releases",
        (
            """CREATE TABLE IF NOT EXISTS episodes (
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
                info TEXT NOT NULL DEFAULT '{}'
            )""",
            # No index on request_id: a replay lookup scans one episode's steps through the
            # primary key, and a second index would double the cost of every step's insert.
            """CREATE TABLE IF NOT EXISTS steps (
                episode_id TEXT NOT NULL,
                idx INTEGER NOT NULL,
                request_id TEXT,
                record TEXT NOT NULL,
                PRIMARY KEY (episode_id, idx)
            )""",
            "DROP INDEX IF EXISTS steps_request",
            """CREATE TABLE IF NOT EXISTS verdicts (
                episode_id TEXT PRIMARY KEY,
                verdict TEXT NOT NULL
            )""",
            # Bearer tokens (server/auth.py): only the sha256 of a token is kept.
            """CREATE TABLE IF NOT EXISTS tokens (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL UNIQUE,
                hash TEXT NOT NULL UNIQUE,
                scopes TEXT NOT NULL,
                created_at REAL NOT NULL,
                revoked_at REAL
            )""",
            # The index of the content-addressed pack store (server/packs/registry.py): a row
            # is what makes a published version live.
            """CREATE TABLE IF NOT EXISTS published_packs (
                name TEXT NOT NULL,
                version TEXT NOT NULL,
                digest TEXT NOT NULL,
                published_at REAL NOT NULL,
                publisher TEXT NOT NULL,
                PRIMARY KEY (name, version)
            )""",
            # Published packs an admin let into unfiltered sampling.
            """CREATE TABLE IF NOT EXISTS enabled_packs (
                name TEXT PRIMARY KEY,
                enabled_at REAL NOT NULL,
                enabled_by TEXT NOT NULL
            )""",
            # The sampler rebuilds its stats from episodes; admin releases of quarantined
            # tasks are kept so a restart does not quarantine them again.
            "CREATE INDEX IF NOT EXISTS episodes_ended ON episodes (ended_at)",
            "CREATE TABLE IF NOT EXISTS sampler_releases (task TEXT NOT NULL, at REAL NOT NULL)",
        ),
    ),
    Migration(
        2,
        "per-episode metrics and owners (server/tenancy.py)",
        columns=(
            ("episodes", "metrics", "TEXT NOT NULL DEFAULT '{}'"),
            ("episodes", "owner", "TEXT"),
        ),
    ),
    Migration(
        3,
        "token orgs and quotas",
        columns=(
            ("tokens", "orgs", "TEXT NOT NULL DEFAULT ''"),
            ("tokens", "max_live", "INTEGER"),
            ("tokens", "max_episodes_per_hour", "INTEGER"),
            ("tokens", "max_cpu_s_per_hour", "REAL"),
        ),
    ),
    Migration(
        4,
        "publisher quotas, sandboxed generation and yanking in the pack index",
        columns=(
            ("published_packs", "bytes", "INTEGER NOT NULL DEFAULT 0"),
            # the index digest of sandbox-generated tasks
            ("published_packs", "generated", "TEXT NOT NULL DEFAULT ''"),
            # withdrawn: hidden from `name` and from sampling, exact pins still work
            ("published_packs", "yanked_at", "REAL"),
            ("published_packs", "yanked_by", "TEXT"),
        ),
    ),
    Migration(
        5,
        "episode placements on workers and content-addressed blobs (cluster mode)",
        (
            """CREATE TABLE IF NOT EXISTS placements (
                episode_id TEXT PRIMARY KEY,
                worker TEXT NOT NULL,
                node TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            "CREATE INDEX IF NOT EXISTS placements_worker ON placements (worker)",
            """CREATE TABLE IF NOT EXISTS blobs (
                digest TEXT PRIMARY KEY,
                data BLOB NOT NULL,
                created_at REAL NOT NULL
            )""",
        ),
    ),
    Migration(
        6,
        "group rewards (server/groups.py): a group's judged result, each member's reward",
        (
            """CREATE TABLE IF NOT EXISTS group_verdicts (
                digest TEXT PRIMARY KEY,
                task TEXT NOT NULL,
                scorer TEXT NOT NULL,
                method TEXT NOT NULL,
                owner TEXT,
                result TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            # One group an episode: the primary key is what makes a group reward final.
            """CREATE TABLE IF NOT EXISTS group_rewards (
                episode_id TEXT PRIMARY KEY,
                group_digest TEXT NOT NULL,
                reward REAL NOT NULL
            )""",
        ),
    ),
    Migration(
        7,
        "steps keyed by an episode number (an integer key costs half a text one per step)",
        (
            "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
            # `episode` is episodes.number. No index on request_id: a replay lookup scans
            # one episode's steps through the primary key (a second index would double the
            # cost of every step's insert).
            """CREATE TABLE IF NOT EXISTS step_records (
                episode INTEGER NOT NULL,
                idx INTEGER NOT NULL,
                request_id TEXT,
                record TEXT NOT NULL,
                PRIMARY KEY (episode, idx)
            )""",
        ),
        columns=(("episodes", "number", "INTEGER"),),
        then=_number_stepped_episodes,
    ),
    Migration(
        8,
        "typed failures (sdk/failures.py): an ended episode's failure, as JSON",
        columns=(("episodes", "failure", "TEXT"),),
    ),
    Migration(
        9,
        "kept final states (server/final_state.py): what a verifier saw, for regrading",
        columns=(("episodes", "final_state", "TEXT"),),
    ),
    Migration(
        10,
        "held-out draws (server/draws.py): the draw each rotated sealed split serves",
        (
            """CREATE TABLE IF NOT EXISTS heldout_draws (
                pack TEXT NOT NULL,
                split TEXT NOT NULL,
                draw INTEGER NOT NULL,
                drawn_at REAL NOT NULL,
                drawn_by TEXT NOT NULL,
                PRIMARY KEY (pack, split)
            )""",
        ),
    ),
    Migration(
        11,
        "episode checkpoints (server/checkpoint.py): an episode's last, to resume it",
        (
            # `workspace`: the digest of its workdir's snapshot (server/snapshots.py);
            # `record`: the family's state and what the host keeps, as JSON
            """CREATE TABLE IF NOT EXISTS checkpoints (
                episode_id TEXT PRIMARY KEY,
                id TEXT NOT NULL,
                created_at REAL NOT NULL,
                step_count INTEGER NOT NULL,
                workspace TEXT,
                workspace_bytes INTEGER NOT NULL DEFAULT 0,
                record TEXT NOT NULL
            )""",
        ),
    ),
)
