"""`palaestra pack export harbor PACK OUT`: a pack's terminal tasks as Harbor task folders.

The writer lives beside the family: envs/terminal/harbor/writer.py; this module loads the
pack (any of its forms), prints what was written and what was not, and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from palaestra.cli.console import console, err, error, styled
from palaestra.envs.terminal.harbor.writer import ExportError, export_tasks
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.loader import inspect_pack

export_app = typer.Typer(
    help="Write a pack's tasks in another format (docs/importing.md).", no_args_is_help=True
)


@export_app.command("harbor")
def harbor_cmd(
    pack_dir: Annotated[Path, typer.Argument(help="the pack directory")],
    out: Annotated[Path, typer.Argument(help="the folder of Harbor task folders to write")],
    force: Annotated[bool, typer.Option(help="replace OUT if it exists")] = False,
) -> None:
    """Write every terminal task of PACK as a Harbor task folder under OUT (task.toml,
    instruction.md, environment/Dockerfile, tests/test.sh, solution/) and OUT/dataset.toml
    with each task's content digest; a task that cannot be written is named with the reason."""
    pack, problems = inspect_pack(pack_dir, FamilyRegistry.discover().all())
    if pack is None:
        for problem in problems:
            err.print(styled("problem", "red", f" {problem}"))
        raise typer.Exit(2)
    for problem in problems:
        err.print(styled("not loaded", "yellow", f" {problem}"))
    tasks = [t for t in pack.tasks.values() if t.family == "terminal"]
    others = sorted(t.id for t in pack.tasks.values() if t.family != "terminal")
    try:
        report = export_tasks(tasks, out, pack=pack.name, version=pack.version, force=force)
    except ExportError as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    for tid in others:
        report.skipped[tid] = ["not a terminal task: Harbor folders hold terminal tasks"]
    for tid, reasons in sorted(report.skipped.items()):
        console.print(styled("skipped", "red", f" {tid}: {'; '.join(reasons)}"))
    console.print(
        f"{len(report.exported)} exported, {len(report.skipped)} skipped → {out} "
        "(dataset.toml pins each task's digest)"
    )
    if not report.exported:
        raise typer.Exit(1)
