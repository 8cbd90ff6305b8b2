"""The server's pack registry: check → build → publish → install over HTTP, immutability,
atomic installs, safe archives, and sealed packs that cannot be downloaded."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import tarfile
from pathlib import Path

import httpx
import pytest
from conftest import BIN, ServerProcess

from palaestra.server.config import Settings
from palaestra.server.db import Database
from palaestra.server.packs.archive import ArchiveError, extract_archive, pack_archive
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.runtime import build_manager
from tests.servers import server_fixture

CLI = str(BIN / "palaestra")


def write_pack(
    root: Path, name: str, version: str, sealed: bool = False, word: str = "oak"
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pack.toml").write_text(
        f'name = "{name}"\nversion = "{version}"\ndescription = "a tiny test pack"\n'
        'license = "MIT"\nfamilies = ["echo"]\n\n[splits.train]\nsealed = false\n'
        + ("\n[splits.heldout]\nsealed = true\n" if sealed else "")
    )
    tasks = [
        {
            "id": f"say-{word}",
            "family": "echo",
            "split": "train",
            "public": {"instruction": f"Submit '{word}' backwards."},
            "private": {"answer": word[::-1]},
        }
    ]
    if sealed:
        tasks.append(
            {
                "id": "secret",
                "family": "echo",
                "split": "heldout",
                "public": {"instruction": "Submit the secret."},
                "private": {"answer": "zanzibar-private-answer"},
            }
        )
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return root


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    drop = ("PALAESTRA_URL", "PALAESTRA_TOKEN", "PALAESTRA_DATA_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


server = server_fixture("module")


def token(server: ServerProcess, tmp_path: Path, *scopes: str, name: str) -> str:
    args = [a for s in scopes for a in ("--scope", s)]
    if "publish" in scopes:
        args += ["--org", "test"]  # the org these tests publish into (granted by the admin)
    made = cli(
        "token", "create", *args, "--name", name, "--data-dir", str(server.data_dir), cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@pytest.mark.slow
def test_check_build_publish_install_round_trip(server: ServerProcess, tmp_path: Path) -> None:
    src = write_pack(tmp_path / "tiny", "test/tiny", "1.0.0")
    publisher = token(server, tmp_path, "publish", name="ci-publisher")
    if (BIN / "palaestra").exists():
        check = cli("pack", "check", str(src), cwd=tmp_path)
        assert check.returncode == 0, check.stdout + check.stderr
        built = cli("pack", "build", str(src), "--out", str(tmp_path / "tiny.tar.gz"), cwd=tmp_path)
        assert built.returncode == 0, built.stdout + built.stderr
    archive = tmp_path / "tiny.tar.gz"
    assert archive.read_bytes() == pack_archive(src)  # deterministic

    published = cli(
        "pack", "publish", str(archive), "--url", server.url, "--token", publisher, cwd=tmp_path
    )
    assert published.returncode == 0, published.stdout + published.stderr
    digest = published.stdout.strip().splitlines()[-1]
    assert digest.startswith("sha256:")
    # The same bytes again (from the directory this time): idempotent.
    again = cli(
        "pack", "publish", str(src), "--url", server.url, "--token", publisher, cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == digest and "already" in again.stdout

    # It is live: listed, with its versions, and episodes run on it.
    info = httpx.get(f"{server.url}/v1/packs/test/tiny", headers=server.headers).json()
    assert info["digest"] == digest and info["versions"] == ["1.0.0"]
    reset = httpx.post(
        f"{server.url}/v1/episodes", json={"task": "test/tiny:say-oak"}, headers=server.headers
    )
    assert reset.status_code == 200, reset.text
    assert (server.data_dir / "packs" / "sha256" / digest.removeprefix("sha256:")).is_dir()

    # Other bytes under the same version: refused, and nothing changes.
    (src / "tasks.jsonl").write_text((src / "tasks.jsonl").read_text().replace("oak", "elm"))
    (src / "pack.lock").unlink(missing_ok=True)
    clash = httpx.post(
        f"{server.url}/v1/packs",
        content=pack_archive(src),
        headers={"authorization": f"Bearer {publisher}", "content-type": "application/gzip"},
    )
    assert clash.status_code == 409, clash.text
    assert "bump the version" in clash.json()["error"]["message"]
    info = httpx.get(f"{server.url}/v1/packs/test/tiny", headers=server.headers).json()
    assert info["digest"] == digest

    # Install into another data dir, by name over HTTP, and from the file.
    local = tmp_path / "local-data"
    installed = cli(
        "pack", "install", "test/tiny@1.0.0", "--url", server.url, "--token", publisher,
        "--data-dir", str(local), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    result = json.loads(installed.stdout.strip().splitlines()[-1])
    assert result["digest"] == digest and result["created"] is True
    from_file = cli(
        "pack", "install", str(archive), "--data-dir", str(local), "--json", cwd=tmp_path
    )
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout.strip().splitlines()[-1])["created"] is False
    manager = build_manager(Settings(data_dir=local, packs_dirs=[]))
    try:
        assert manager.packs.get("test/tiny", "1.0.0").digest == digest
    finally:
        manager.store.close()

    # A published pack is served again after a restart.
    server.stop()
    server.start()
    info = httpx.get(f"{server.url}/v1/packs/test/tiny@1.0.0", headers=server.headers).json()
    assert info["digest"] == digest


def test_publish_refusals_and_sealed_downloads(server: ServerProcess, tmp_path: Path) -> None:
    publisher = token(server, tmp_path, "publish", name="pub2")
    as_publisher = {"authorization": f"Bearer {publisher}", "content-type": "application/gzip"}
    objects = server.data_dir / "packs" / "sha256"
    before = sorted(objects.iterdir()) if objects.exists() else []

    def post(data: bytes) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/packs", content=data, headers=as_publisher)

    # Not an archive; a symlink; '..'; an invalid pack: 400, nothing installed.
    assert post(b"not a tarball").status_code == 400
    for name, kind in (("pack.toml", tarfile.SYMTYPE), ("../evil", tarfile.REGTYPE)):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(b""))
        response = post(raw.getvalue())
        assert response.status_code == 400, response.text
    broken = write_pack(tmp_path / "broken", "test/broken", "1.0.0")
    (broken / "tasks.jsonl").write_text('{"id": "x"}\n')
    response = post(pack_archive(broken))
    assert response.status_code == 400 and "not a valid pack" in response.json()["error"]["message"]
    # A stale pack.lock is refused.
    stale = write_pack(tmp_path / "stale", "test/stale", "1.0.0")
    (stale / "pack.lock").write_text(
        json.dumps({"lock_version": 1, "digest": "sha256:00", "files": {}})
    )
    assert post(pack_archive(stale)).status_code == 400
    # A pack that would run Python in the server: admin only.
    code = write_pack(tmp_path / "code", "test/code", "1.0.0")
    (code / "pack.toml").write_text(
        (code / "pack.toml").read_text() + '\n[source]\npython = "s.py"\n'
    )
    (code / "s.py").write_text("def load_tasks():\n    return []\n")
    assert post(pack_archive(code)).status_code == 403
    after = sorted(objects.iterdir()) if objects.exists() else []
    assert after == before
    assert not list((server.data_dir / "packs" / "tmp").iterdir())

    # A pack with a sealed split: published, runs, but only an admin may download it.
    sealed = write_pack(tmp_path / "sealed", "test/sealed", "1.0.0", sealed=True)
    response = post(pack_archive(sealed))
    assert response.status_code == 201, response.text
    url = f"{server.url}/v1/packs/test/sealed@1.0.0/archive"
    refused = httpx.get(url, headers={"authorization": f"Bearer {publisher}"})
    assert refused.status_code == 403 and "zanzibar" not in refused.text
    admin = httpx.get(url, headers=server.headers)
    assert admin.status_code == 200 and admin.headers["x-palaestra-digest"].startswith("sha256:")
    # A public pack downloads for any valid token, byte for byte what was published.
    public = httpx.get(
        f"{server.url}/v1/packs/test/tiny@1.0.0/archive",
        headers={"authorization": f"Bearer {publisher}"},
    )
    assert public.status_code in (200, 404)  # 404 when run without the round-trip test


def test_extract_archive_refuses_unsafe_entries(tmp_path: Path) -> None:
    for name, kind in (
        ("/abs", tarfile.REGTYPE),
        ("a/../../b", tarfile.REGTYPE),
        ("link", tarfile.LNKTYPE),
        ("dev", tarfile.CHRTYPE),
        ("sym", tarfile.SYMTYPE),
    ):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "pack.toml" if kind in (tarfile.LNKTYPE, tarfile.SYMTYPE) else ""
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(ArchiveError):
            extract_archive(raw.getvalue(), tmp_path / name.strip("/").replace("/", "_"))


def test_pack_registry_install_is_idempotent_and_immutable(tmp_path: Path) -> None:
    registry = PackRegistry(tmp_path / "data", Database.open(tmp_path / "data" / "db.sqlite3"))
    src = write_pack(tmp_path / "p", "test/p", "1.0.0")
    pack, created = registry.install(pack_archive(src), publisher="t", families=["echo"])
    assert created and registry.find("test/p", "1.0.0") is not None
    _, created = registry.install(pack_archive(src), publisher="t", families=["echo"])
    assert not created
    (src / "tasks.jsonl").write_text((src / "tasks.jsonl").read_text().replace("oak", "ash"))
    with pytest.raises(Exception, match="bump the version"):
        registry.install(pack_archive(src), publisher="t", families=["echo"])
    assert [p.digest for p in registry.published()] == [pack.digest]


def test_yank_from_the_cli_on_an_index_made_before_yanking(tmp_path: Path) -> None:
    """An index without the yank columns gains them; `pack yank` (local store) and
    `--undo` set and clear the mark."""
    data = tmp_path / "data"
    data.mkdir()
    db = data / "palaestra.sqlite3"
    with sqlite3.connect(db) as old:  # the table as it was before yanking
        old.execute(
            "CREATE TABLE published_packs (name TEXT NOT NULL, version TEXT NOT NULL, digest"
            " TEXT NOT NULL, published_at REAL NOT NULL, publisher TEXT NOT NULL, bytes"
            " INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (name, version))"
        )
    registry = PackRegistry(data, Database.open(db))
    src = write_pack(tmp_path / "p", "test/p", "1.0.0")
    registry.install(pack_archive(src), publisher="t", families=["echo"])
    run = cli("pack", "yank", "test/p@1.0.0", "--data-dir", str(data), cwd=tmp_path)
    assert run.returncode == 0 and "test/p@1.0.0 yanked" in run.stdout, run.stdout + run.stderr
    assert registry.yanked() == {("test/p", "1.0.0")}
    assert not registry.yank("test/p", "1.0.0", "t")  # already yanked: no change
    assert registry.yank("test/p", "1.0.0", "t", undo=True) and registry.yanked() == set()
