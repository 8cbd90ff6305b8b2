"""`palaestra pack import terminal-bench|harbor`: the fixtures under tests/fixtures/
terminal-bench and tests/fixtures/harbor (one task each that converts, two each that need
what the sandbox cannot give) become packs that `pack check` proves on bwrap; the rest are
reported by name with the reason."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs import cheats as generic
from palaestra.envs.terminal.dockerfile import convert_dockerfile
from palaestra.envs.terminal.importer import clean_test_script
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.server.packcheck import CheckReport, check_pack

FIXTURES = Path(__file__).parents[2] / "fixtures"
runner = CliRunner()


def _import(fmt: str, out: Path, *extra: str) -> tuple[int, str, dict[str, object]]:
    result = runner.invoke(
        app, ["pack", "import", fmt, str(FIXTURES / fmt), str(out), *extra], catch_exceptions=False
    )
    report = json.loads((out / "import-report.json").read_text()) if out.exists() else {}
    return result.exit_code, result.output, report


def _skipped(report: dict[str, object]) -> dict[str, str]:
    items = report["skipped"]
    assert isinstance(items, list)
    return {item["id"]: " ".join(item["reasons"]) for item in items}


def test_terminal_bench_import(tmp_path: Path) -> None:
    out = tmp_path / "tb"
    code, output, report = _import("terminal-bench", out, "--name", "tb/fixtures", "--verbose")
    assert code == 0, output
    assert [i["id"] for i in report["imported"]] == ["grep-errors"]  # type: ignore[index,union-attr]
    skipped = _skipped(report)
    assert set(skipped) == {"fetch-prices", "pg-migrate"}
    # its Dockerfile's pip install is built into its image now; its solution's curl is not
    assert "solution needs the network" in skipped["fetch-prices"]
    assert "services (client, db)" in skipped["pg-migrate"]
    for name in ("fetch-prices", "pg-migrate", "grep-errors"):
        assert name in output  # on the console too, never silently dropped

    task = out / "tasks" / "grep-errors"
    meta = tomllib.loads((task / "task.toml").read_text())
    assert meta["public"]["workdir"] == "/app" and meta["difficulty"] == "easy"
    assert meta["domain"] == "fixtures/log-analysis"
    assert (task / "environment" / "logs" / "server.log").is_file()
    assert "mkdir -p /app/out" in (task / "environment" / "setup.sh").read_text()
    tests = (task / "verifier" / "run-tests.sh").read_text()
    assert "uv add" not in tests  # the uv installer line stays: offline it does nothing
    assert "python3 -m pytest $TEST_DIR/test_outputs.py" in tests
    assert (task / "verifier" / "tests" / "test_outputs.py").is_file()

    strict = runner.invoke(
        app,
        [
            "pack",
            "import",
            "terminal-bench",
            str(FIXTURES / "terminal-bench"),
            str(out),
            "--force",
            "--strict",
        ],
    )
    assert strict.exit_code == 1  # --strict: a skipped task fails the import
    again = runner.invoke(
        app, ["pack", "import", "terminal-bench", str(FIXTURES / "terminal-bench"), str(out)]
    )
    assert again.exit_code == 2 and "not empty" in again.output


def test_harbor_import(tmp_path: Path) -> None:
    out = tmp_path / "hb"
    code, output, report = _import("harbor", out, "--split", "heldout")
    assert code == 0, output
    assert [i["id"] for i in report["imported"]] == ["sum-column"]  # type: ignore[index,union-attr]
    skipped = _skipped(report)
    assert "GPU" in skipped["train-gpu"]
    # node:20 and its service would be built into its image; its tests' curl cannot be
    assert "tests need the network" in skipped["node-api"]
    meta = tomllib.loads((out / "tasks" / "sum-column" / "task.toml").read_text())
    assert meta["split"] == "heldout" and meta["public"]["env"] == {
        "ORDERS_FILE": "/app/orders.csv"
    }
    pack = tomllib.loads((out / "pack.toml").read_text())
    assert pack["splits"] == {"heldout": {"sealed": True}}
    harbor_test = (out / "tasks" / "sum-column" / "verifier" / "harbor-test.sh").read_text()
    assert "$VERIFIER_LOGS/reward.txt" in harbor_test and "$VERIFIER_DIR/tests/" in harbor_test


@pytest.mark.slow
@pytest.mark.skipif(not bwrap_available()[0], reason=f"bwrap unavailable: {bwrap_available()[1]}")
def test_imported_packs_pass_pack_check(tmp_path: Path) -> None:
    """oracle 1, null 0, cheats <= 0.1 for what was imported, on bwrap (the Harbor import:
    tests/envs/terminal/test_harbor.py::test_importing_doc_end_to_end)."""
    outs = [tmp_path / "terminal-bench"]
    for out in outs:
        assert _import(out.name, out)[0] == 0

    async def both() -> list[CheckReport]:
        return list(await asyncio.gather(*(check_pack(out, concurrency=3) for out in outs)))

    for report in asyncio.run(both()):
        assert report.ok, [(p.where, p.check, p.message) for p in report.problems]
        # oracle, rerun, null, 4 terminal cheats (boot-forge: a test-script task) and
        # every shell class of the library
        assert report.checked == 1 and report.episodes == 7 + len(generic.NAMES)
        assert set(report.generic) == set(generic.NAMES)
        assert all(c["max"] <= 0.1 for c in report.to_json()["cheats"].values())


@pytest.mark.slow
def test_dockerfile_conversion_reasons() -> None:
    ctx = FIXTURES / "harbor" / "sum-column" / "environment"
    plan = convert_dockerfile(
        "FROM python:3.11-slim\nWORKDIR /srv\nRUN apt-get install -y jq postgresql\n"
        "RUN mkdir -p /etc/app && cp x /usr/local/bin/\nADD https://example.com/a.tgz /srv/\n"
        "COPY orders.csv data/\nRUN echo hi > note.txt\nUSER nobody\n",
        ctx,
        exclude=set(),
    )
    assert plan.workdir == "/srv" and plan.files == {"data/orders.csv": "id,customer,amount\n"
                                                     "1,ann,12\n2,bob,30\n3,ann,8\n"}  # fmt: skip
    assert plan.setup == ["echo hi > note.txt"]
    text = " | ".join(plan.problems)
    assert "postgresql" in text and "jq" not in text.split("postgresql")[0].split(":")[-1]
    assert "/etc/app" in text and "/usr/local/bin/" in text and "example.com" in text
    multi = convert_dockerfile("FROM golang:1.22 AS b\nFROM debian:12\n", ctx, set())
    assert any("golang" in p for p in multi.problems)
    assert any("multi-stage" in p for p in multi.problems)


def test_test_script_cleaning() -> None:
    script, problems = clean_test_script(
        "#!/bin/bash\napt-get update\ncurl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
        "source $HOME/.local/bin/env\nuv venv\nsource .venv/bin/activate\n"
        "uv pip install pytest==8.4.1\npytest /tests/test_outputs.py -rA\n"
        "echo $? > /logs/verifier/reward.txt\n",
        tests_dir="$VERIFIER_DIR/tests",
        logs_dir="$VERIFIER_LOGS",
    )
    assert problems == []
    assert script == (  # offline no-ops kept; the workdir venv steps dropped
        "#!/bin/bash\napt-get update\ncurl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
        "source $HOME/.local/bin/env\npytest $VERIFIER_DIR/tests/test_outputs.py -rA\n"
        "echo $? > $VERIFIER_LOGS/reward.txt\n"
    )
    _, needs = clean_test_script(
        "pip install numpy\npython3 -m pytest /tests\n", tests_dir="/v", logs_dir=None
    )
    assert needs and "network" in needs[0]


def test_tests_that_call_a_remote_server_are_named() -> None:
    """An external judge over HTTP cannot answer a sandbox with no network: the task is
    skipped with that cause (a URL in a comment, or a loopback server, is no such call)."""
    from palaestra.envs.terminal.importer import tests_network_problems

    judge = "import requests\nBASE = 'http://38.80.122.117:8081'\n"
    assert tests_network_problems({"test_outputs.py": judge}) == [
        "the tests reach 38.80.122.117 over the network (tests/test_outputs.py)"
    ]
    local = "import requests\nBASE = 'http://127.0.0.1:8000'\n# docs: https://example.org\n"
    assert tests_network_problems({"test_outputs.py": local}) == []
    assert tests_network_problems({"test_a.py": "# see https://docs.python.org/3/\n"}) == []
