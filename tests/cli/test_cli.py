"""The `palaestra` command, run as a subprocess; and the unbiased pass@k estimator."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServerProcess, cli_env

from palaestra.sdk.report import pass_at_k

CLI = str(Path(sys.executable).parent / "palaestra")


def cli(
    *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        cwd=cwd,
        env=cli_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_families(tmp_path: Path) -> None:
    result = cli("families", "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "coding" in result.stdout and "echo" in result.stdout
    assert "run_python" in result.stdout and "submit" in result.stdout
    total = re.search(r"(\d+) domains", result.stdout)
    assert total is not None and int(total.group(1)) >= 100, result.stdout  # the bar


def test_tasks_heldout_lists_33(tmp_path: Path) -> None:
    result = cli(
        "tasks",
        "--pack",
        "openai/humaneval",
        "--split",
        "heldout",
        "--data-dir",
        str(tmp_path / "d"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "33 tasks" in result.stdout
    assert "HumanEval-5" in result.stdout and "HumanEval-1:" not in result.stdout


@pytest.mark.parametrize(("policy", "reward"), [("oracle", 1.0), ("null", 0.0)])
def test_eval_echo_writes_report(tmp_path: Path, policy: str, reward: float) -> None:
    out = tmp_path / "R.json"
    result = cli(
        "eval",
        "--pack",
        "palaestra/echo",
        "--split",
        "train",
        "--policy",
        policy,
        "-k",
        "2",
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "d"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["attempts"] == 16 and summary["tasks"] == 8
    assert summary["mean_reward"] == reward
    assert summary["pass_at_k"] == {"1": reward, "2": reward}
    assert summary["void"] == 0 and summary["errors"] == 0
    header = report["header"]
    assert header["pack"] == "palaestra/echo" and header["split"] == "train"
    assert header["policy"] == policy and header["k"] == 2
    assert header["pack_digest"].startswith("sha256:")
    assert len(report["attempts"]) == 16
    assert {a["seed"] for a in report["attempts"]} == {0, 1}


def test_eval_against_a_real_server(tmp_path: Path, server: ServerProcess) -> None:
    out = tmp_path / "he.json"
    result = cli(
        "eval",
        "--pack",
        "openai/humaneval",
        "--split",
        "heldout",
        "--policy",
        "oracle",
        "--limit",
        "5",
        "--url",
        server.url,
        "--data-dir",  # with --url: the local server's admin token is read from there
        str(server.data_dir),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr + server.logs()
    report = json.loads(out.read_text())
    assert report["summary"]["attempts"] == 5
    assert report["summary"]["mean_reward"] == 1.0
    assert report["header"]["server"] == server.url
    numbers = [int(a["task"].rsplit("-", 1)[1]) for a in report["attempts"]]
    assert len(set(numbers)) == 5 and all(n % 5 == 0 for n in numbers)  # heldout: N % 5 == 0


def test_run_scripted_episode(tmp_path: Path) -> None:
    script = tmp_path / "actions.jsonl"
    script.write_text(
        json.dumps({"tool": "echo", "arguments": {"text": "hello"}})
        + "\n"
        + json.dumps({"tool": "submit", "arguments": {"answer": "hcrib"}})
        + "\n"
    )
    result = cli(
        "run",
        "palaestra/echo:say-birch",
        "--policy",
        "script",
        "--script",
        str(script),
        "--data-dir",
        str(tmp_path / "d"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout[result.stdout.rindex("\n{") :])
    assert verdict["reward"] == 1.0 and verdict["passed"] is True
    assert verdict["status"] == "ok"
    assert "hello" in result.stdout


def test_config_prints_json(tmp_path: Path) -> None:
    result = cli("config", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)
    assert "data_dir" in settings and settings["sandbox"] == {"value": "bwrap", "from": "default"}


def test_config_says_where_each_value_came_from(tmp_path: Path) -> None:
    (tmp_path / "palaestra.toml").write_text("port = 9001\nmax_steps = 7\n")
    env = {"PALAESTRA_MAX_STEPS": "9", "E2B_API_KEY": "e2b-secret-key", "PALAESTRA_FORKSERVER": "0"}
    result = cli("config", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)
    assert settings["port"] == {"value": 9001, "from": "palaestra.toml"}
    assert settings["max_steps"] == {"value": 9, "from": "PALAESTRA_MAX_STEPS"}  # env over toml
    assert settings["forkserver"] == {"value": False, "from": "PALAESTRA_FORKSERVER"}
    assert settings["e2b_api_key"]["from"] == "E2B_API_KEY"
    table = cli("config", cwd=tmp_path, env=env)
    assert table.returncode == 0, table.stderr
    for shown in (result.stdout, table.stdout):
        assert "e2b-secret-key" not in shown  # secrets are redacted
    assert "heldout_secret_file" in table.stdout and "PALAESTRA_FORKSERVER" in table.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("eval", "--pack", "nobody/nothing", "--split", "train"),
        ("tasks", "--pack", "nobody/nothing"),
        ("run", "nobody/nothing:t1", "--policy", "null"),
    ],
    ids=["eval", "tasks", "run"],
)
def test_unknown_pack_is_a_clear_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = cli(*args, "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "nobody/nothing" in output
    assert "Traceback" not in output


# -- unbiased pass@k ------------------------------------------------------------------------


def test_pass_at_k_known_values() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(10, 3, 8) == 1.0  # fewer than k failures: some k-subset always passes
    assert pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert pass_at_k(2, 1, 2) == 1.0
