"""The Python minor an imported task runs on (docs/importing.md, "Python version"): the
3.12-3.14 bases map to the Debian trixie 3.13 stand-in, built on demand on its own base;
a task whose Python 3.11 cannot compile moves from the terminal image to its own image on
3.13 where its tests run there too, and is refused by name where they cannot; a 3.12 base's
file importing a module 3.13 removed is refused. Fast: no engine, no sandbox."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from palaestra.cli.images import base_suite, recipes
from palaestra.cli.pack_import import reason_class
from palaestra.envs.terminal import pyminor
from palaestra.envs.terminal.baseimages import alias_of
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sandbox.docker.standins import (
    DEFAULT_IMAGE_ALIASES,
    ON_DEMAND,
    PYTHON,
    PYTHON313,
)

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
TYPE_STATEMENT = "type Answer = str\n"


@pytest.mark.parametrize(
    ("image", "stand_in"),
    [
        ("python:3.13-slim", PYTHON313),
        ("python:3.13-slim-bookworm", PYTHON313),
        ("python:3.12", PYTHON313),
        ("python:3.14-slim-trixie", PYTHON313),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", PYTHON313),
        ("python:3.11-slim", PYTHON),
        ("python:3.10", PYTHON),
        ("python:3", PYTHON),
        ("python:3.13.2-slim", PYTHON),  # a patch tag: the repository's key (3.11)
    ],
)
def test_the_stand_in_a_python_base_maps_to(image: str, stand_in: str) -> None:
    assert alias_of(image, DEFAULT_IMAGE_ALIASES) == stand_in


def test_the_313_stand_in_is_built_on_demand_on_the_trixie_base() -> None:
    assert "python3.13" in recipes() and "python3.13" in ON_DEMAND
    assert "python" not in ON_DEMAND  # the 3.11 one is built with the others
    assert base_suite("python3.13") == "trixie"
    assert base_suite("python") == "bookworm"
    assert base_suite("golang") is None  # FROM palaestra/python: its parent's base


def test_on_the_terminal_image_a_task_3_11_compiles_is_noted() -> None:
    judged = pyminor.check("python:3.13-slim", {"tests/t.py": "x: int = 1\n"})
    assert (judged.problems, judged.own_image) == ([], None)
    assert "names Python 3.13; it runs on Python 3.11" in judged.notes[0]
    assert pyminor.check("python:3.11-slim", {"tests/t.py": TYPE_STATEMENT}) == pyminor.Judged()


def test_newer_syntax_asks_for_its_own_image_on_3_13() -> None:
    judged = pyminor.check("python:3.13-slim", {"tests/t.py": TYPE_STATEMENT, "a.sh": "x"})
    assert judged.problems == []
    assert judged.own_image == (
        "base image python:3.13-slim names Python 3.13 and tests/t.py does not compile on "
        "Python 3.11 (line 1: invalid syntax)"
    )
    assert reason_class(judged.tests_elsewhere) == "another Python minor"
    # In its own image it runs what it names: nothing to say.
    assert pyminor.check("python:3.13-slim", {"t.py": TYPE_STATEMENT}, built=True) == (
        pyminor.Judged()
    )


def test_a_tag_mapped_to_3_11_with_newer_syntax_is_refused() -> None:
    [problem] = pyminor.check("python:3.13.2-slim", {"t.py": TYPE_STATEMENT}).problems
    assert "names Python 3.13, which no local stand-in runs for this tag" in problem
    assert reason_class(problem) == "another Python minor"


def test_a_3_12_base_runs_on_3_13_unless_it_imports_what_3_13_removed() -> None:
    ok = pyminor.check("python:3.12", {"a.py": "import os\n"}, built=True)
    assert ok.problems == [] and "runs on Python 3.13" in ok.notes[0]
    gone = pyminor.check("python:3.12", {"a.py": "import os, cgi\n"}, built=True)
    [problem] = gone.problems
    assert "a.py imports cgi, which 3.13 removed (PEP 594" in problem
    assert reason_class(problem) == "another Python minor"
    # On the terminal image (3.11 compiles it) the module is there: noted, not refused.
    assert pyminor.check("python:3.12", {"a.py": "import cgi\n"}).problems == []
    # A 3.13 base's task was written without them: nothing to say.
    assert pyminor.check("python:3.13", {"a.py": "import cgi\n"}, built=True).problems == []


def test_a_3_14_base_is_noted_on_3_13() -> None:
    [note] = pyminor.check("python:3.14-slim", {"a.py": "x = 1\n"}, built=True).notes
    assert "runs on Python 3.13" in note and "syntax new in 3.14 fails there" in note


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("import os.path, lib2to3.pgen2 as p\n", ["lib2to3"]),
        ("from tkinter.tix import Tk\n  import  uu\n", ["tkinter.tix", "uu"]),
        ("from telnetlib import Telnet\n", ["telnetlib"]),
        ("import tkinter\nimport cgitbx\n# import cgi\nx = 'import cgi'\n", []),
    ],
)
def test_the_modules_3_13_removed_that_a_file_imports(text: str, gone: list[str]) -> None:
    assert pyminor.removed_imports(text) == gone


def test_a_terminal_bench_task_in_3_12_syntax_imports_into_its_own_image(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src" / "grep-errors"
    shutil.copytree(FIXTURES / "terminal-bench" / "grep-errors", src)
    tests = src / "tests" / "test_outputs.py"
    tests.write_text(TYPE_STATEMENT + tests.read_text())
    report = import_tasks("terminal-bench", src.parent, tmp_path / "pack")
    assert report.skipped == {}
    [notes] = report.imported.values()
    assert any("runs in the image built from its Dockerfile" in n for n in notes)
    assert any("tests/test_outputs.py does not compile on Python 3.11" in n for n in notes)
    build = tmp_path / "pack" / "tasks" / "grep-errors" / "build" / "Dockerfile"
    assert build.read_text().startswith("FROM ghcr.io/laude-institute/t-bench/python-3-13")
    # Its tests run by uvx on the verifier image (3.11) instead: refused, by name.
    (src / "run-tests.sh").write_text("uvx -p 3.13 -w pytest==8.4.1 pytest $TEST_DIR -rA\n")
    report = import_tasks("terminal-bench", src.parent, tmp_path / "pack", force=True)
    [reason] = report.skipped["grep-errors"]
    assert "for its tests: they run on a verifier image" in reason


def test_a_built_3_13_task_whose_tests_use_uvx_says_where_they_run(tmp_path: Path) -> None:
    src = tmp_path / "src" / "grep-errors"
    shutil.copytree(FIXTURES / "terminal-bench" / "grep-errors", src)
    with (src / "Dockerfile").open("a") as f:
        f.write("USER root\nRUN useradd -m builder\n")  # needs root: its own image
    (src / "run-tests.sh").write_text("uvx -p 3.13 -w pytest==8.4.1 pytest $TEST_DIR -rA\n")
    report = import_tasks("terminal-bench", src.parent, tmp_path / "pack")
    [notes] = report.imported.values()
    assert any("runs in the image built from its Dockerfile" in n for n in notes)
    assert any(
        "its environment runs on Python 3.13" in n and "its tests on the verifier image" in n
        for n in notes
    )


def test_the_harbor_fixture_on_python_3_13_imports_into_its_own_image(tmp_path: Path) -> None:
    report = import_tasks("harbor", FIXTURES / "harbor-python313", tmp_path / "pack")
    assert list(report.imported) == ["spread"] and report.skipped == {}
    [note] = report.imported["spread"]
    assert "environment/stats.py does not compile on Python 3.11 (line 5" in note
    assert (tmp_path / "pack" / "tasks" / "spread" / "build" / "stats.py").is_file()
