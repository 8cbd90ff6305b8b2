"""`palaestra pack import finqa`: FinQA and TAT-QA JSON become a finance pack that checks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.finance.importer import ImportProblem, derivation_program, import_file
from palaestra.server.packs.check import check_pack

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "finqa"


def test_derivations_become_programs() -> None:
    assert derivation_program("72,414 - 68,911") == "subtract(72414, 68911)"
    assert derivation_program("(72,414 - 40,120) / 72,414 * 100") == (
        "subtract(72414, 40120), divide(#0, 72414), multiply(#1, const_100)"
    )
    with pytest.raises(ImportProblem):
        derivation_program("max(1, 2)")


@pytest.mark.parametrize("fixture,expected", [("finqa.json", 2), ("tatqa.json", 2)])
def test_import_then_check(tmp_path: Path, fixture: str, expected: int) -> None:
    out = tmp_path / "pack"
    count, problems = import_file(FIXTURES / fixture, out, "acme/finqa", "train")
    assert count == expected
    if fixture == "finqa.json":
        assert len(problems) == 1 and "frobnicate" in problems[0]  # said, and skipped
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert all(t["family"] == "finance" and t["private"]["gold"]["program"] for t in tasks)
    report = asyncio.run(check_pack(out))
    assert report.ok, [(p.where, p.check, p.message) for p in report.problems]


def test_cli_import(tmp_path: Path) -> None:
    out = tmp_path / "cli-pack"
    runner = CliRunner()
    run = runner.invoke(app, ["pack", "import", "finqa", str(FIXTURES / "tatqa.json"), str(out)])
    assert run.exit_code == 0, run.output
    assert (out / "pack.toml").exists() and "wrote 2 tasks" in run.output
    bad = runner.invoke(app, ["pack", "import", "finqa", str(tmp_path / "missing.json"), str(out)])
    assert bad.exit_code == 2 and "error" in bad.output
