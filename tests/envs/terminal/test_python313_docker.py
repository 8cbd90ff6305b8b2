"""A task on `FROM python:3.13-slim` runs on Python 3.13 (docs/importing.md, "Python
version"): the Harbor task of tests/fixtures/harbor-python313, whose program is in 3.12
syntax (3.11 cannot compile it) and whose tests fail unless they run on 3.13, imports into
its own image, which `--build` makes on palaestra/python3.13 (and that on the Debian trixie
base, images/base/build.sh, where the engine lacks them: the cache keeps them after); the
pack check on docker scores its oracle 1 and null 0. Skips without the engine or the
bookworm base (scripts/docker-up.sh)."""

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
WHY = docker_skip_reason("palaestra/base:bookworm")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]


@pytest.mark.timeout(900)
def test_a_python_3_13_task_runs_on_3_13_and_passes_its_oracle(tmp_path: Path) -> None:
    out = tmp_path / "py313"
    result = CliRunner().invoke(
        app,
        ["pack", "import", "harbor", str(FIXTURES / "harbor-python313"), str(out), "--build"],
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"env-\w+: (built|cached) \(\d+ s\) tasks: spread\n", result.output)
    report = json.loads((out / "import-report.json").read_text())
    assert [t["id"] for t in report["imported"]] == ["spread"]
    checked = asyncio.run(check_pack(out, sandbox="docker"))
    task = checked.results["spread"]
    assert (task.oracle, task.null) == (1.0, 0.0), [
        (p.where, p.check, p.message) for p in checked.problems
    ]
    assert checked.ok, [(p.where, p.check, p.message) for p in checked.problems]
