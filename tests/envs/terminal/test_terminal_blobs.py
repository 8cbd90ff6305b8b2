"""End to end: a Harbor task with binary files (a PNG and a SQLite database) is imported,
published, and played on bwrap (and docker, in the slow tier): the agent's workdir holds
the exact bytes, the verifier reads its own binary file (a tests/ blob the agent never
gets) and the database."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import httpx
import pytest
from conftest import docker_skip_reason, make_settings
from redteam.publishers import client, publish
from server.packs.test_blobs import PNG

from palaestra.envs.terminal.importer import import_tasks
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.archive import pack_archive

OK, WHY = bwrap_available()
DOCKER_WHY = docker_skip_reason("palaestra/terminal:latest")
BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")),
    pytest.param(
        "docker", marks=[pytest.mark.slow, pytest.mark.skipif(bool(DOCKER_WHY), reason=DOCKER_WHY)]
    ),
]

CHECK = """\
import pathlib, sqlite3, sys
here = pathlib.Path(__file__).parent
rows = sqlite3.connect("/app/data.db").execute("select count(*) from t").fetchone()[0]
same = pathlib.Path("/app/out.png").read_bytes() == (here / "expected.png").read_bytes()
sys.exit(0 if same and pathlib.Path("/app/count.txt").read_text().strip() == str(rows) else 1)
"""

COUNT = (
    "python3 -c \"import sqlite3; print(sqlite3.connect('data.db')"
    ".execute('select count(*) from t').fetchone()[0])\" > count.txt"
)


def binary_task(src: Path) -> tuple[bytes, bytes]:
    """A Harbor task folder whose environment and tests hold binary files: (png, db)."""
    folder = src / "bin-task"
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    (folder / "instruction.md").write_text(
        "Copy logo.png to out.png and write the row count of table t of data.db to count.txt.\n"
    )
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY logo.png data.db /app/\n"
    )
    with sqlite3.connect(folder / "environment" / "data.db") as db:
        db.execute("create table t (n integer)")
        db.executemany("insert into t values (?)", [(i,) for i in range(7)])
    (folder / "environment" / "logo.png").write_bytes(PNG)
    (folder / "tests" / "expected.png").write_bytes(PNG)
    (folder / "tests" / "check.py").write_text(CHECK)
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\npython3 /tests/check.py && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncp logo.png out.png\n{COUNT}\n")
    return PNG, (folder / "environment" / "data.db").read_bytes()


@pytest.fixture(params=BACKENDS)
def settings(tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    (tmp_path / "no-packs").mkdir()
    return make_settings(
        data_dir=tmp_path / "data",
        packs_dirs=[tmp_path / "no-packs"],
        pool_size=0,
        publish_check_tasks=0,
        sandbox=request.param,
    )


async def test_binary_files_reach_the_sandbox_and_the_verifier_byte_exact(
    manager: EpisodeManager, tmp_path: Path
) -> None:
    png, db = binary_task(tmp_path / "src")
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "pack", name="test/bin")
    assert list(report.imported) == ["bin-task"] and not report.skipped
    async with client(manager, ["publish", "train"], ("test",)) as http:
        reply = await publish(http, pack_archive(tmp_path / "pack"))
        assert reply.status_code == 201, reply.text

        async def call(path: str, body: object) -> dict[str, object]:
            reply: httpx.Response = await http.post(path, json=body)
            assert reply.status_code == 200, reply.text
            out: dict[str, object] = reply.json()
            return out

        started = await call("/v1/episodes", {"task": "test/bin:bin-task"})
        step = f"/v1/episodes/{started['episode_id']}/step"
        look = {"tool": "bash", "arguments": {"command": "sha256sum logo.png data.db; ls"}}
        seen = str((await call(step, {"action": look}))["observation"])
        for data in (png, db):
            assert hashlib.sha256(data).hexdigest() in seen, seen
        assert "expected.png" not in seen and "check.py" not in seen
        solve = {"tool": "bash", "arguments": {"command": f"cp logo.png out.png && {COUNT}"}}
        await call(step, {"action": solve})
        ended = await call(step, {"action": {"tool": "submit", "arguments": {}}})
        assert ended["terminated"] and ended["reward"] == 1.0, ended
        # The control: a byte off in the copy fails the verifier.
        started = await call("/v1/episodes", {"task": "test/bin:bin-task"})
        step = f"/v1/episodes/{started['episode_id']}/step"
        off = f"{{ cat logo.png; printf x; }} > out.png && {COUNT}"
        await call(step, {"action": {"tool": "bash", "arguments": {"command": off}}})
        ended = await call(step, {"action": {"tool": "submit", "arguments": {}}})
        assert ended["terminated"] and ended["reward"] == 0.0, ended


@pytest.mark.slow
@pytest.mark.skipif(
    bool(docker_skip_reason("palaestra/base:bookworm")),
    reason=docker_skip_reason("palaestra/base:bookworm"),
)
def test_a_build_contexts_blob_is_in_its_image_byte_exact(tmp_path: Path) -> None:
    import subprocess

    from palaestra.envs.terminal.envimage import build_env_image, docker_tag

    blob = tmp_path / "logo.png"
    blob.write_bytes(PNG)
    files = {"Dockerfile": "FROM palaestra/base:bookworm\nWORKDIR /app\nCOPY logo.png /app/\n"}
    refs = {"logo.png": f"sha256:{hashlib.sha256(PNG).hexdigest()}"}
    built = build_env_image(
        files, workdir="/app", aliases={}, timeout_s=120.0, max_bytes=1 << 20,
        blobs={"logo.png": blob}, blob_refs=refs,
    )  # fmt: skip
    assert built.status in ("built", "cached"), built.cause
    inside = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sha256sum", docker_tag(built.image),
         "/app/logo.png"],
        capture_output=True, text=True, check=False, timeout=60,
    ).stdout  # fmt: skip
    assert inside.split()[0] == hashlib.sha256(PNG).hexdigest(), inside
