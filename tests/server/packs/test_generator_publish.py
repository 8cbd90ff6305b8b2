"""A generator pack published with a publish token (server/packs/generate.py): generated in
sandboxes at publish, its tasks stored beside the pack and served from there, after a
restart too, without the server ever importing the generator; sealed splits drawn from the
server's secret; `pack materialize` writes the same public tasks as a static pack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from palaestra.cli.materialize import materialize
from palaestra.server.auth import create_token
from palaestra.server.db import Database
from palaestra.server.packs.archive import pack_archive
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.genstore import GeneratedStore
from palaestra.server.packs.loader import load_pack
from palaestra.server.packs.manifest import PackError
from palaestra.server.packs.registry import PackRegistry
from server.packs.test_registry import cli

pytestmark = pytest.mark.slow

GENERATOR = '''"""Echo tasks from seeds; marks where it is imported (GENTEST_MARKER)."""
import os

from palaestra.sdk.task import Task  # palaestra's packages are importable in the sandbox

MARKER = os.environ.get("GENTEST_MARKER")
if MARKER:
    with open(MARKER, "a") as out:
        out.write("imported\\n")
SANDBOXED = os.getcwd() == "/work" and os.environ.get("HOME") == "/work"


def generate(seed, index, level):
    word = f"w{seed}-{Task.__name__}"
    if seed >= 1000 and SANDBOXED:  # the sealed split: try to leave words for the public one
        for path in ("/tmp/leak", "leak"):
            with open(path, "w") as out:
                out.write(word)
    leaked = [open(p).read() for p in ("/tmp/leak", "leak") if os.path.exists(p)]
    return {
        "public": {"instruction": f"Submit '{word}' backwards." + f" LEAK {leaked}" * bool(leaked)},
        "private": {"answer": word[::-1]},
    }
'''


def generator_pack(root: Path, name: str) -> Path:
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        f'name = "{name}"\nversion = "1.0.0"\nfamilies = ["echo"]\n\n'
        "[splits.heldout]\nsealed = true\n\n[splits.train]\nsealed = false\n\n"
        '[generators.words]\nmodule = "gen.py"\nfamily = "echo"\ndomain = "words/echo"\n'
        "[generators.words.splits.heldout]\nseeds = [1000, 2000]\ncount = 2\n"
        "[generators.words.splits.train]\nseeds = [0, 1000]\ncount = 3\n"
    )
    (root / "gen.py").write_text(GENERATOR)
    return root


def served(server: ServerProcess, pack: str) -> dict[str, dict[str, Any]]:
    reply = httpx.get(f"{server.url}/v1/tasks", params={"pack": pack}, headers=server.headers)
    assert reply.status_code == 200, reply.text
    return {t["id"].split(":", 1)[1]: t for t in reply.json()["tasks"]}


def publish(server: ServerProcess, root: Path, token: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/gzip"}
    return httpx.post(
        f"{server.url}/v1/packs", content=pack_archive(root), headers=headers, timeout=120
    )


def test_publish_token_generator_pack(tmp_path: Path) -> None:
    marker = tmp_path / "imported.marker"
    (tmp_path / "no-packs").mkdir()
    env = {"GENTEST_MARKER": str(marker), "PALAESTRA_PACKS_DIRS": str(tmp_path / "no-packs")}
    server = ServerProcess(tmp_path / "data", extra_env=env).start()
    try:
        publisher, _ = create_token(
            Database.open(server.data_dir / "palaestra.sqlite3"),
            ["publish"],
            name="gen-author",
            orgs=["test"],
        )
        src = generator_pack(tmp_path / "gen", "test/gen")
        reply = publish(server, src, publisher)
        assert reply.status_code == 201, reply.text
        tasks = served(server, "test/gen")
        assert len(tasks) == 5 and not marker.exists()  # never imported by the server
        assert not any(
            "LEAK" in t["public"]["instruction"] for t in tasks.values() if t["split"] == "train"
        )  # a split's sandbox is its own: the sealed split's run left nothing for this one

        # Locally materialized: the same public tasks; the sealed ones differ (server secret).
        static = materialize(src, tmp_path / "static")
        local = {i: t.public for i, t in static.tasks.items()}
        assert {i: t["public"] for i, t in tasks.items() if t["split"] == "train"} == {
            i: p for i, p in local.items() if static.tasks[i].split == "train"
        }
        heldout = {i for i, t in tasks.items() if t["split"] == "heldout"}
        assert heldout == {"words-heldout-0", "words-heldout-1"}
        assert all(tasks[i]["public"] != local[i] for i in heldout)
        reset = httpx.post(
            f"{server.url}/v1/episodes",
            headers=server.headers,
            json={"task": f"test/gen:{sorted(heldout)[0]}"},
        )
        assert reset.status_code == 200, reset.text

        # A restart serves the same stored tasks, still without importing the generator.
        server.stop()
        server.start()
        assert served(server, "test/gen") == tasks and not marker.exists()

        # A materialized pack is a static pack a publish token publishes as any other.
        other = materialize(generator_pack(tmp_path / "gen2", "test/gen-static"), tmp_path / "s2")
        assert publish(server, other.root, publisher).status_code == 201
        assert len(served(server, "test/gen-static")) == 5

        # The control: an admin's generator pack loads in-process, and the marker shows it
        # (a generator is imported only for a split the task cache lacks: this run's own
        # bytes make the split new to the shared cache).
        gen3 = generator_pack(tmp_path / "gen3", "test/gen-admin")
        with open(gen3 / "gen.py", "a") as out:
            out.write(f"# {tmp_path}\n")
        admin = publish(server, gen3, server.token)
        assert admin.status_code == 201, admin.text
        assert marker.exists()
    finally:
        server.stop()

    # A stored file gone: that pack is a clear load error; the others load.
    registry = PackRegistry(server.data_dir, Database.open(server.data_dir / "palaestra.sqlite3"))
    folder = registry.generated.folder(registry.find("test/gen", "1.0.0").digest)
    index = json.loads((folder / "index.json").read_text())
    (folder / (index["splits"]["words/train"].removeprefix("sha256:") + ".json")).unlink()
    catalog = PackCatalog(b"s" * 32)
    assert registry.load_into(catalog, ["echo"]) == 2
    assert "stored generated tasks unreadable" in catalog.errors["test/gen@1.0.0"]


def test_materialize_round_trip_and_force(tmp_path: Path) -> None:
    src = generator_pack(tmp_path / "gen", "test/mat")
    out = tmp_path / "out"
    made = cli("pack", "materialize", str(src), str(out), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "sealed split(s) heldout" in made.stderr
    generated, static = load_pack(src), load_pack(out)
    assert static.name == "test/mat" and static.version == "1.0.0"
    assert static.families == ["echo"] and static.sealed == generated.sealed
    assert static.tasks.keys() == generated.tasks.keys()
    assert {
        i: (t.public, t.private, t.digest) for i, t in static.tasks.items() if not t.sealed
    } == {
        i: (t.public, t.private, t.digest) for i, t in generated.tasks.items() if not t.sealed
    }  # (this generator's sealed split differs in a sandbox: it writes files there)
    assert not (out / "gen.py").exists()
    with pytest.raises(PackError, match="--force"):
        materialize(src, out)
    (out / "stale").write_text("x")
    assert materialize(src, out, force=True).digest == static.digest
    assert not (out / "stale").exists() and load_pack(out).digest == static.digest


def test_stored_generated_tasks_are_checked(tmp_path: Path) -> None:
    store = GeneratedStore(tmp_path / "packs")
    tasks = {"g": {"train": [{"public": {"q": 1}, "private": {"a": 2}}], "heldout": []}}
    index = store.place("sha256:ab", tasks)
    assert store.load("sha256:ab", index) == tasks
    folder = store.folder("sha256:ab")
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    stored = [p for p in folder.iterdir() if p.name != "index.json"]
    assert {oct(p.stat().st_mode & 0o777) for p in stored} == {"0o600"}
    big = max(stored, key=lambda p: p.stat().st_size)
    big.write_text(big.read_text().replace('"a":2', '"a":3'))
    with pytest.raises(PackError, match="stored generated tasks changed"):
        store.load("sha256:ab", index)
    with pytest.raises(PackError, match="changed"):
        store.load("sha256:ab", "sha256:" + "0" * 64)  # an index that is not the row's
