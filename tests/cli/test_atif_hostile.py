"""`palaestra import atif` on hostile input (red team): a file nested past the JSON parser's
depth, an integer of more digits than Python converts, a FIFO or a link to /dev/zero in a
run directory, a device given as the file. Each is refused with exit 2 and a message naming
the file: never a traceback, never a hang, nothing written. Ids that look like paths
(`../../etc/x`, a NUL) name no file: an import's files are named by -o and its sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env

from palaestra.sdk.atif import attempt_to_atif, episode_to_atif
from palaestra.sdk.atif_models import ATIF_V17
from palaestra.sdk.models import EpisodeState
from tests.sdk.test_atif import attempt, episode, through_text

CLI = str(Path(sys.executable).parent / "palaestra")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=60
    )


def good() -> dict[str, Any]:
    document: dict[str, Any] = through_text(episode_to_atif(episode(), ATIF_V17))
    return document


def refused(result: subprocess.CompletedProcess[str], names: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and names in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested too deep"),
        (
            json.dumps(good()).replace('"step_id": 2', '"step_id": 1' + "0" * 5000, 1).encode(),
            "digits",
        ),
        (b'{"schema_version": "\xff"}', "not JSON"),
    ],
    ids=["deep", "huge-int", "not-utf8"],
)
def test_a_hostile_file_is_refused_without_a_traceback(
    tmp_path: Path, text: bytes, says: str
) -> None:
    bad = tmp_path / "bad.atif.json"
    bad.write_bytes(text)
    out = tmp_path / "out.json"
    result = cli("import", "atif", str(bad), "-o", str(out), cwd=tmp_path)
    refused(result, "bad.atif.json")
    assert says in result.stderr and not out.exists()


def test_a_device_is_refused_not_read(tmp_path: Path) -> None:
    refused(cli("import", "atif", "/dev/zero", cwd=tmp_path), "not a regular file")


@pytest.mark.parametrize("kind", ["fifo", "link-to-device", "link-to-file"])
def test_a_run_directory_reads_only_its_own_regular_files(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "00000-ok.atif.json").write_text(json.dumps(good()))
    odd = folder / "00001-odd.atif.json"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "link-to-device":
        odd.symlink_to("/dev/zero")
    else:
        (tmp_path / "outside.json").write_text(json.dumps(good()))
        odd.symlink_to(tmp_path / "outside.json")
    result = cli("import", "atif", str(folder), "-o", str(tmp_path / "run"), cwd=tmp_path)
    refused(result, "00001-odd.atif.json")
    assert not (tmp_path / "run").exists()


def test_ids_shaped_like_paths_name_no_file(tmp_path: Path) -> None:
    """An episode id of `../../etc/x` or with a NUL is data: the import writes only -o (a
    directory import: names from its source files), never a path taken from the document."""
    folder = tmp_path / "exported"
    folder.mkdir()
    for n, hostile in enumerate(["../../escaped", "/abs/escaped", "a\x00b", "x" * 5000]):
        document = good()
        document["session_id"] = hostile
        (folder / f"{n}.atif.json").write_text(json.dumps(document))
    before = sorted(p.name for p in tmp_path.iterdir())
    result = cli("import", "atif", str(folder), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "out"])
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == [f"{n}.json" for n in range(4)]
    for name in written:
        EpisodeState.model_validate_json((tmp_path / "out" / name).read_text())


def hostile_run(root: Path, attempt: Any) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "manifest.json").write_text('{"format": "palaestra-run/1", "run_id": "r"}')
    line = {"task": "palaestra/echo:say-birch", "family": "echo", "domain": "d",
            "difficulty": "easy", "attempt": attempt, "seed": 1, "reward": 1.0}  # fmt: skip
    (run / "attempts.jsonl").write_text(json.dumps(line) + "\n")
    return run


def test_an_exported_runs_file_names_stay_inside_out(tmp_path: Path) -> None:
    """A run's attempts.jsonl is data (another's run, or one `import atif` made): an
    `attempt` of "/../../escaped" named a file outside -o DIR."""
    run = hostile_run(tmp_path, "/../../escaped")
    out = tmp_path / "deep" / "out"
    result = cli("export", "atif", "--run", str(run), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.rglob("*escaped*")] == [
        "00000-palaestra-echo-say-birch-aescaped.atif.json"
    ]
    assert [p.parent for p in tmp_path.rglob("*.atif.json")] == [out]
    with (run / "attempts.jsonl").open("a") as f:
        f.write('{"task": "no other field"}\n')
    result = cli("export", "atif", "--run", str(run), "-o", str(tmp_path / "o2"), cwd=tmp_path)
    refused(result, "attempts.jsonl is no attempt")


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"attempt": "/../../escaped"}, "attempt.attempt: must be an integer"),
        ({"seed": [1]}, "attempt.seed: must be an integer"),
        ({"family": None, "drop": "family"}, "attempt.family: Field required"),
    ],
)
def test_an_imported_attempt_must_be_one(
    tmp_path: Path, change: dict[str, Any], names: str
) -> None:
    """`import atif DIR` writes each attempt as a line of a run's attempts.jsonl, which
    `export atif --run` and `eval report` read: an attempt of the wrong shape is refused
    there, naming its field, not written (nor a traceback later)."""
    line, manifest = attempt()
    line = {**line, "family": "echo", "domain": "echo/say", "difficulty": "easy", **change}
    if "drop" in change:
        del line[change["drop"]], line["drop"]
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "00000-x.atif.json").write_text(
        json.dumps(attempt_to_atif(line, manifest, 0, ATIF_V17))
    )
    result = cli("import", "atif", str(folder), "-o", str(tmp_path / "run"), cwd=tmp_path)
    refused(result, "00000-x.atif.json")
    assert names in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["a-folder", "a-file/below", "/proc/nowhere"])
def test_an_unwritable_out_is_refused_without_a_traceback(tmp_path: Path, where: str) -> None:
    source = tmp_path / "ok.atif.json"
    source.write_text(json.dumps(good()))
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("x")
    refused(cli("import", "atif", str(source), "-o", where, cwd=tmp_path), "cannot write there")
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "0.atif.json").write_text(json.dumps(good()))
    run = cli("import", "atif", str(folder), "-o", f"{where}/run", cwd=tmp_path)
    if where != "a-folder":  # a-folder/run is a fine new folder
        refused(run, "cannot write there")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
