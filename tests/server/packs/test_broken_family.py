"""A family whose package fails to import is named, with its error, wherever it matters:
`pack check` (once, not per task), `palaestra families`, /readyz and a reset of its packs.

The family is a real installed distribution: a .dist-info with an entry point in the
`palaestra.families` group, on the subprocesses' PYTHONPATH, whose module raises ImportError.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from palaestra.server.packs.archive import pack_archive
from tests.conftest import BIN, ServerProcess, cli_env

ERROR = "ImportError: needs libfrobnicate >= 2"
TASKS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site/ (the broken distribution) and packs/acme-broken/ (a pack of its tasks)."""
    root = tmp_path_factory.mktemp("broken-family")
    site = root / "site"
    info = site / "frobfam-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "frobfam.py").write_text('raise ImportError("needs libfrobnicate >= 2")\n')
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: frobfam\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[palaestra.families]\nfrob = frobfam:FrobFamily\n")
    pack = root / "packs" / "acme-broken"
    pack.mkdir(parents=True)
    (pack / "pack.toml").write_text('name = "acme/broken"\nversion = "1.0.0"\n\n[splits.train]\n')
    lines = [
        {
            "id": f"t{i}",
            "family": "frob",
            "domain": "acme/x",
            "split": "train",
            "public": {},
            "private": {},
        }
        for i in range(TASKS)
    ]
    (pack / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    return root


def env_of(world: Path, **extra: str) -> dict[str, str]:
    return cli_env(
        PYTHONPATH=str(world / "site"), PALAESTRA_PACKS_DIRS=str(world / "packs"), **extra
    )


def palaestra(world: Path, *args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "palaestra"), *args],
        cwd=cwd,
        env=env_of(world, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


def flat(text: str) -> str:
    """Table cells wrap; compare with the table drawing and line breaks gone."""
    return " ".join(text.replace("│", " ").split())


def test_pack_check_names_the_import_error_once(world: Path, tmp_path: Path) -> None:
    run = palaestra(world, "pack", "check", str(world / "packs" / "acme-broken"), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    out = flat(run.stdout)
    assert out.count("family frob failed to import") == 1, run.stdout
    assert ERROR in out and "frobfam:FrobFamily" in out and f"{TASKS} task(s)" in out
    assert "unknown family" not in out  # not the wrong hint, once per task


def test_families_lists_it_broken_and_writes_nothing(world: Path, tmp_path: Path) -> None:
    """Also: a listing creates no data dir, neither in the current directory nor at the
    default place (HOME is empty here), and `tasks` neither."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    run = palaestra(world, "families", cwd=cwd, HOME=str(home))
    assert run.returncode == 0, run.stdout + run.stderr
    out = flat(run.stdout)
    assert "broken family frob failed to import: " + ERROR in out, run.stdout
    assert "coding" in out  # the working families are still listed
    listed = palaestra(world, "tasks", "--limit", "1", cwd=cwd, HOME=str(home))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []


@pytest.fixture
def unready(world: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data", extra_env=env_of(world)).start(ready=503)
    try:
        yield proc
    finally:
        proc.stop()


def test_readyz_reset_and_publish_name_the_family(world: Path, unready: ServerProcess) -> None:
    ready = httpx.get(f"{unready.url}/readyz", timeout=10)
    assert ready.status_code == 503
    error = ready.json()["error"]
    assert error["code"] == "family_unavailable" and "frob" in error["message"]
    assert ERROR in error["message"]
    for body in ({"task": "acme/broken:t1"}, {"pack": "acme/broken"}):
        reply = httpx.post(f"{unready.url}/v1/episodes", json=body, headers=unready.headers)
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "family_unavailable" and ERROR in error["message"], error
        assert "acme/broken" in error["message"] and error["retryable"] is False
    families = httpx.get(f"{unready.url}/v1/families", headers=unready.headers).json()
    broken = [f for f in families if f["name"] == "frob"]
    assert broken and ERROR in broken[0]["error"] and broken[0]["tools"] == []
    archive = pack_archive(world / "packs" / "acme-broken")
    published = httpx.post(
        f"{unready.url}/v1/packs",
        content=archive,
        headers={**unready.headers, "content-type": "application/gzip"},
    )
    assert published.status_code == 503, published.text
    assert published.json()["error"]["code"] == "family_unavailable"
    # Packs of working families are still served.
    other = httpx.post(
        f"{unready.url}/v1/episodes", json={"task": "acme/none:t1"}, headers=unready.headers
    )
    assert other.status_code == 404
