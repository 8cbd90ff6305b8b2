"""The error exit of `palaestra eval` and how it opens a run directory (the consoles are
cli/console.py's)."""

from __future__ import annotations

from pathlib import Path

import typer

from palaestra.cli.console import error
from palaestra.sdk.evaluation.rundir import RunDir, RunError


def fail(message: str, code: int = 2) -> typer.Exit:
    error(message)
    return typer.Exit(code)


def open_run(path: Path) -> RunDir:
    """The run directory at `path`, or a clear error exit."""
    try:
        return RunDir.open(path)
    except RunError as exc:
        raise fail(str(exc)) from None
