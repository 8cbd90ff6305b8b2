"""`pack check` reports per task: one row each (oracle, rerun, null, the cheats that scored,
the verdict: pass, or the failed checks and each void episode's reason), the summary line
"oracle a/n pass, null b/n zero, cheats c/n ≤ limit, void d", and the same in --json."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from palaestra.cli.pack import render_report
from palaestra.server.packs.check import CheckReport, Problem, TaskResult


def _report() -> CheckReport:
    report = CheckReport(root=Path("p"), pack="o/p@1", tasks=3, checked=3, cheat_max=0.1)
    report.allow_reasons = {"known": "documented"}
    report.results = {
        "good": TaskResult("good", "train", 1.0, 1.0, 0.0, {"print-pass": 0.0, "known": 0.9}),
        "leaky": TaskResult("leaky", "train", 1.0, 1.0, 0.0, {"print-pass": 0.5}),
        "broken": TaskResult(
            "broken",
            "heldout",
            None,
            None,
            None,
            {"print-pass": None},
            void={"oracle": "sandbox died: OOM"},
            expected=1.0,
        ),
    }
    report.problems = [
        Problem("leaky", "cheat:print-pass", "the known cheat scored 0.500"),
        Problem("broken", "oracle", "the oracle episode was void (sandbox died: OOM)"),
        Problem("broken", "null", "the null episode failed: timeout"),
    ]
    return report


def test_rows_verdicts_and_summary_line() -> None:
    report = _report()
    assert report.summary_line() == "oracle 2/3 pass, null 2/3 zero, cheats 1/3 ≤ 0.1, void 1"
    data = report.to_json()
    assert data["summary"]["line"] == report.summary_line()
    rows = {row["task"]: row for row in data["results"]}
    assert rows["good"]["verdict"] == "pass" and rows["good"]["failed"] == []
    assert rows["leaky"]["verdict"] == "fail" and rows["leaky"]["failed"] == ["cheat:print-pass"]
    assert rows["broken"]["failed"] == ["null", "oracle"]
    assert rows["broken"]["void"] == {"oracle": "sandbox died: OOM"}
    assert rows["leaky"]["cheats"] == {"print-pass": 0.5}

    console = Console(record=True, width=200)
    render_report(report, console)
    text = console.export_text()
    rows_text = text.split("pack check failed")[0]  # the per-task table, not the problems
    lines = {line.split("│")[1].strip(): line for line in rows_text.splitlines() if "│" in line}
    assert "pass" in lines["good"] and "known 0.90" in lines["good"]
    assert "fail cheat:print-pass" in lines["leaky"] and "print-pass 0.50" in lines["leaky"]
    assert "fail null, oracle" in lines["broken"]
    assert "void oracle: sandbox died: OOM" in text
    assert "oracle 2/3 pass, null 2/3 zero, cheats 1/3 ≤ 0.1, void 1" in text
