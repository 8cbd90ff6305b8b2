"""The report's statistics (pass@k with voids, breakdowns, process metrics, failure classes),
the comparison of two runs (bootstrap CIs, refusals), the HTML page's self-containment, and
the run directory's crash rules (torn last line, superseded lines)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.evaluation.rundir import RunDir, RunError, pending
from palaestra.sdk.models import TaskInfo
from palaestra.sdk.policies.prompts import parse_tool_call
from palaestra.sdk.policies.spec import parse_policy
from palaestra.sdk.report import CompareError, bootstrap_delta, build_report, compare
from palaestra.sdk.report_html import render_html

HEADER = {"pack": "o/p", "version": "1.0.0", "pack_digest": "sha256:p", "split": "heldout"}


def attempt(task: str, i: int, reward: float, **kw: Any) -> Attempt:
    domain = kw.pop("domain", "d/" + task[0])
    return Attempt(
        task=task,
        family=kw.pop("family", "fam"),
        domain=domain,
        difficulty=kw.pop("difficulty", "easy"),
        attempt=i,
        seed=i,
        reward=reward,
        passed=reward == 1.0,
        task_digest=f"sha256:{task}",
        **kw,
    )


def test_pass_at_k_breakdowns_and_voids() -> None:
    attempts = [
        # a1: 1 of 3 passed; a2: 3 of 3; b1: one void and two failures (n = 2 < k = 3)
        attempt("a1", 0, 1.0),
        attempt("a1", 1, 0.0),
        attempt("a1", 2, 0.5),
        *(attempt("a2", i, 1.0) for i in range(3)),
        attempt("b1", 0, 0.0, status="void", error_class="env_error", error="sandbox died"),
        attempt("b1", 1, 0.0, status="error", error_class="bad_model_output"),
        attempt("b1", 2, 0.0, stop="truncated"),
    ]
    report = build_report(attempts, k=3, header=HEADER)
    s = report["summary"]
    assert s["attempts"] == 9 and s["void"] == 1 and s["errors"] == 1 and s["scored"] == 8
    # the void is left out of the mean; the policy error counts as 0
    assert s["mean_reward"] == pytest.approx((1 + 0 + 0.5 + 3 + 0 + 0) / 8)
    # pass@1: a1 1/3, a2 1, b1 0/2 → mean; pass@3 only over tasks with ≥ 3 scored attempts
    assert s["pass_at_k"]["1"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert s["pass_at_k"]["2"] == pytest.approx((1 - 1 / 3 + 1 + 0) / 3)
    assert s["pass_at_k"]["3"] == pytest.approx((1 + 1) / 2)
    by_domain = report["by"]["domain"]
    assert set(by_domain) == {"d/a", "d/b"}
    assert by_domain["d/a"]["mean_reward"] == pytest.approx(4.5 / 6)
    assert by_domain["d/a"]["stderr"] > 0 and by_domain["d/b"]["void"] == 1
    assert report["reward_histogram"]["counts"] == [3, 0, 0, 0, 0, 1, 0, 0, 0, 4]
    failures = report["process"]["failure_classes"]
    assert failures == {
        "incorrect": 1,
        "partial": 1,
        "env_error": 1,
        "bad_model_output": 1,
        "step_limit": 1,
    }
    assert report["process"]["void_reasons"] == {"sandbox died": 1}
    assert report["header"]["task_digests"] == {t: f"sha256:{t}" for t in ("a1", "a2", "b1")}
    assert report["header"]["tasks_digest"].startswith("sha256:")


def test_process_metrics_use_the_servers_when_present() -> None:
    a = attempt("a1", 0, 1.0, steps=3, tool_calls=4, tool_errors=1, tokens_prompt=10)
    a.process = {"tool_calls": 4, "timed_out": 1, "output_bytes": 100, "tool_success_rate": 0.5}
    b = attempt("a1", 1, 1.0, steps=1, tool_calls=1, tokens_completion=5)
    b.process = {"tool_calls": 1, "timed_out": 0, "output_bytes": 20, "tool_success_rate": 1.0}
    b.phases = {"reset_s": 0.5, "policy_s": 1.5}
    p = build_report([a, b], k=2, header=HEADER)["process"]
    assert p["server"] == {
        "tool_calls": 5.0,
        "timed_out": 1.0,
        "output_bytes": 120.0,
        "tool_success_rate": 0.75,
    }
    assert p["tool_call_success"] == pytest.approx(1 - 1 / 5)
    assert p["steps"]["mean"] == 2.0 and p["steps_histogram"] == {"1": 1, "3": 1}
    assert p["tokens"]["total"]["total"] == 15.0
    assert p["phases"]["policy_s"]["mean"] == 0.75


def _report(rewards: dict[str, list[float]], **header: Any) -> dict[str, Any]:
    attempts = [attempt(t, i, r) for t, rs in rewards.items() for i, r in enumerate(rs)]
    return build_report(attempts, k=2, header={**HEADER, **header})


def test_compare_per_domain_bootstrap() -> None:
    a = _report({"a1": [0, 0], "a2": [0, 1], "a3": [1, 1], "b1": [1, 1], "b2": [0, 0]})
    b = _report({"a1": [1, 1], "a2": [1, 1], "a3": [1, 1], "b1": [1, 1], "b2": [0, 0]})
    result = compare(a, b, samples=500, seed=1)
    da, db, total = (result["domains"][k] for k in ("d/a", "d/b", "all"))
    assert da["delta"] == pytest.approx((1 + 0.5 + 0) / 3) and da["tasks"] == 3
    assert da["ci_low"] <= da["delta"] <= da["ci_high"] and da["ci_low"] >= 0
    assert db["delta"] == 0 and db["ci_low"] == db["ci_high"] == 0 and not db["significant"]
    assert total["tasks"] == 5
    assert compare(a, b, samples=500, seed=1) == result  # seeded: reproducible
    # a lone pair has no spread; identical runs give a zero delta
    assert bootstrap_delta([(0.0, 1.0)]) == (1.0, 1.0, 1.0)
    assert compare(a, a)["domains"]["all"]["delta"] == 0


def test_compare_refuses_different_packs_and_tasks() -> None:
    a = _report({"a1": [1, 0]})
    with pytest.raises(CompareError, match="different packs"):
        compare(a, _report({"a1": [1, 0]}, pack_digest="sha256:other"))
    changed = _report({"a1": [1, 0]})
    changed["header"]["task_digests"] = {"a1": "sha256:edited"}
    with pytest.raises(CompareError, match="different digests"):
        compare(a, changed)
    with pytest.raises(CompareError, match="different tasks"):
        compare(a, _report({"a1": [1, 0], "a2": [1, 1]}))
    with pytest.raises(CompareError, match="different splits"):
        compare(a, _report({"a1": [1, 0]}, split="dev"))


def test_html_is_self_contained_and_escaped() -> None:
    evil = attempt("a1", 0, 0.0, feedback="<script>alert(1)</script>")
    evil.trajectory = [
        {
            "index": 0,
            "action": {"tool": "submit", "arguments": {"answer": "</script><img src=x>"}},
            "observation": {"text": "<b>bold</b>", "images": 0},
            "terminated": True,
            "accepted": True,
        }
    ]
    page = render_html(build_report([evil, attempt("b1", 0, 1.0)], k=1, header=HEADER))
    assert page.count("<script>") == 1  # ours, inline, at the end
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x&gt;" in page
    # nothing is fetched: no src/href to anything, no external stylesheet or script
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<link" not in page and "@import" not in page
    assert page.count('class="trajectory"') == 2 and 'id="traj-1"' in page


def test_run_dir_torn_line_and_supersede(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "r", {"k": 2})
    with pytest.raises(RunError, match="already holds a run"):
        RunDir.create(tmp_path / "r", {"k": 2})
    first = attempt("a1", 0, 0.0, status="void", error_class="server_unreachable")
    run.append(first)
    run.append(attempt("a1", 1, 1.0))
    with open(run.attempts_path, "ab") as f:
        f.write(b'{"task": "a1", "attempt": 0, "rew')  # the crash hit mid-write
    assert len(run.records()) == 2  # the torn line is not read
    assert run.repair() > 0 and run.attempts_path.read_bytes().endswith(b"\n")
    tasks = [TaskInfo(id="a1", family="f", domain="d", split="s")]
    assert pending(tasks, 2, run.latest(), retry_void=True) == [(tasks[0], 0)]
    assert pending(tasks, 2, run.latest(), retry_void=False) == []
    run.append(attempt("a1", 0, 1.0))
    assert [a.status for a in run.records()] == ["void", "ok", "ok"]
    assert run.latest()[("a1", 0)].reward == 1.0  # the later line wins
    lines = run.attempts_path.read_text().splitlines()
    assert json.loads(lines[0])["error_class"] == "server_unreachable"  # kept, not rewritten
    with pytest.raises(RunError, match="not a run directory"):
        RunDir.open(tmp_path / "nothing")


def test_policy_specs_and_tool_call_parsing(tmp_path: Path) -> None:
    assert parse_policy("oracle").kind == "oracle"
    chat = parse_policy("http://127.0.0.1:9/v1", model="m", api_key_env="MY_KEY")
    assert chat.kind == "chat" and chat.label == "chat:m@http://127.0.0.1:9/v1"
    assert "MY_KEY" in chat.model_dump_json() and "sk-" not in chat.model_dump_json()
    with pytest.raises(ValueError, match="--model"):
        parse_policy("chat", base_url="http://x")
    with pytest.raises(ValueError, match="no transformers model"):
        parse_policy(f"hf:{tmp_path}")
    assert parse_policy("pkg.mod:make").kind == "python"
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policy("gpt-5")

    call = parse_tool_call('ok <tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>')
    assert call is not None and call.tool == "echo" and call.arguments == {"text": "x"}
    call = parse_tool_call('I will {"tool": "submit", "arguments": "{\\"answer\\": \\"y\\"}"} now')
    assert call is not None and call.tool == "submit" and call.arguments == {"answer": "y"}
    assert parse_tool_call("no call {here} at all") is None
