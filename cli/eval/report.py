"""A run's report from `palaestra eval`: report.json and report.html written into the run
directory, the table printed; a report loaded back for `eval compare`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

import palaestra
from palaestra.cli.console import console, styled
from palaestra.cli.eval.console import fail, open_run
from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.evaluation.rundir import RunDir
from palaestra.sdk.policies.spec import PolicySpec
from palaestra.sdk.report import build_report
from palaestra.sdk.report_html import render_html


def report_header(manifest: dict[str, Any], store: RunDir) -> dict[str, Any]:
    spec = PolicySpec.model_validate(manifest["policy"])
    records = store.records()
    return {
        "run_id": manifest.get("run_id"),
        "pack": manifest["pack"],
        "version": manifest["version"],
        "pack_digest": manifest["pack_digest"],
        "split": manifest["split"],
        "heldout_draw": manifest.get("heldout_draw"),  # a rotated sealed split's draw
        "policy": spec.label,
        "policy_spec": spec.model_dump(mode="json"),
        "sampling": {
            "temperature": spec.temperature,
            "max_tokens_per_call": spec.max_tokens,
            "seed": spec.seed,
        },
        "seeds": manifest["seeds"],
        "limits": manifest["limits"],
        "server": manifest["server"],
        "server_version": manifest.get("server_version", "unknown"),
        "palaestra_version": palaestra.__version__,
        "max_steps": manifest["limits"]["max_steps"],
        "run_status": manifest.get("status"),
        "sessions": len(manifest.get("sessions", [])),
        "superseded": len(records) - len({a.key for a in records}),
        "planned_attempts": len(manifest["tasks"]) * int(manifest["k"]),
    }


def write_report(
    store: RunDir,
    *,
    out: Path | None,
    attempts: list[Attempt] | None = None,
    grading: dict[str, Any] | None = None,
) -> None:
    """Write report.json and report.html into the run directory; print the table."""
    manifest = store.manifest()
    chosen = attempts if attempts is not None else list(store.latest().values())
    header = report_header(manifest, store)
    header["grading"] = grading or {
        "mode": "stored",
        "note": "from the verdicts recorded during the run",
    }
    built = build_report(chosen, k=int(manifest["k"]), header=header)
    (store.path / "report.json").write_text(json.dumps(built, indent=1))
    page = store.path / "report.html"
    page.write_text(render_html(built))
    print_report(built)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(built, indent=1))
        console.print(f"report written to {out}")
    missing = header["planned_attempts"] - len(chosen)
    console.print(f"run: {store.path}")
    console.print(f"report: {store.path / 'report.json'} and {page}")
    if missing:
        rest = f": `palaestra eval resume {store.path}`"
        console.print(styled(f"{missing} attempt(s) have no result yet", "yellow", rest))
    if built["summary"]["attempts"] == 0:
        raise typer.Exit(1)


def load_report(path: Path) -> dict[str, Any]:
    """A run directory's report (rebuilt from stored verdicts if it has none), or a report file."""
    if path.is_file():
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        except (OSError, json.JSONDecodeError) as exc:
            raise fail(f"{path} is not a report: {exc}") from None
    store = open_run(path)
    saved = store.path / "report.json"
    if saved.is_file() and saved.stat().st_mtime >= store.attempts_path.stat().st_mtime:
        loaded: dict[str, Any] = json.loads(saved.read_text())
        return loaded
    manifest = store.manifest()
    header = report_header(manifest, store)
    return build_report(list(store.latest().values()), k=int(manifest["k"]), header=header)


def _draw(header: dict[str, Any]) -> str:
    """The title's note of a run on a rotated sealed split (server/draws.py)."""
    draw = header.get("heldout_draw")
    return "" if draw is None else f", held-out draw {draw}"


def print_report(report: dict[str, Any]) -> None:
    h = report["header"]
    k = int(h["k"])
    passes = ["pass@1"] + ([f"pass@{k}"] if k > 1 else [])
    table = Table(
        "domain",
        "tasks",
        "attempts",
        "mean reward",
        "passed",
        *passes,
        "void",
        "errors",
        "hack-flagged",
        title=f"{h['policy']} on {h['pack']}@{h['version']} ({h['split']}{_draw(h)})",
    )
    rows = [*report["by"]["domain"].items(), ("all", report["summary"])]
    hacks = report.get("hacks") or {}
    flagged = {**(hacks.get("domains") or {}), "all": hacks}
    for name, s in rows:
        h = flagged.get(name) or {}
        table.add_row(
            name,
            str(s["tasks"]),
            str(s["attempts"]),
            f"{s['mean_reward']:.3f} ± {s['stderr']:.3f}",
            str(s["passed"]),
            *(f"{s['pass_at_k'].get(p.removeprefix('pass@'), 0):.3f}" for p in passes),
            str(s["void"]),
            str(s["errors"]),
            f"{h.get('flagged', 0)} ({h.get('flagged_share', 0.0):.0%})",
        )
    console.print(table)
    if hacks.get("flagged"):
        counts = ", ".join(f"{rule} {n}" for rule, n in hacks["rules"].items())
        console.print(styled("hack monitor: ", "yellow", f"flagged attempts by rule: {counts}"))
    failures = report["process"]["failure_classes"]
    if failures:
        console.print(
            "failure classes: " + ", ".join(f"{name} {n}" for name, n in failures.items())
        )
