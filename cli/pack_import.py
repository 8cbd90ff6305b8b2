"""`palaestra pack import terminal-bench|harbor|finqa SRC OUT`: other task formats into a pack.

The importers live beside the family whose tasks they produce: envs/terminal/importer.py
(Terminal-Bench, Harbor) and envs/finance/importer.py (FinQA, TAT-QA).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from palaestra.envs.finance.importer import ImportProblem, import_file
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sdk.packwriter import REPORT_FILE, ImportReport

import_app = typer.Typer(
    help="Import tasks from other formats into a pack (docs/terminal.md, docs/finance.md).",
    no_args_is_help=True,
)
console = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True)


def render_import(report: ImportReport, out: Console) -> None:
    table = Table("task", "result", "why / notes", title=f"{report.format} → {report.out}")
    for tid, notes in sorted(report.imported.items()):
        table.add_row(escape(tid), "[green]imported[/green]", escape("; ".join(notes)))
    for tid, reasons in sorted(report.skipped.items()):
        table.add_row(escape(tid), "[red]skipped[/red]", escape("; ".join(reasons)))
    out.print(table)
    out.print(
        f"{len(report.imported)} imported, {len(report.skipped)} skipped (reasons above and in "
        f"{Path(report.out) / REPORT_FILE}); next: palaestra pack check {report.out}"
    )


Src = Annotated[Path, typer.Argument(help="a task folder, or a folder of task folders")]
Out = Annotated[Path, typer.Argument(help="the pack folder to write (new or empty)")]
Name = Annotated[str | None, typer.Option(help="pack name org/name (default imported/<src>)")]
Version = Annotated[str, typer.Option(help="pack version")]
Split = Annotated[str, typer.Option(help="the split every task goes to")]
Force = Annotated[bool, typer.Option(help="replace OUT if it is not empty")]
Strict = Annotated[bool, typer.Option(help="exit 1 if any task was skipped")]


def _run(
    fmt: str, src: Path, out: Path, name: str | None, version: str, split: str, force: bool,
    strict: bool,
) -> None:  # fmt: skip
    try:
        report = import_tasks(fmt, src, out, name=name, version=version, split=split, force=force)
    except ValueError as exc:
        err.print(f"[red]error[/red]: {escape(str(exc))}")
        raise typer.Exit(2) from None
    render_import(report, console)
    if not report.imported or (strict and report.skipped):
        raise typer.Exit(1)


@import_app.command("terminal-bench")
def terminal_bench_cmd(
    src: Src,
    out: Out,
    name: Name = None,
    version: Version = "0.1.0",
    split: Split = "train",
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Convert Terminal-Bench task folders (task.yaml, Dockerfile, run-tests.sh, solution.sh,
    tests/) into a pack of `terminal` tasks; unsupported ones are reported with the reason."""
    _run("terminal-bench", src, out, name, version, split, force, strict)


@import_app.command("harbor")
def harbor_cmd(
    src: Src,
    out: Out,
    name: Name = None,
    version: Version = "0.1.0",
    split: Split = "train",
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Convert Harbor task folders (task.toml, instruction.md, environment/Dockerfile,
    tests/test.sh, solution/solve.sh) into a pack of `terminal` tasks; unsupported ones are
    reported with the reason."""
    _run("harbor", src, out, name, version, split, force, strict)


@import_app.command("finqa")
def finqa_cmd(
    source: Annotated[Path, typer.Argument(help="FinQA or TAT-QA JSON file")],
    out: Out,
    name: Annotated[str, typer.Option(help="pack name, org/name")] = "imported/finqa",
    split: Split = "train",
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Import FinQA/TAT-QA JSON (table, text, question, program or derivation) as a finance
    pack; each question that cannot be imported is reported with the reason."""
    try:
        report = import_file(source, out, name, split, force=force)
    except ImportProblem as exc:
        err.print(f"[red]error[/red]: {escape(str(exc))}")
        raise typer.Exit(2) from None
    render_import(report, console)
    if strict and report.skipped:
        raise typer.Exit(1)
