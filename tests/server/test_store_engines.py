"""The store, tokens, quotas' starts and the pack index on both engines (SQLite and a real
PostgreSQL, tests/pg.py); migrations of an existing SQLite store; two processes on one store;
wrong store URLs; a PostgreSQL connection lost mid-run."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from conftest import BIN, ServerProcess, cli_env
from pg import PASSWORD_ROLE, PostgresServer

from palaestra.sdk.errors import BadRequestError, UnavailableError
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    Observation,
    StepRecord,
    Verdict,
    VerifierInfo,
)
from palaestra.server import auth
from palaestra.server.db import Database, StoreUnavailableError, redact
from palaestra.server.packs.archive import pack_archive
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.schema import MIGRATIONS
from palaestra.server.store import Store, StoreWriteError
from server.packs.test_registry import write_pack

PEER = Path(__file__).parents[1] / "programs" / "store_peer.py"
LATEST = MIGRATIONS[-1].version
ECHO = "palaestra/echo:say-birch"


def state(episode_id: str, status: str = "active", at: float | None = None) -> EpisodeState:
    now = time.time() if at is None else at
    return EpisodeState(
        episode_id=episode_id,
        task=ECHO,
        family="echo",
        domain="echo/say",
        split="train",
        status=status,
        step_count=0,
        created_at=now,
        updated_at=now,
    )


def verdict(reward: float, passed: bool) -> Verdict:
    return Verdict(reward=reward, passed=passed, verifier=VerifierInfo(name="t", version="1"))


def record(index: int, text: str = "") -> str:
    step = StepRecord(
        index=index,
        request_id=f"r{index}",
        action=Action(tool="echo", arguments={"text": text}),
        observation=Observation(text=text),
        reward=0.5,
    )
    return step.model_dump_json()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = Store(Database.open(store_url))
    try:
        yield opened
    finally:
        opened.close()


def test_episodes_steps_verdicts_and_replays(store: Store) -> None:
    started = state("e1")
    e1 = store.create_episode(started, "sha256:d", True, owner="tok1").number
    for i in range(3):
        store.add_step(e1, i, f"r{i}", record(i, f"t{i} é ✓ 'quoted' %s ?"))
    store.add_step(e1, 2, "r2", record(2, "replaced"))  # the same index again: replaced
    ended = state("e1", "done").model_copy(update={"step_count": 3, "ended_at": time.time()})
    ended.timings["verify_s"] = 0.25
    store.update_episode(ended)
    store.put_verdict("e1", verdict(1.0, True))
    store.put_verdict("e1", verdict(0.75, False))  # the last one stands
    store.flush()
    loaded = store.reads.load_episode("e1")
    assert loaded is not None and loaded.status.value == "done" and loaded.step_count == 3
    assert loaded.timings == {"verify_s": 0.25}
    assert [s.observation.text for s in loaded.trajectory] == [
        "t0 é ✓ 'quoted' %s ?",
        "t1 é ✓ 'quoted' %s ?",
        "replaced",
    ]
    assert loaded.verdict is not None and loaded.verdict.reward == 0.75
    assert len(store.reads.load_steps("e1", 2)) == 2
    replay = store.reads.find_step("e1", "r1")
    assert replay is not None and replay.observation.text.startswith("t1")
    assert store.reads.find_step("e1", "nope") is None and store.reads.load_episode("nope") is None
    assert store.reads.is_sealed("e1") and not store.reads.is_sealed("nope")
    assert abs(loaded.created_at - started.created_at) < 1e-6  # a double, not a 4-byte REAL


def test_owners_quota_starts_and_counts(store: Store) -> None:
    now = time.time()
    store.create_episode(state("a", at=now - 7200), "d", False, owner="old")
    store.create_episode(state("b", at=now - 10), "d", True, owner="tok")
    store.create_episode(state("c", at=now - 5), "d", False)  # embedded: no owner
    store.flush()
    assert store.reads.owners(("a", "b", "c", "zz")) == {
        "a": ("old", False),
        "b": ("tok", True),
        "c": (None, False),
    }
    starts = store.reads.starts_since(now - 3600)  # tenancy's quota window at start-up
    assert [owner for owner, _ in starts] == ["tok"] and abs(starts[0][1] - (now - 10)) < 1e-6
    assert store.reads.count_by_status() == {"active": 3}


def test_sampler_history_and_unfinished_episodes(store: Store) -> None:
    now = time.time()
    for i, (status, given) in enumerate(
        [("done", verdict(1.0, True)), ("done", verdict(0.25, False))]
    ):
        store.create_episode(state(f"s{i}"), "d", False)
        store.put_verdict(f"s{i}", given)
        store.update_episode(
            state(f"s{i}", status).model_copy(update={"ended_at": now + i, "updated_at": now + i})
        )
    store.create_episode(state("v"), "d", False)
    void = state("v", "void").model_copy(update={"ended_at": now + 2, "void_reason": "crash"})
    store.update_episode(void)
    store.add_sampler_release("palaestra/echo:say-birch", now + 3)
    store.create_episode(state("live"), "d", False)
    store.flush()
    history = store.reads.sampler_history(10)
    assert [(h[2], h[3], h[4], h[5]) for h in history] == [
        ("done", 1.0, True, None),
        ("done", 0.25, False, None),
        ("void", 0.0, False, "crash"),
        ("release", 0.0, False, None),
    ]
    assert [h[2] for h in store.reads.sampler_history(1)] == ["void", "release"]
    assert asyncio.run(store.mark_unfinished("void", "server restarted", now + 5)) == 1
    gone = store.reads.load_episode("live", with_trajectory=False)
    assert gone is not None and gone.status.value == "void"
    assert gone.void_reason == "server restarted"


def test_placements_and_blobs(store: Store) -> None:
    for eid in ("p1", "p2", "p3"):
        store.create_episode(state(eid), "d", False)
    store.put_placement("p1", "w1", "node-a")
    store.put_placement("p2", "w1", "node-a")
    store.put_placement("p3", "w2", "node-b")
    store.put_placement("p2", "w2", "node-b")  # moved: the last placement stands
    store.update_episode(state("p3", "done"))
    store.flush()
    assert store.reads.placement("p1") == ("w1", "node-a") and store.reads.placement("p2") == (
        "w2",
        "node-b",
    )
    assert store.reads.placement("nope") is None
    assert store.reads.active_on("w1") == ["p1"] and store.reads.active_on("w2") == ["p2"]
    assert store.reads.active_on("w9") == []
    data = bytes(range(256)) * 40  # every byte value, NUL included
    store.put_blob("sha256:aa", data)
    store.put_blob("sha256:aa", data)  # idempotent
    assert store.reads.get_blob("sha256:aa") == data and store.reads.get_blob("sha256:bb") is None


def test_an_async_read_sees_every_write_queued_before_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No caller flushes (issue 33): a read waits for the writer itself, however slow its
    commits are (here 0.3 s each: a read that did not wait would find nothing)."""
    commit = store._commit

    def slow(conn: object, batch: list[object]) -> None:
        time.sleep(0.3)
        commit(conn, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_commit", slow)

    async def scenario() -> None:
        q1 = store.create_episode(state("q1"), "sha256:q", True, owner="tok").number
        store.add_step(q1, 0, "r0", record(0))
        loaded = await store.load_episode("q1")
        assert loaded is not None and len(loaded.trajectory) == 1
        assert await store.owners(("q1",)) == {"q1": ("tok", True)}
        store.add_step(q1, 1, "r1", record(1))
        assert [s.index for s in await store.load_steps("q1")] == [0, 1]
        assert await store.find_step("q1", "r1") is not None

    asyncio.run(scenario())


def test_server_code_never_flushes_the_store_or_reads_it_on_a_thread() -> None:
    """The store's own reads wait for its writer and leave the event loop (issue 33)."""
    root = Path(__file__).resolve().parents[2] / "server"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name in ("store.py", "store_reads.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            # (the tokens' own table through store.db is the auth module's: issue 33, item 1)
            if "store.flush(" in line or re.search(r"to_thread\(.*\bstore\.(?!db\b)", line):
                offenders.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_a_failing_write_fails_alone(store: Store) -> None:
    x = store.create_episode(state("x"), "d", False).number
    dup = store.create_episode(state("x"), "d", False)
    store.add_step(x, 2**70, None, "{}")  # an int no column holds, nobody waits on it
    after = store.create_episode(state("y"), "d", False)
    store.add_step(after.number, 0, "r0", record(0))
    store.flush()
    with pytest.raises(StoreWriteError):
        dup.written.result(timeout=5)
    assert after.written.result(timeout=5) is None
    assert store.write_errors == 2 and store.writer_alive
    assert store.reads.find_step("y", "r0") is not None


def test_tokens_on_both_engines(store_url: str) -> None:
    db = Database.open(store_url)
    try:
        token, made = auth.create_token(
            db, ["train", "publish"], name="t1", orgs=["acme"], quota=auth.Quota(3, 10, 2.5)
        )
        with pytest.raises(BadRequestError, match="exists already"):
            auth.create_token(db, ["train"], name="t1")
        principal = auth.lookup(db, auth.hash_token(token))
        assert principal is not None and principal.token_id == made["id"]
        assert principal.orgs == {"acme"} and principal.quota == auth.Quota(3, 10, 2.5)
        assert [r["name"] for r in auth.list_tokens(db)] == ["t1"]
        assert auth.revoke_token(db, "t1") == [auth.hash_token(token)]
        assert auth.revoke_token(db, "t1") == []
        assert auth.lookup(db, auth.hash_token(token)) is None
        assert auth.list_tokens(db)[0]["revoked"]
    finally:
        db.close()


def test_pack_index_on_both_engines(store_url: str, tmp_path: Path) -> None:
    db = Database.open(store_url)
    try:
        registry = PackRegistry(tmp_path / "data", db)
        src = write_pack(tmp_path / "p", "test/p", "1.0.0")
        pack, created = registry.install(pack_archive(src), publisher="pub", families=["echo"])
        assert created and registry.find("test/p", "1.0.0") is not None
        assert not registry.install(pack_archive(src), publisher="pub", families=["echo"])[1]
        assert registry.usage("pub")[1] == 1 and registry.usage("pub")[0] > 0
        assert registry.enabled() == {"test/p"} and not registry.enable("test/p", "admin")
        assert registry.yank("test/p", "1.0.0", "pub")
        assert registry.yanked() == {("test/p", "1.0.0")}
        assert registry.yank("test/p", "1.0.0", "pub", undo=True) and registry.yanked() == set()
        catalog = PackCatalog(b"s" * 32)
        assert registry.load_into(catalog, ["echo"]) == 1 and catalog.sampled("test/p")
        assert [p.digest for p in registry.published("test/p")] == [pack.digest]
    finally:
        db.close()


# -- migrations ------------------------------------------------------------------------------

# The tables as main made them before versioned migrations (server/store.py's SCHEMA then),
# less the columns later versions added (episodes.metrics/owner, tokens.orgs and quotas).
OLD_SCHEMA = """
CREATE TABLE episodes (id TEXT PRIMARY KEY, task TEXT NOT NULL, task_digest TEXT NOT NULL,
    family TEXT NOT NULL, domain TEXT NOT NULL, split TEXT NOT NULL, sealed INTEGER NOT NULL,
    status TEXT NOT NULL, step_count INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, ended_at REAL, void_reason TEXT,
    timings TEXT NOT NULL DEFAULT '{}', info TEXT NOT NULL DEFAULT '{}');
CREATE TABLE steps (episode_id TEXT NOT NULL, idx INTEGER NOT NULL, request_id TEXT,
    record TEXT NOT NULL, PRIMARY KEY (episode_id, idx));
CREATE INDEX steps_request ON steps (episode_id, request_id);
CREATE TABLE verdicts (episode_id TEXT PRIMARY KEY, verdict TEXT NOT NULL);
CREATE TABLE tokens (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, hash TEXT NOT NULL UNIQUE,
    scopes TEXT NOT NULL, created_at REAL NOT NULL, revoked_at REAL);
CREATE TABLE published_packs (name TEXT NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL,
    published_at REAL NOT NULL, publisher TEXT NOT NULL, bytes INTEGER NOT NULL DEFAULT 0,
    generated TEXT NOT NULL DEFAULT '', yanked_at REAL, yanked_by TEXT,
    PRIMARY KEY (name, version));
CREATE TABLE enabled_packs (name TEXT PRIMARY KEY, enabled_at REAL NOT NULL,
    enabled_by TEXT NOT NULL);
INSERT INTO episodes (id, task, task_digest, family, domain, split, sealed, status, created_at,
    updated_at) VALUES ('old', 'palaestra/echo:say-birch', 'd', 'echo', 'echo/say', 'train', 0,
    'done', 1.5, 2.5);
INSERT INTO steps VALUES ('old', 0, 'r0', '{"index": 0, "action": {"tool": "echo"},
    "observation": {"text": "kept"}}');
INSERT INTO verdicts VALUES ('old', '{"reward": 1.0, "passed": true,
    "verifier": {"name": "echo", "version": "1"}}');
INSERT INTO tokens VALUES ('tid', 'old-token', 'h4sh', 'train', 1.0, NULL);
"""


def test_an_old_sqlite_store_opens_and_upgrades(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "palaestra.sqlite3"
    with sqlite3.connect(path) as old:
        old.executescript(OLD_SCHEMA)
    db = Database.open(path)
    store = Store(db)
    try:
        assert db.version() == LATEST
        kept = store.reads.load_episode("old")
        assert kept is not None and kept.trajectory[0].observation.text == "kept"
        assert kept.verdict is not None and kept.verdict.passed
        assert kept.metrics.steps == 0  # the added column's default
        assert store.reads.owners(("old",)) == {"old": (None, False)}
        principal = auth.lookup(db, "h4sh")
        assert principal is not None and principal.orgs == frozenset()
        with db.connection() as conn:
            assert {"metrics", "owner"} <= conn.columns("episodes")
            assert {"orgs", "max_live", "max_cpu_s_per_hour"} <= conn.columns("tokens")
            indexes = {r[0] for r in conn.all("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "steps_request" not in indexes and "placements_worker" in indexes
        assert not conn.columns("steps")  # moved under the episodes' numbers
        new = store.create_episode(state("new"), "d", False).number
        store.add_step(new, 0, "r0", record(0, "fresh"))
        store.flush()
        assert [s.observation.text for s in store.reads.load_steps("new")] == ["fresh"]
        assert store.reads.load_steps("old")[0].observation.text == "kept"
        store.put_placement("old", "w", "n")  # the new tables are there
        store.flush()
        assert store.reads.placement("old") == ("w", "n")
    finally:
        store.close()
    assert Database.open(path).migrate() == []  # a second open runs nothing


def test_migrations_on_postgres_are_recorded_once(pg_url: str) -> None:
    first = Database.open(pg_url)
    try:
        assert first.version() == LATEST and first.migrate() == []
        rows = first.all("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == [m.version for m in MIGRATIONS]
        with first.connection() as conn:
            assert "owner" in conn.columns("episodes") and "data" in conn.columns("blobs")
        first.run("UPDATE schema_migrations SET version = 999 WHERE version = ?", (LATEST,))
        with pytest.raises(StoreUnavailableError, match="newer palaestra"):
            Database.open(pg_url)
    finally:
        first.close()


# -- many processes ----------------------------------------------------------------------------


def test_two_processes_share_one_store(store_url: str) -> None:
    """Another process reads what this one wrote, then both write at once; each sees all."""
    mine = Store(Database.open(store_url))
    try:
        a0 = mine.create_episode(state("a-0"), "d", False).number
        for i in range(4):
            mine.add_step(a0, i, f"r{i}", record(i))
        mine.flush()
        peer = subprocess.Popen(
            [sys.executable, str(PEER), store_url, "40"], stdout=subprocess.PIPE, text=True
        )
        for n in range(1, 40):  # writing while the peer writes
            number = mine.create_episode(state(f"a-{n}"), "d", False).number
            mine.add_step(number, 0, "r0", record(0))
            if n % 10 == 0:
                mine.flush()
        out, _ = peer.communicate(timeout=60)
        assert peer.returncode == 0 and out.split() == ["4"], out
        mine.flush()
        assert mine.reads.count_by_status() == {"active": 80}
        theirs = mine.reads.load_episode("b-39")
        assert theirs is not None and len(theirs.trajectory) == 5
        assert mine.reads.find_step("b-7", "r4") is not None
    finally:
        mine.close()


# -- bad input ---------------------------------------------------------------------------------


def test_wrong_store_urls_are_named_with_what_to_fix(pg_server: PostgresServer) -> None:
    with pytest.raises(StoreUnavailableError, match="scheme 'mysql' is not supported") as bad:
        Database.open("mysql://root:hunter2@db/x")
    assert "hunter2" not in bad.value.message and "root:***@db" in bad.value.message
    with pytest.raises(StoreUnavailableError, match="is PostgreSQL running") as down:
        Database.open("postgresql://nobody:s3cret@127.0.0.1:1/x")
    assert "s3cret" not in down.value.message and "127.0.0.1:1" in down.value.message
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD 'right'")
    wrong = f"postgresql://{PASSWORD_ROLE}:wrong@127.0.0.1:{pg_server.port}/postgres"
    with pytest.raises(StoreUnavailableError, match="fix the user or password") as denied:
        Database.open(wrong)
    assert ":wrong@" not in denied.value.message and ":***@" in denied.value.message
    missing = f"postgresql://postgres@127.0.0.1:{pg_server.port}/no_such_db"
    with pytest.raises(StoreUnavailableError, match="create the database"):
        Database.open(missing)
    assert redact("postgresql://u:p@h:5/d") == "postgresql://u:***@h:5/d"


def test_serve_with_a_wrong_store_exits_with_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "palaestra"), "serve", "--data-dir", str(tmp_path / "d"),
         "--store", "postgresql://nobody:pw@127.0.0.1:1/x"],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "postgresql://nobody:***@127.0.0.1:1/x" in said and "is PostgreSQL running" in said
    assert "Traceback" not in said and ":pw@" not in said


def test_a_postgres_lost_mid_run(pg_server: PostgresServer) -> None:
    """A connection cut (a restart) is reconnected; a database gone stops the writer with
    `store_unavailable`, and the readiness probe says why."""
    url = pg_server.create_database()
    store = Store(Database.open(url))
    try:
        k = store.create_episode(state("k"), "d", False).number
        store.flush()
        with psycopg.connect(pg_server.url, autocommit=True) as admin:
            name = url.rsplit("/", 1)[1]
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            store.add_step(k, 0, "r0", record(0))
            store.flush()
            assert store.writer_alive and store.reads.find_step("k", "r0") is not None
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        late = store.create_episode(state("late"), "d", False).written
        stopped = threading.Event()
        threading.Thread(target=lambda: (store.flush(), stopped.set()), daemon=True).start()
        assert stopped.wait(30), "flush() hung on a database that is gone"
        with pytest.raises(UnavailableError) as told:
            late.result(timeout=5)
        assert told.value.code == "store_unavailable"
        assert not store.writer_alive and store.writer_error
        with pytest.raises(UnavailableError, match="store writer stopped"):
            store.add_step(k, 1, None, "{}")
        reason = store.db.ping()
        assert reason is not None and name in reason
    finally:
        store.close()


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_serve_on_postgres_end_to_end(pg_url: str, tmp_path: Path) -> None:
    """`palaestra serve --store postgresql://…`: episodes, tokens and packs land in the
    database, and a restart on it keeps the trajectory, the verdict and the tokens."""
    server = ServerProcess(tmp_path / "data", args=["--store", pg_url]).start()
    try:
        base, admin = server.url, server.headers
        reset = httpx.post(f"{base}/v1/episodes", json={"task": ECHO}, headers=admin)
        assert reset.status_code == 200, reset.text
        eid = reset.json()["episode_id"]
        submit = {"action": {"tool": "submit", "arguments": {"answer": "hcrib"}}}
        step = httpx.post(f"{base}/v1/episodes/{eid}/step", json=submit, headers=admin)
        assert step.status_code == 200 and step.json()["reward"] == 1.0, step.text
        verdict = httpx.post(f"{base}/v1/episodes/{eid}/verify", headers=admin).json()
        assert verdict["passed"], verdict
        made = httpx.post(
            f"{base}/v1/tokens", json={"scopes": ["train"], "name": "pg-user"}, headers=admin
        )
        assert made.status_code == 201, made.text
        user = {"authorization": f"Bearer {made.json()['token']}"}
        assert httpx.post(f"{base}/v1/episodes", json={"task": ECHO}, headers=user).is_success
        pub = httpx.post(
            f"{base}/v1/tokens",
            json={"scopes": ["publish"], "name": "pg-pub", "orgs": ["test"]},
            headers=admin,
        ).json()["token"]
        archive = pack_archive(write_pack(tmp_path / "p", "test/pg", "1.0.0"))
        published = httpx.post(
            f"{base}/v1/packs",
            content=archive,
            headers={"authorization": f"Bearer {pub}", "content-type": "application/gzip"},
            timeout=60,
        )
        assert published.status_code == 201, published.text
        assert not (server.data_dir / "palaestra.sqlite3").exists()  # all of it in PostgreSQL
    finally:
        server.stop()
    db = Database.open(pg_url)
    count = (
        "SELECT COUNT(*) FROM step_records s JOIN episodes e ON e.number = s.episode WHERE e.id = ?"
    )
    assert db.all(count, (eid,)) == [(1,)]
    db.close()
    again = ServerProcess(tmp_path / "data", args=["--store", pg_url]).start()
    try:
        kept = httpx.get(f"{again.url}/v1/episodes/{eid}", headers=again.headers).json()
        assert [s["observation"]["text"] for s in kept["trajectory"]] == [
            step.json()["observation"]["text"]
        ]
        assert kept["verdict"]["passed"] and kept["status"] == "done"
        listed = httpx.get(f"{again.url}/v1/packs", headers=user).json()
        assert "test/pg" in {p["name"] for p in listed}
        assert httpx.post(f"{again.url}/v1/episodes", json={"task": ECHO}, headers=user).is_success
    finally:
        again.stop()


def test_sqlite_urls_name_absolute_and_relative_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Database.open(f"sqlite://{tmp_path / 'a.sqlite3'}").close()  # sqlite:///tmp/…/a.sqlite3
    monkeypatch.chdir(tmp_path)
    Database.open("sqlite://rel/b.sqlite3").close()
    assert (tmp_path / "a.sqlite3").is_file() and (tmp_path / "rel" / "b.sqlite3").is_file()


def test_many_steps_go_in_multi_row_statements_in_order(store: Store) -> None:
    """Step records are inserted STEP_ROWS to a statement (the writer's GIL round trips);
    order, the remainder and a rewritten index within one statement all hold."""
    number = store.create_episode(state("many"), "sha256:d", False).number
    for i in range(300):
        store.add_step(number, i, f"r{i}", record(i, f"t{i}"))
    store.add_step(number, 5, "r5", record(5, "replaced"))  # the same index again
    store.add_step(number, 7, "r7", record(7, "x" * 20_000))  # a large one goes alone,
    store.add_step(number, 7, "r7", record(7, "small again"))  # and the last write wins
    store.flush()
    texts = [s.observation.text for s in store.reads.load_steps("many")]
    assert len(texts) == 300 and texts[:4] == ["t0", "t1", "t2", "t3"] and texts[-1] == "t299"
    assert texts[5] == "replaced" and texts[7] == "small again"
    assert store.reads.find_step("many", "r250") is not None
    assert store.write_errors == 0


def test_an_episodes_consecutive_steps_share_a_row(store: Store) -> None:
    """Steps of many episodes queued together (a trainer's batch steps) are written a row
    per run of an episode's consecutive steps, not a row per step (the database's cost is
    mostly per row); every read sees each step as it was written: its record, its request
    id for a replay, the first `count` of them."""
    numbers = [store.create_episode(state(f"ep-{e}"), "sha256:d", False).number for e in range(8)]
    for i in range(30):
        for e, number in enumerate(numbers):
            rid = None if (i + e) % 3 == 0 else f"e{e}-r{i}"
            store.add_step(number, i, rid, record(i, f"{e}:{i}"))
    store.add_step(numbers[0], 30, "big", record(30, "x" * 20_000))  # a large one alone
    store.flush()
    for e in range(8):
        texts = [s.observation.text for s in store.reads.load_steps(f"ep-{e}")]
        assert texts[:30] == [f"{e}:{i}" for i in range(30)]
        assert [s.index for s in store.reads.load_steps(f"ep-{e}", 7)] == list(range(7))
    assert store.reads.find_step("ep-2", "e2-r17") is not None
    found = store.reads.find_step("ep-2", "e2-r17")
    assert found is not None and found.observation.text == "2:17"
    assert store.reads.find_step("ep-2", "e2-r1") is None  # (1 + 2) % 3 == 0: no request id
    assert store.reads.find_step("ep-2", "e2-r") is None  # a part of an id is not the id
    assert store.reads.find_step("ep-3", "e2-r17") is None  # another episode's
    big = store.reads.find_step("ep-0", "big")
    assert big is not None and len(big.observation.text) == 20_000
    with store.db.connection() as db:
        rows = db.one("SELECT COUNT(*) FROM step_records")[0]
    assert rows < 8 * 30 // 4, f"{rows} rows for 241 steps"
