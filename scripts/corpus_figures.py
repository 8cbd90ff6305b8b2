"""The issue-17 figures for one folder of Terminal-Bench or Harbor tasks, on a sandbox backend.

    .venv/bin/python scripts/corpus_figures.py harbor tests/fixtures/terminal-bench-2 \
        [--sandbox docker] [--out DIR] [--json FILE]

Imports the folder (a fresh pack under --out, default a temp dir), builds every task
environment (`palaestra images build --pack`), runs `pack check` and prints: tasks,
imported, environments built (of the imported tasks, those whose environment image built or
that need none), oracle pass, null 0, cheats <= 0.1, void -- with the cause of every failure
class (import skip reasons, build causes, the check's problems), one line per task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from palaestra.cli import envimages
from palaestra.cli.images import docker_client, ensure_image
from palaestra.cli.pack_import import base_images, ceilings
from palaestra.envs.terminal.importer import import_tasks
from palaestra.server.config import load_settings
from palaestra.server.packcheck import check_pack

CHEAT_FLOOR = 0.1


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:160] if text.strip() else ""


def _error_line(log: str) -> str:
    """The line of a build cause that says what went wrong (else its last line)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    said = [ln for ln in lines if re.search(r"error|not found|could not|denied|timeout", ln, re.I)]
    return (said or lines or [""])[0][:160]


def figures(fmt: str, src: Path, out: Path, sandbox: str) -> dict[str, Any]:
    settings = load_settings()
    report = import_tasks(fmt, src, out, force=True, ceilings=ceilings(), bases=base_images())
    client = docker_client()
    builds = envimages.build_pack(out, settings, lambda name: ensure_image(client, name))
    failed_env = {t: r.cause for r in builds if r.status == "failed" for t in r.tasks}
    check = asyncio.run(check_pack(out, sandbox=sandbox, concurrency=2))
    rows: dict[str, dict[str, Any]] = {}
    for tid, reasons in report.skipped.items():
        rows[tid] = {"stage": "import", "cause": "; ".join(reasons)}
    problems: dict[str, list[str]] = {}
    for p in check.problems:
        problems.setdefault(p.where.split(":")[0], []).append(f"{p.check}: {p.message}")
    for tid in report.imported:
        result = check.results.get(tid)
        row: dict[str, Any] = {"stage": "check", "env_built": tid not in failed_env}
        if tid in failed_env:
            row.update(stage="build", cause=failed_env[tid])
        if result is not None:
            cheats = [r for r in result.cheats.values() if r is not None]
            row.update(
                oracle=result.oracle,
                null=result.null,
                cheat_max=max(cheats, default=None),
                void=result.void,
            )
        row["problems"] = problems.get(tid, [])
        rows[tid] = row
    done = [r for r in rows.values() if r["stage"] != "import"]
    built = [r for r in done if r.get("env_built")]
    return {
        "source": str(src),
        "format": fmt,
        "sandbox": sandbox,
        "tasks": len(rows),
        "imported": len(report.imported),
        "environments_built": len(built),
        "oracle_pass": sum(r.get("oracle") == 1.0 for r in built),
        "null_0": sum(r.get("null") == 0.0 for r in built),
        "cheats_le_0.1": sum(
            r.get("cheat_max") is not None and r["cheat_max"] <= CHEAT_FLOOR for r in built
        ),
        "void": sum(bool(r.get("void")) for r in built),
        "builds": [b.as_json() for b in builds],
        "rows": rows,
    }


def render(fig: dict[str, Any]) -> None:
    keys = ("tasks", "imported", "environments_built", "oracle_pass", "null_0", "cheats_le_0.1")
    print(f"{fig['source']} ({fig['format']}, {fig['sandbox']}):")
    print("  " + ", ".join(f"{k.replace('_', ' ')} {fig[k]}" for k in (*keys, "void")))
    causes: Counter[str] = Counter()
    for tid, row in sorted(fig["rows"].items()):
        if row["stage"] == "import":
            cause = f"import: {_first_line(row['cause'])}"
        elif row["stage"] == "build":
            cause = f"build: {_error_line(row['cause'])}"
        elif row["problems"]:
            cause = _first_line(row["problems"][0])
        else:
            cause = "ok"
        causes[cause.split(" (")[0][:90]] += 1
        extra = (
            f" oracle={row.get('oracle')} null={row.get('null')} cheat_max={row.get('cheat_max')}"
            if row["stage"] == "check"
            else ""
        )
        print(f"  {tid}: {cause}{extra}")
    print("  failure classes:")
    for cause, n in causes.most_common():
        print(f"    {n} × {cause}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=("terminal-bench", "harbor"))
    parser.add_argument("src", type=Path)
    parser.add_argument("--sandbox", default="docker")
    parser.add_argument("--out", type=Path, help="the pack folder to write (default: temp)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="palaestra-figures-") as tmp:
        out = args.out or Path(tmp) / "pack"
        fig = figures(args.format, args.src, out, args.sandbox)
    render(fig)
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
