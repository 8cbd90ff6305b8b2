"""A held-out rotation of a publish token's generator pack (server/draws.py): the new draw
is generated in sandboxes like the first, stored beside the pack (the row names the new
index), served after a restart, and the server never imports the generator; in a cluster
the rotated folder reaches the other nodes through the store."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess

from palaestra.server.auth import create_token
from palaestra.server.cluster import depot
from palaestra.server.db import Database
from palaestra.server.packs.registry import PackRegistry, Published
from palaestra.server.store import Store
from server.packs.test_generator_publish import generator_pack, publish, served

pytestmark = pytest.mark.slow


def test_rotating_a_sandbox_generated_pack(tmp_path: Path) -> None:
    marker = tmp_path / "imported.marker"
    (tmp_path / "no-packs").mkdir()
    env = {"GENTEST_MARKER": str(marker), "PALAESTRA_PACKS_DIRS": str(tmp_path / "no-packs")}
    server = ServerProcess(tmp_path / "data", extra_env=env).start()
    try:
        db = Database.open(server.data_dir / "palaestra.sqlite3")
        publisher, _ = create_token(db, ["publish"], name="gen-author", orgs=["test"])
        src = generator_pack(tmp_path / "gen", "test/gen")
        assert publish(server, src, publisher).status_code == 201
        before = served(server, "test/gen")
        assert {i for i, t in before.items() if t["split"] == "heldout"} == {
            "words-heldout-0",
            "words-heldout-1",
        }
        denied = httpx.post(
            f"{server.url}/v1/packs/test/gen/heldout/rotate",
            headers={"authorization": f"Bearer {publisher}"},
        )
        assert denied.status_code == 403  # its publisher is no admin
        rotated = httpx.post(
            f"{server.url}/v1/packs/test/gen/heldout/rotate", headers=server.headers, timeout=120
        )
        assert rotated.status_code == 200, rotated.text
        assert rotated.json()["splits"] == [
            {
                "split": "heldout",
                "draw": 1,
                "previous": 0,
                "drawn_at": rotated.json()["splits"][0]["drawn_at"],
                "drawn_by": "local-admin",
                "tasks": 2,
            }
        ]
        after = served(server, "test/gen")
        held = {i: t["public"] for i, t in after.items() if t["split"] == "heldout"}
        assert set(held) == {"words-heldout-d1-0", "words-heldout-d1-1"}
        old = {t["public"]["instruction"] for t in before.values() if t["split"] == "heldout"}
        assert not old & {p["instruction"] for p in held.values()}
        assert {i: t for i, t in after.items() if t["split"] == "train"} == {
            i: t for i, t in before.items() if t["split"] == "train"
        }
        assert not marker.exists()  # generated in sandboxes, never imported
        registry = PackRegistry(server.data_dir, db)
        row = registry.find("test/gen", "1.0.0")
        assert row is not None
        stored = registry.generated.load(row.digest, row.generated)
        assert set(stored["words"]) == {"train", "heldout", "heldout#draw-1"}

        server.stop()
        server.start()
        assert served(server, "test/gen") == after and not marker.exists()
        gone = httpx.post(
            f"{server.url}/v1/episodes",
            json={"task": "test/gen:words-heldout-0"},
            headers=server.headers,
        )
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "draw_retired"
    finally:
        server.stop()


def test_a_rotated_generated_folder_reaches_another_node(tmp_path: Path) -> None:
    """Cluster nodes share one store: the node that rotated a publish token's pack puts its
    generated folder there (keyed by the new index digest); another node's sync fetches it."""
    store = Store(Database.open(f"sqlite://{tmp_path / 'store.sqlite3'}"))
    try:
        here, there = PackRegistry(tmp_path / "a", store.db), PackRegistry(tmp_path / "b", store.db)
        first = {"g": {"heldout": [{"public": {"q": 1}, "private": {"a": 1}}]}}
        before = here.generated.place("sha256:ab", first)
        assert there.generated.place("sha256:ab", first) == before
        here.store.path_of("sha256:ab").mkdir(parents=True)  # the pack's own folder
        (here.store.path_of("sha256:ab") / "pack.toml").write_text("")
        published = Published("o/p", "1.0.0", "sha256:ab", 0.0, "x", before)
        assert depot.export(here, store, published)  # at publish: the first draw's folder
        later = {"g": {**first["g"], "heldout#draw-1": [{"public": {"q": 2}, "private": {"a": 2}}]}}
        after = here.generated.place("sha256:ab", later)
        row = Published("o/p", "1.0.0", "sha256:ab", 0.0, "x", after)
        depot.fetch_generated(there, store, row)  # not exported yet: left as it is
        assert there.generated.load("sha256:ab", before) == first
        depot.export_generated(here, store, row)
        depot.fetch_generated(there, store, row)
        assert there.generated.load("sha256:ab", after) == later
        depot.fetch_generated(there, store, row)  # already there: nothing to do
        assert there.generated.load("sha256:ab", after) == later
        fresh = PackRegistry(tmp_path / "c", store.db)  # a node that starts after it
        depot.fetch(fresh, store, row)
        assert fresh.generated.load("sha256:ab", after) == later
    finally:
        store.close()
