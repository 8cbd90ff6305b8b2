"""The paths a task's tests use, as Harbor lays a trial out (docs/importing.md, "Paths the
tests use"): helpers that read `/tests/…` and a verifier that writes `/shared` and
`/logs/verifier` run as in Harbor; files handed from the agent to its tests through
`/shared`, a test file a script runs that the task does not ship, and Python the local
stand-in's minor cannot compile are refused at import, counted by reason in the report and
the summary line, never a void or a zero at the first episode."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.terminal import pyminor, testpaths
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.verifiers.terminal import VERIFIER_DIR, VERIFIER_LOGS

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "harbor" / "test-paths"
GREP_ERRORS = ROOT / "tests" / "fixtures" / "terminal-bench" / "grep-errors"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The fixtures imported once through the CLI: the pack folder and what it printed."""
    out = tmp_path_factory.mktemp("test-paths") / "pack"
    result = CliRunner().invoke(
        app, ["pack", "import", "harbor", str(FIXTURES), str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return out, result.output


def test_helpers_find_tests_shared_and_logs_where_the_verifier_has_them(
    imported: tuple[Path, str],
) -> None:
    out, _ = imported
    verifier = out / "tasks" / "helper-paths" / "verifier"
    check = (verifier / "tests" / "check.py").read_text()
    assert f'Path("{VERIFIER_DIR}/tests/expected.txt")' in check
    assert f'Path("{VERIFIER_DIR}/shared/seen.txt")' in check
    assert f'Path("{VERIFIER_LOGS}/reward.json")' in check
    assert '"/tests/' not in check and '"/shared/' not in check
    script = (verifier / "harbor-test.sh").read_text()
    assert (
        script.splitlines()[1]
        == f"mkdir -p {VERIFIER_DIR}/shared  # /shared: the verifier's own (palaestra)"
    )
    assert "python3 $VERIFIER_DIR/tests/check.py" in script
    report = json.loads((out / "import-report.json").read_text())
    [task] = report["imported"]
    assert task["id"] == "helper-paths"
    assert any("tests/check.py moved" in n for n in task["notes"])


def test_what_cannot_run_is_refused_by_name_and_counted(imported: tuple[Path, str]) -> None:
    out, printed = imported
    report = json.loads((out / "import-report.json").read_text())
    why = {t["id"]: t["reasons"] for t in report["skipped"]}
    assert why["missing-test-file"] == [
        "tests/test.sh names the test file /tests/test_outputs.py, which the task does not "
        "ship (no tests/test_outputs.py): its tests would fail at the first episode"
    ]
    assert why["shared-handoff"] == [
        "the task passes files from the agent to its tests through /shared "
        "(solution/solve.sh); palaestra's verifier receives the workdir only"
    ]
    [python] = why["python-313"]
    assert python.startswith(
        "base image python:3.13-slim-bookworm names Python 3.13, which no local stand-in runs "
        "for its tests: they run on a verifier image (uv/uvx"
    )
    assert "tests/test_outputs.py does not compile on Python 3.11 (line 3" in python
    summary = (
        "1 imported, 3 skipped (1 × missing test file; 1 × another Python minor; "
        "1 × agent files through /shared)"
    )
    assert summary in " ".join(printed.split())
    assert report["summary"] == summary  # the report file counts them as the line does
    assert report["skipped_by_reason"] == {
        "missing test file": 1,
        "another Python minor": 1,
        "agent files through /shared": 1,
    }


def test_a_terminal_bench_run_tests_missing_its_test_file_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(GREP_ERRORS, src / "grep-errors")
    (src / "grep-errors" / "tests" / "test_outputs.py").unlink()
    report = import_tasks("terminal-bench", src, tmp_path / "pack")
    [reason] = report.skipped["grep-errors"]
    assert "names the test file /tests/test_outputs.py" in reason


@pytest.mark.parametrize(
    ("script", "missing"),
    [
        ("bash /tests/helper.sh\n", ["helper.sh"]),
        ('python3 "$TEST_DIR/check.py"\n', ["check.py"]),
        ("pytest ${TEST_DIR}/test_a.py /tests/data/\n", ["test_a.py"]),
        ('echo "see /tests/notes.txt"\n', []),  # printed only
        ('if [ -d "$TEST_DIR/src" ]; then cp -r "$TEST_DIR/src/." /app/; fi\n', []),
        ("echo ok > /tests/out.txt && cat /tests/out.txt\n", []),  # written by the script
        ("# pytest /tests/old_test.py\npytest /tests/*.py /tests/$NAME\n", []),
        ("cat /tests/../etc/passwd\n", []),
    ],
)
def test_references_to_test_files(tmp_path: Path, script: str, missing: list[str]) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("1\n")
    found = testpaths.missing_references({"tests/test.sh": script}, tmp_path)
    assert [p.split("/tests/", 1)[1].split(",")[0] for p in found] == missing


@pytest.mark.parametrize(
    ("text", "moved"),
    [
        ('open("/tests/a.json")', f'open("{VERIFIER_DIR}/tests/a.json")'),
        ("Path('/logs/verifier') / 'reward.txt'", f"Path('{VERIFIER_LOGS}') / 'reward.txt'"),
        ("cp x /shared/y", f"cp x {VERIFIER_DIR}/shared/y"),
        ("./tests/a /app/tests/b http://h/tests/c $X/tests /testsuite /shared-x", None),
    ],
)
def test_only_harbors_own_paths_are_moved(text: str, moved: str | None) -> None:
    assert testpaths.move_paths(text) == (moved or text)


@pytest.mark.parametrize(
    ("image", "minor"),
    [
        ("python:3.13-slim-bookworm", (3, 13)),
        ("docker.io/library/python:3.12", (3, 12)),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", (3, 13)),
        ("python:3", None),
        ("python:latest", None),
        ("ubuntu:24.04", None),
    ],
)
def test_the_python_minor_an_image_names(image: str, minor: tuple[int, int] | None) -> None:
    assert pyminor.named_minor(image) == minor


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not bwrap_available()[0], reason=f"bwrap unavailable: {bwrap_available()[1]}")
def test_the_imported_helper_paths_task_passes_pack_check(
    imported: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On bwrap: the oracle's answer is judged by a helper that reads /tests, writes
    /shared and /logs/verifier (oracle 1; unmoved, it scores 0); null 0, cheats ≤ 0.1."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(imported[0], tmp_path / "pack")
    result = CliRunner().invoke(app, ["pack", "check", "pack"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "oracle 1/1 pass, null 1/1 zero, cheats 1/1 ≤ 0.1, void 0" in result.output
    assert os.path.isdir(tmp_path / "pack" / "tasks" / "helper-paths")


def test_an_export_finds_the_moved_helpers_where_harbor_runs_them(
    imported: tuple[Path, str], tmp_path: Path
) -> None:
    """The exported tests/test.sh links the verifier folders the moved helpers name to the
    ones Harbor runs the tests from (/tests/palaestra, /logs/verifier)."""
    result = CliRunner().invoke(
        app, ["pack", "export", "harbor", str(imported[0]), str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    script = (tmp_path / "out" / "helper-paths" / "tests" / "test.sh").read_text()
    assert f'ln -s "$VERIFIER_DIR" {VERIFIER_DIR} && ln -s "$VERIFIER_LOGS" {VERIFIER_LOGS}' in (
        script
    )
    helper = tmp_path / "out" / "helper-paths" / "tests" / "palaestra" / "tests" / "check.py"
    assert f"{VERIFIER_DIR}/tests/expected.txt" in helper.read_text()
