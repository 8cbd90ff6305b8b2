"""Eval runs across held-out draws (server/draws.py, sdk/draw_compare.py): a run records the
draw it measured; `eval compare` of runs on two draws reports the difference of mean reward
with an unpaired bootstrap interval, which contains the true difference on synthetic data
and shows a policy that memorised draw 0 as a significant drop on draw 1."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
from conftest import HELDOUT_SECRET, cli_env

from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.report import build_report, compare
from palaestra.server.heldout import ensure_secret
from palaestra.server.packs.loader import load_pack
from tests.servers import ServerProcess, server_fixture

FIXTURE = Path(__file__).parent.parent / "fixtures" / "heldout-codes"
PACK = "tests/heldout-codes"
CLI = str(Path(sys.executable).parent / "palaestra")

server = server_fixture(packs={"heldout-codes": FIXTURE})

# A policy that knows the answers of the tasks it has seen (MEMO: item name -> code) and
# nothing else: what training on a leaked held-out set makes of a model.
POLICY = textwrap.dedent(
    """
    import json, os, re

    MEMO = json.loads(open(os.environ["MEMO_FILE"]).read())

    def memorised(messages, tools):
        name = re.search(r"item (\\w+)", messages[1]["content"]).group(1)
        return {"tool": "submit", "arguments": {"answer": MEMO.get(name, "?")}}
    """
)


def report(draw: int | None, rewards: list[float], domain: str = "codes/say") -> dict[str, Any]:
    """A run's report on `draw` with one attempt a task of these rewards."""
    attempts = [
        Attempt(
            task=f"{PACK}@1.0.0:codes-heldout-d{draw}-{i}",
            family="echo",
            domain=domain,
            difficulty="level-1",
            attempt=0,
            seed=0,
            reward=r,
            passed=r == 1.0,
            task_digest=f"sha256:{draw}-{i}",
        )
        for i, r in enumerate(rewards)
    ]
    header = {"pack": PACK, "version": "1.0.0", "pack_digest": "sha256:p", "split": "heldout"}
    return build_report(attempts, k=1, header={**header, "heldout_draw": draw, "policy": "p"})


def test_the_interval_contains_the_true_difference() -> None:
    """Coverage on synthetic draws: Bernoulli tasks at 0.7 on draw 0, 0.4 on draw 1."""
    covered, runs = 0, 40
    for trial in range(runs):
        rng = random.Random(trial)
        a = [float(rng.random() < 0.7) for _ in range(60)]
        b = [float(rng.random() < 0.4) for _ in range(60)]
        result = compare(report(0, a), report(1, b), samples=500, seed=trial)
        row = result["domains"]["all"]
        assert row["tasks_a"] == row["tasks_b"] == 60
        assert abs(row["delta"] - (sum(b) / 60 - sum(a) / 60)) < 1e-12
        covered += row["ci_low"] <= -0.3 <= row["ci_high"]
    assert covered >= 0.85 * runs, covered  # a 95% interval: ~38 of 40
    assert result["bootstrap"]["paired_by"] is None and result["draws"] == {"a": 0, "b": 1}


def test_a_run_made_before_draws_compares_across_draws() -> None:
    """A report without `heldout_draw` (made before runs recorded it) against a later draw:
    no task in common, so the unpaired comparison; with tasks in common, the paired one."""
    old = report(0, [1.0] * 30)
    old["header"].pop("heldout_draw")
    across = compare(old, report(1, [0.0, 1.0] * 15))
    assert across["draws"] == {"a": None, "b": 1} and across["drop"]
    same = compare(old, report(0, [1.0] * 30))
    assert same["bootstrap"]["paired_by"] == "task" and not same["drop"]


def test_no_difference_is_no_drop() -> None:
    rng = random.Random(7)
    same = compare(
        report(0, [float(rng.random() < 0.5) for _ in range(80)]),
        report(1, [float(rng.random() < 0.5) for _ in range(80)]),
    )
    assert not same["drop"] and not same["domains"]["all"]["drop"]
    seeded = compare(report(0, [1.0, 0.0] * 20), report(1, [0.0, 1.0, 0.0] * 10), seed=3)
    again = compare(report(0, [1.0, 0.0] * 20), report(1, [0.0, 1.0, 0.0] * 10), seed=3)
    assert seeded == again  # seeded: the same interval every time


def test_a_memorised_draw_shows_up_as_a_drop(server: ServerProcess, tmp_path: Path) -> None:
    made = httpx.post(f"{server.url}/v1/tokens", json={"scopes": ["eval"]}, headers=server.headers)
    assert made.status_code == 201, made.text
    env = cli_env(
        PYTHONPATH=str(tmp_path),
        MEMO_FILE=str(tmp_path / "memo.json"),
        PALAESTRA_TOKEN=made.json()["token"],
    )
    (tmp_path / "mypolicies.py").write_text(POLICY)
    # The policy memorised draw 0 (what the server's secret drew: the session's).
    drawn = load_pack(FIXTURE, ["echo"], secret=ensure_secret(HELDOUT_SECRET))
    memo = {
        re.search(r"item (\w+)", t.public["instruction"])[1]: t.private["answer"]  # type: ignore[index]
        for t in drawn.tasks.values()
        if t.split == "heldout"
    }
    (tmp_path / "memo.json").write_text(json.dumps(memo))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    def evaluate(run: Path) -> subprocess.CompletedProcess[str]:
        return cli("eval", "run", "--pack", PACK, "--split", "heldout", "--policy",
                   "mypolicies:memorised", "--run-dir", str(run), "--url", server.url)  # fmt: skip

    old, new = tmp_path / "draw0", tmp_path / "draw1"
    done = evaluate(old)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((old / "manifest.json").read_text())
    assert manifest["heldout_draw"] == 0
    attempts = [json.loads(x) for x in (old / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 12 and {a["draw"] for a in attempts} == {0}
    assert all(a["reward"] == 1.0 for a in attempts)  # it knows every answer of draw 0
    assert json.loads((old / "report.json").read_text())["header"]["heldout_draw"] == 0
    assert "held-out draw 0" in " ".join(done.stdout.split())
    assert "held-out draw" in (old / "report.html").read_text()

    rotated = cli(
        "pack", "heldout", "rotate", PACK, "--url", server.url, "--token", server.token or ""
    )
    assert rotated.returncode == 0, rotated.stderr

    # The old run cannot be resumed onto the new draw.
    (old / "attempts.jsonl").write_text("")
    resumed = cli("eval", "resume", str(old), "--url", server.url)
    assert resumed.returncode != 0 and "retired" in resumed.stderr
    (old / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))

    done = evaluate(new)
    assert done.returncode == 0, done.stderr
    assert json.loads((new / "manifest.json").read_text())["heldout_draw"] == 1
    fresh = [json.loads(x) for x in (new / "attempts.jsonl").read_text().splitlines()]
    assert {a["draw"] for a in fresh} == {1} and all(a["reward"] == 0.0 for a in fresh)

    out = tmp_path / "compare.json"
    compared = cli("eval", "compare", str(old), str(new), "--out", str(out))
    assert compared.returncode == 0, compared.stderr
    assert "significant drop" in compared.stdout and "held-out draw 0 (A) vs 1 (B)" in (
        " ".join(compared.stdout.split())
    )
    result = json.loads(out.read_text())
    row = result["domains"]["all"]
    assert result["drop"] and row["drop"] and row["significant"]
    assert row["delta"] == -1.0 and row["ci_high"] < 0
    assert result["draws"] == {"a": 0, "b": 1} and result["bootstrap"]["samples"] == 2000
