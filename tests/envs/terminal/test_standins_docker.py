"""A task on a public toolchain base image runs on docker through its local stand-in: the C++
Harbor task of tests/fixtures/harbor-toolchains (`FROM gcc:12`, its oracle builds with CMake,
which only the gcc stand-in has) imports, its environment builds on palaestra/gcc (built from
images/gcc where missing, cached under the engine like the other images), and the pack check
scores its oracle 1, null 0 and every cheat 0; the tasks nothing here serves are refused at
import by name. Skips when the engine or the base is missing (scripts/docker-up.sh)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.server.packcheck import check_pack
from tests.conftest import docker_skip_reason

FIXTURES = Path(__file__).parents[2] / "fixtures"
WHY = docker_skip_reason("palaestra/python:latest")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]


def test_cpp_task_builds_on_the_gcc_stand_in_and_passes_its_oracle(tmp_path: Path) -> None:
    out = tmp_path / "toolchains"
    result = CliRunner().invoke(
        app,
        ["pack", "import", "harbor", str(FIXTURES / "harbor-toolchains"), str(out), "--build"],
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"env-\w+: (built|cached) \(\d+ s\) tasks: cpp-wordcount\n", result.output)
    report = json.loads((out / "import-report.json").read_text())
    assert {i["id"] for i in report["skipped"]} == {"go-newer", "zig-hello"}
    checked = asyncio.run(check_pack(out, sandbox="docker"))
    task = checked.results["cpp-wordcount"]
    assert (task.oracle, task.null) == (1.0, 0.0), [
        (p.where, p.check, p.message) for p in checked.problems
    ]
    assert checked.ok, [(p.where, p.check, p.message) for p in checked.problems]
