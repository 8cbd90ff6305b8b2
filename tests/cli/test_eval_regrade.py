"""`palaestra eval regrade RUN --pack NAME@NEWVERSION -o NEWRUN` as a user runs it: a run
of a policy on version 1.0.0 of a tiny coding pack, then the run regraded against 1.1.0
(stricter on one task, more lenient on the other) from the final states the server kept,
with no policy: the flips both ways, the delta, a new run directory and its report."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cli_env, make_settings

from palaestra.server.config import REPO_PACKS
from palaestra.server.runtime import build_manager
from tests.server.test_regrade import INT_DOUBLE, PACK, SLOPPY_ADD, publish_both

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).parent / "palaestra")

POLICIES = textwrap.dedent(
    f"""
    SOLUTIONS = {{"add": {SLOPPY_ADD!r}, "double": {INT_DOUBLE!r}}}

    def sloppy(messages, tools):
        if any(m["role"] == "tool" for m in messages):
            return {{"tool": "submit", "arguments": {{}}}}
        name = "add" if "`add`" in messages[1]["content"] else "double"
        content = SOLUTIONS[name]
        return {{"tool": "write_file", "arguments": {{"path": "solution.py", "content": content}}}}
    """
)


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = cli_env(PYTHONPATH=str(cwd), PALAESTRA_PACKS_DIRS=str(REPO_PACKS / "echo"))
    return subprocess.run(
        [CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


async def test_a_run_regraded_against_a_newer_version(tmp_path: Path) -> None:
    (tmp_path / "mypolicies.py").write_text(POLICIES)
    data = tmp_path / "d"
    manager = build_manager(make_settings(data_dir=data, packs_dirs=[REPO_PACKS / "echo"]))
    await manager.start()
    try:
        await publish_both(manager, tmp_path / "packs")
    finally:
        await manager.shutdown()
    old, new = tmp_path / "runs" / "old", tmp_path / "runs" / "new"
    done = cli("eval", "run", "--pack", f"{PACK}@1.0.0", "--split", "train",
               "--policy", "mypolicies:sloppy", "--run-dir", str(old), "--data-dir", str(data),
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = {
        a["task"].rpartition(":")[2]: a
        for a in map(json.loads, (old / "attempts.jsonl").read_text().splitlines())
    }
    assert stored["add"]["reward"] == 1.0 and stored["double"]["reward"] == 0.0

    regraded = cli("eval", "regrade", str(old), "--pack", f"{PACK}@1.1.0", "-o", str(new),
                   "--data-dir", str(data), cwd=tmp_path)  # fmt: skip
    assert regraded.returncode == 0, regraded.stderr
    out = regraded.stdout
    assert "pass→fail 1, fail→pass 1" in out and "2 of 2 regraded attempts changed" in out
    assert "mean reward 0.500 → 0.500" in out
    result = json.loads((old / "regrade-1.1.0.json").read_text())
    assert result["from"] == f"{PACK}@1.0.0" and result["to"] == f"{PACK}@1.1.0"
    assert result["flips"] == {"pass_to_fail": 1, "fail_to_pass": 1}
    assert result["tasks"]["add"]["old_reward"] == 1.0
    assert result["tasks"]["add"]["new_reward"] == 0.0
    assert result["tasks"]["double"]["new_reward"] == 1.0 and result["delta"] == 0.0
    # The new run: the regraded attempts under 1.1.0, its report beside them.
    manifest = json.loads((new / "manifest.json").read_text())
    assert manifest["version"] == "1.1.0" and manifest["regraded_from"]["version"] == "1.0.0"
    assert all(t["id"].startswith(f"{PACK}@1.1.0:") for t in manifest["tasks"])
    report = json.loads((new / "report.json").read_text())
    assert report["header"]["grading"]["mode"] == "final_state"
    rewards = {a["task"].rpartition(":")[2]: a["reward"] for a in report["attempts"]}
    assert rewards == {"add": 0.0, "double": 1.0}
    assert all(a["regraded"]["graded"] == "final_state" for a in report["attempts"])
    # The policy never ran again: the old run is as it was.
    assert len((old / "attempts.jsonl").read_text().splitlines()) == 2
    # Another pack's name is refused before anything runs.
    other = cli("eval", "regrade", str(old), "--pack", "openai/humaneval", cwd=tmp_path)
    assert other.returncode == 2 and "not a version of the run's pack" in other.stderr
