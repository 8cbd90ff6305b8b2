"""Shared fixtures: settings on a temporary data dir, an embedded manager, a real server process
(tests/servers.py makes those)."""

from __future__ import annotations

import fcntl
import os
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg import PostgresServer, PostgresUnavailable

from palaestra.sdk.http import HTTPClient
from palaestra.server.config import Settings
from palaestra.server.inprocess import InProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests import speedups
from tests.servers import BIN, ServerProcess, free_port, server_fixture

speedups.install()  # built-in packs loaded once a worker, one default TLS context

__all__ = ["BIN", "ServerProcess", "free_port"]  # where the tests import them from


def docker_skip_reason(image: str) -> str:
    """Why the docker tests that need `image` must skip ("" when they can run): no engine
    (with docker-up's reason, when it wrote one), or the image not built."""
    from palaestra.sandbox.docker import docker_available

    ok, why = docker_available()
    if not ok:
        cache = Path(os.environ.get("PALAESTRA_CACHE", Path.home() / ".cache" / "palaestra"))
        note = cache / "docker-unavailable"
        hint = f"; docker-up: {note.read_text().strip()}" if note.is_file() else ""
        return f"docker engine unavailable: {why}{hint}"
    import docker

    client = docker.from_env()
    try:
        client.images.get(image)
    except Exception:
        name = image.split("/")[-1].split(":")[0]
        return f"image {image} not built (run `palaestra images build {name}`)"
    finally:
        client.close()
    return ""


# One held-out secret for every server of the session (and across sessions): a server with
# a secret of its own would generate its held-out tasks anew (~30 s for reasoning).
HELDOUT_SECRET = Path(
    os.environ.get("PALAESTRA_HELDOUT_SECRET_FILE")
    or Path(os.environ.get("PALAESTRA_CACHE", Path.home() / ".cache" / "palaestra"))
    / "test-heldout.secret"
)


def make_settings(**values: Any) -> Settings:
    """Settings of an embedded server of this session: the session's held-out secret unless
    `values` name another (or None: the data dir's own)."""
    return Settings(**{"heldout_secret_file": HELDOUT_SECRET, **values})


# The terminal matrices take ~40 min on our 2-core machines when they play every task: the
# test command plays one task of each category (the verifier path differs by category, not
# by task), and PALAESTRA_FULL_CHECKS=1 plays them all.
FULL_CHECKS = os.environ.get("PALAESTRA_FULL_CHECKS") == "1"


def category(task_id: str) -> str:
    """A built-in task's category: its id's prefix (`c`, `git`, `perf`, `py`, `rr`, …)."""
    return task_id.split("-", 1)[0]


def one_per_category(task_ids: Iterable[str]) -> list[str]:
    """The first task id of each category (`c-`, `git-`, `perf-`, `py-`, `rr-`, …)."""
    first: dict[str, str] = {}
    for task_id in sorted(task_ids):
        first.setdefault(category(task_id), task_id)
    return sorted(first.values())


def docker_cheat_sample(task_ids: Iterable[str]) -> list[str]:
    """The tasks whose every cheat test_terminal_cheats plays on docker by default: one of
    every third category. bwrap's sampled pack check (test_terminal_core) plays the other
    categories, so by default each category meets every cheat on one backend (the verifier
    is the same on both; PALAESTRA_FULL_CHECKS=1 plays every task on both)."""
    return one_per_category(task_ids)[::3]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `palaestra` subprocess: none of this shell's PALAESTRA_* or E2B_*
    settings, but the session's held-out secret (a fresh secret would regenerate the held-out
    tasks at every start, ~25 s), and wide rich tables so ids stay on one line."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PALAESTRA_", "E2B_"))}
    return {
        **clean,
        "PALAESTRA_HELDOUT_SECRET_FILE": str(HELDOUT_SECRET),
        "COLUMNS": "200",
        **extra,
    }


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(data_dir=tmp_path / "data")


@pytest.fixture
async def manager(settings: Settings) -> AsyncIterator[EpisodeManager]:
    built = build_manager(settings)
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


@pytest.fixture
def inproc(settings: Settings) -> Iterator[InProcessClient]:
    with InProcessClient(settings) as client:
        yield client


# One `palaestra serve` with the echo and humaneval packs, for the session: the tests of the
# doors and trainer adapters and any test that neither stops its server nor counts what it
# served (each makes its own tokens or episodes, so they stay apart). A module needing a
# server of its own defines `server = server_fixture(...)` with its packs and settings.
door_server = server_fixture("session", packs=["echo", "humaneval"])


@pytest.fixture(scope="session")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server


@pytest.fixture(autouse=True)
def _door_server_alive(request: pytest.FixtureRequest) -> None:
    """Start the session's door server again (with a warning) where an earlier test of
    this worker killed it: one killer fails itself, not every later test of the worker."""
    if "door_server" not in request.fixturenames:
        return
    door: ServerProcess = request.getfixturevalue("door_server")
    proc = door.proc
    if proc is None or proc.poll() is not None:
        code = None if proc is None else proc.returncode
        warnings.warn(
            f"the session's door server had ended (exit {code}); started again", stacklevel=2
        )
        door.start()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[HTTPClient]:
    with server.client() as client:
        yield client


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (tests/pg.py); skips, saying why, where
    PostgreSQL is not installed."""
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as exc:
        server.stop()
        pytest.skip(f"no PostgreSQL for the tests: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's PostgreSQL server; its URL."""
    url = pg_server.create_database()
    try:
        yield url
    finally:
        pg_server.drop_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store setting of a test run on each engine: a SQLite file, a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'store.sqlite3'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the reasoning/gym pack's task cache once, before any test starts a server.

    A cold cache takes ~20 s of generation (then every server start reads it in well under
    a second); a server subprocess started cold could miss its readiness deadline.
    """
    from palaestra.server.heldout import ensure_secret

    # Servers started as processes read the session's secret from the environment.
    os.environ["PALAESTRA_HELDOUT_SECRET_FILE"] = str(HELDOUT_SECRET)
    HELDOUT_SECRET.parent.mkdir(parents=True, exist_ok=True)
    # Test workers (pytest-xdist) start side by side: one makes the secret and the cache.
    with open(HELDOUT_SECRET.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _warm_reasoning_gym(ensure_secret(HELDOUT_SECRET))


def _warm_reasoning_gym(secret: bytes) -> None:
    import importlib.util

    source = Path(__file__).resolve().parent.parent / "packs" / "reasoning-gym" / "source.py"
    spec = importlib.util.spec_from_file_location("_warm_reasoning_gym", source)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for _ in module.load_tasks():  # public held-out seeds (load_pack without a secret)
        pass
    for _ in module.load_tasks(secret=secret):
        pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the modules holding `slow` tests first, the most slow tests first; the others
    keep their order. `--dist loadfile` hands modules out in this order, so the suite ends
    on short modules instead of one worker idling while the other plays a long one (longest
    work first). Every worker sorts the same collection the same way. A test with a
    `docker` parameter is marked slow here (the fast tier never waits on a container)."""
    for item in items:
        # a `docker` parameter is the slow tier's, whichever module forgot to mark it
        callspec = getattr(item, "callspec", None)  # set on parametrized tests only
        if callspec is not None and "docker" in callspec.params.values():
            item.add_marker(pytest.mark.slow)
    slow: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.nodeid.split("::", 1)[0]])  # stable
