"""`palaestra eval run/resume/report/compare` as a user runs them: subprocesses, run
directories on disk, a crash (SIGKILL) and a Ctrl-C (SIGINT) mid-run, bad policies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import cli_env

from palaestra.server.config import REPO_PACKS
from tests.servers import scaled

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).parent / "palaestra")

# A policy module the CLI imports as `module:callable` (PYTHONPATH is the test's tmp dir).
POLICIES = textwrap.dedent(
    """
    import asyncio, re

    WORD = re.compile(r"Submit the word '(\\w+)'")

    async def slow(messages, tools):
        await asyncio.sleep(0.5)  # slow enough that a signal lands mid-run on a loaded machine
        word = WORD.search(messages[1]["content"]).group(1)
        return {"tool": "submit", "arguments": {"answer": word[::-1]}}

    def garbage(messages, tools):
        return "the answer is probably 42"

    def broken(messages, tools):
        raise RuntimeError("my policy has a bug")

    async def wrong_then_right(messages, tools):
        if not any(m["role"] == "tool" for m in messages):
            return {"tool": "no_such_tool", "arguments": {}}
        word = WORD.search(messages[1]["content"]).group(1)
        return {"tool": "submit", "arguments": {"answer": word[::-1]}}
    """
)


def cli(
    *args: str, cwd: Path, timeout: float = 120, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        cwd=cwd,
        env=_env(cwd, extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _env(cwd: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The echo pack alone (every run here plays it): each `eval` loads no other pack (a
    third of its start-up CPU)."""
    echo = {"PALAESTRA_PACKS_DIRS": str(REPO_PACKS / "echo")}
    return cli_env(PYTHONPATH=str(cwd), **{**echo, **(extra or {})})


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "mypolicies.py").write_text(POLICIES)
    return tmp_path


def lines(run: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (run / "attempts.jsonl").read_text().splitlines() if x]


def test_run_report_compare(work: Path) -> None:
    data = str(work / "d")
    oracle, null = work / "runs" / "oracle", work / "runs" / "null"
    common = ("--pack", "palaestra/echo@0.1.0", "--split", "train", "-k", "2")
    done = cli("eval", "run", *common, "--policy", "oracle", "--run-dir", str(oracle),
               "--data-dir", data, cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = json.loads((oracle / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["k"] == 2 and manifest["seeds"] == [0, 1]
    assert manifest["pack_digest"].startswith("sha256:") and len(manifest["tasks"]) == 8
    assert manifest["limits"] == {"max_steps": 30, "max_tokens": 0, "max_wall_s": 600.0}
    stored = lines(oracle)
    assert len(stored) == 16 and all(a["status"] == "ok" and a["reward"] == 1.0 for a in stored)
    assert {(a["task"], a["attempt"]) for a in stored} == {
        (t["id"], i) for t in manifest["tasks"] for i in (0, 1)
    }
    assert all(a["task_digest"].startswith("sha256:") for a in stored)
    assert all(a["trajectory"][0]["action"]["tool"] == "oracle" for a in stored)
    report = json.loads((oracle / "report.json").read_text())
    assert report["summary"]["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert report["header"]["grading"]["mode"] == "stored"
    assert len(report["header"]["task_digests"]) == 8
    assert (oracle / "report.html").read_text().startswith("<!doctype html>")
    assert "mean reward" in done.stdout and str(oracle / "report.html") in done.stdout

    # `eval report` regrades by replaying the stored trajectories on the server.
    regraded = cli("eval", "report", str(oracle), "--data-dir", data, cwd=work)
    assert regraded.returncode == 0, regraded.stderr
    report = json.loads((oracle / "report.json").read_text())
    grading = report["header"]["grading"]
    assert grading["mode"] == "replay" and grading["regraded"] == 16 and grading["changed"] == 0
    assert "16 of 16 attempts regraded" in regraded.stderr
    assert all(a["regraded"]["graded"] == "replay" for a in report["attempts"])
    stored_only = cli("eval", "report", str(oracle), "--no-regrade", cwd=work)
    assert stored_only.returncode == 0, stored_only.stderr
    assert "stored verdicts" in stored_only.stderr

    done = cli("eval", "run", *common, "--policy", "null", "--run-dir", str(null),
               "--data-dir", data, cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr
    compared = cli("eval", "compare", str(oracle), str(null), "--out", str(work / "c.json"),
                   cwd=work)  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    result = json.loads((work / "c.json").read_text())
    row = result["domains"]["echo/say"]
    assert row["delta"] == -1.0 and row["ci_low"] == -1.0 and row["ci_high"] == -1.0
    assert row["significant"] and result["domains"]["all"]["tasks"] == 8

    # Runs of another pack version (another digest) are refused, with the reason.
    other = json.loads((null / "report.json").read_text())
    other["header"]["pack_digest"] = "sha256:" + "0" * 64
    (work / "other.json").write_text(json.dumps(other))
    refused = cli("eval", "compare", str(oracle), str(work / "other.json"), cwd=work)
    assert refused.returncode == 2
    assert "cannot compare" in refused.stderr and "different packs" in refused.stderr
    assert "Traceback" not in refused.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_crash_and_ctrl_c_then_resume(work: Path) -> None:
    """SIGKILL mid-run, then SIGINT mid-resume; a last resume finishes. Nothing finished is
    recomputed; nothing is lost."""
    data = str(work / "d")
    run = work / "r"
    args = [CLI, "eval", "run", "--pack", "palaestra/echo", "--split", "train", "-k", "2",
            "--policy", "mypolicies:slow", "--concurrency", "2", "--run-dir", str(run),
            "--data-dir", data]  # fmt: skip

    logs: list[Path] = []

    def start(argv: list[str]) -> subprocess.Popen[str]:
        # Output goes to files: an unread pipe could fill and stall the CLI.
        logs.append(work / f"cli-{len(logs)}.log")
        with open(logs[-1], "w") as log:
            return subprocess.Popen(
                argv,
                cwd=work,
                env=_env(work),
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                # A foreground CLI gets Ctrl-C; a suite started in the background (`cmd &`)
                # would hand it SIGINT ignored, and the signal below would be lost.
                preexec_fn=_default_sigint,
            )

    def wait_lines(n: int, proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline:
            path = run / "attempts.jsonl"
            if path.exists() and len(path.read_text().splitlines()) >= n:
                return
            assert proc.poll() is None, logs[-1].read_text()
            time.sleep(0.05)
        raise AssertionError(f"fewer than {n} attempts in time: {logs[-1].read_text()}")

    proc = start(args)
    wait_lines(3, proc)
    proc.kill()  # a crash: no cleanup at all
    proc.wait()
    before = (run / "attempts.jsonl").read_text()
    crashed = lines(run)
    assert 3 <= len(crashed) < 16

    proc = start([CLI, "eval", "resume", str(run)])
    wait_lines(len(crashed) + 2, proc)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    proc.wait(timeout=60)
    stderr = logs[-1].read_text()
    assert proc.returncode == 130, stderr
    assert "eval resume stopped by SIGINT" in stderr
    assert f"palaestra eval resume {run}" in stderr
    assert "Traceback" not in stderr
    interrupted = lines(run)
    assert (run / "attempts.jsonl").read_text().startswith(before)  # appended, never rewritten
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert [s["ended"] for s in manifest["sessions"]] == ["interrupted"]

    done = cli("eval", "resume", str(run), cwd=work)
    assert done.returncode == 0, done.stderr
    final = lines(run)
    assert (
        (run / "attempts.jsonl")
        .read_text()
        .startswith("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in interrupted))
    )
    keys = [(a["task"], a["attempt"]) for a in final]
    assert len(final) == 16 and len(set(keys)) == 16  # each attempt ran exactly once
    assert all(a["status"] == "ok" and a["reward"] == 1.0 for a in final)
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    again = cli("eval", "resume", str(run), cwd=work)
    assert again.returncode == 0 and "nothing to resume" in again.stderr
    assert len(lines(run)) == 16


@pytest.mark.parametrize(
    ("policy", "error_class"),
    [("mypolicies:garbage", "bad_policy_output"), ("mypolicies:broken", "policy_error")],
)
def test_bad_python_policy_is_classed(work: Path, policy: str, error_class: str) -> None:
    run = work / "r"
    done = cli("eval", "run", "--pack", "palaestra/echo", "--split", "train", "--limit", "2",
               "--policy", policy, "--run-dir", str(run), "--data-dir", str(work / "d"),
               cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = lines(run)
    assert len(stored) == 2
    for a in stored:
        assert a["status"] == "error" and a["error_class"] == error_class, a
        assert a["reward"] == 0.0 and a["error"]
    report = json.loads((run / "report.json").read_text())
    assert report["summary"]["errors"] == 2 and report["summary"]["void"] == 0
    assert report["summary"]["mean_reward"] == 0.0  # a policy failure counts, as 0
    assert report["process"]["failure_classes"] == {error_class: 2}
    assert f"failure classes: {error_class} 2" in done.stdout
    if policy.endswith("garbage"):
        # The policy is fixed (a model endpoint back up): resume --retry-errors reruns them.
        assert "nothing to resume" in cli("eval", "resume", str(run), cwd=work).stderr
        fixed = POLICIES.replace('return "the answer is probably 42"', "return await_fix()")
        (work / "mypolicies.py").write_text(
            fixed + "\ndef await_fix():\n    return {'tool': 'submit', 'arguments': {}}\n"
        )
        again = cli("eval", "resume", str(run), "--retry-errors", cwd=work)
        assert again.returncode == 0, again.stderr
        assert [a["status"] for a in lines(run)] == ["error", "error", "ok", "ok"]
        report = json.loads((run / "report.json").read_text())
        assert report["summary"]["errors"] == 0 and report["header"]["superseded"] == 2


def test_refused_actions_and_limits(work: Path) -> None:
    """A refused (422) action is a failed tool call, not a crash; the step limit truncates."""
    run = work / "r"
    done = cli("eval", "run", "--pack", "palaestra/echo", "--split", "train", "--limit", "2",
               "--policy", "mypolicies:wrong_then_right", "--run-dir", str(run),
               "--data-dir", str(work / "d"), cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for a in lines(run):
        assert a["status"] == "ok" and a["reward"] == 1.0
        assert a["tool_calls"] == 2 and a["tool_errors"] == 1 and a["steps"] == 1
        assert "unknown tool" in a["trajectory"][0]["error"]
    report = json.loads((run / "report.json").read_text())
    assert report["process"]["tool_call_success"] == 0.5


def test_unknown_policy_and_missing_run_are_clear(work: Path) -> None:
    bad = cli("eval", "run", "--pack", "palaestra/echo", "--policy", "chat", cwd=work)
    assert bad.returncode == 2 and "--base-url" in bad.stderr and "Traceback" not in bad.stderr
    missing = cli("eval", "run", "--pack", "palaestra/echo", "--policy", "nosuchmodule:f",
                  "--data-dir", str(work / "d"), cwd=work)  # fmt: skip
    assert missing.returncode == 2 and "cannot import 'nosuchmodule'" in missing.stderr
    nothing = cli("eval", "resume", str(work / "nope"), cwd=work)
    assert nothing.returncode == 2 and "not a run directory" in nothing.stderr
    version = cli("eval", "run", "--pack", "palaestra/echo@9.9.9", "--data-dir",
                  str(work / "d"), cwd=work)  # fmt: skip
    assert version.returncode == 2 and "no version 9.9.9" in version.stderr
