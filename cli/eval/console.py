"""The consoles of `palaestra eval` (tables on stdout, progress and messages on stderr) and
its error exit."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from palaestra.sdk.evaluation.rundir import RunDir, RunError

console = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)  # messages with paths stay on one line


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error[/red]: {message}")
    return typer.Exit(code)


def open_run(path: Path) -> RunDir:
    """The run directory at `path`, or a clear error exit."""
    try:
        return RunDir.open(path)
    except RunError as exc:
        raise fail(str(exc)) from None
