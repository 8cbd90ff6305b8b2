"""Two servers on one store (PostgreSQL, as fronts of a deployment share it): a held-out
rotation made through one is served by the other within `heldout_sync_s`, which then
refuses the retired draw too (server/draws.py `DrawKeeper.sync`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import cli_env

from tests.pg import PostgresServer
from tests.servers import ServerProcess, packs_dir, settings_env, wait_until

FIXTURE = Path(__file__).parents[1] / "fixtures" / "heldout-codes"
PACK = "tests/heldout-codes"


@pytest.fixture
def two(tmp_path: Path, pg_server: PostgresServer) -> Iterator[list[ServerProcess]]:
    store = pg_server.create_database()
    packs = packs_dir(tmp_path, {"heldout-codes": FIXTURE})
    env = cli_env(**settings_env({"packs_dirs": [packs], "heldout_sync_s": 0.5}))
    servers = [ServerProcess(tmp_path / "data", env, ["--store", store]) for _ in range(2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()
        pg_server.drop_database(store)


def heldout(server: ServerProcess) -> set[str]:
    reply = httpx.get(
        f"{server.url}/v1/tasks",
        params={"pack": PACK, "split": "heldout", "limit": 100},
        headers=server.headers,
    )
    assert reply.status_code == 200, reply.text
    return {t["id"] for t in reply.json()["tasks"]}


def test_a_rotation_reaches_the_other_server(two: list[ServerProcess]) -> None:
    one, other = two
    before = heldout(other)
    assert heldout(one) == before
    rotated = httpx.post(f"{one.url}/v1/packs/{PACK}/heldout/rotate", headers=one.headers)
    assert rotated.status_code == 200, rotated.text
    after = heldout(one)
    assert not after & before
    wait_until(lambda: heldout(other) == after, base_s=30, what="the other server's draw")
    old = httpx.post(
        f"{other.url}/v1/episodes", json={"task": sorted(before)[0]}, headers=other.headers
    )
    assert old.status_code == 404 and old.json()["error"]["code"] == "draw_retired"
    new = httpx.post(
        f"{other.url}/v1/episodes", json={"task": sorted(after)[0]}, headers=other.headers
    )
    assert new.status_code == 200 and new.json()["info"]["heldout_draw"] == 1
