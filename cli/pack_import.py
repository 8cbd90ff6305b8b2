"""`palaestra pack import terminal-bench|harbor|finqa SRC OUT`: other task formats into a pack.

The importers live beside the family whose tasks they produce: envs/terminal/importer.py
(Terminal-Bench, Harbor) and envs/finance/importer.py (FinQA, TAT-QA).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from palaestra.cli.console import console, error, styled
from palaestra.cli.images import build_pack_environments
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import Stop
from palaestra.cli.unbuilt import CLASS_PATTERN, refuse_unbuilt
from palaestra.envs.finance.importer import ImportProblem, import_file
from palaestra.envs.terminal.baseimages import BaseImages
from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sdk.packwriter import REPORT_FILE, ImportReport
from palaestra.server.config import load_settings

import_app = typer.Typer(
    help="Import tasks from other formats into a pack (docs/terminal.md, docs/finance.md).",
    no_args_is_help=True,
)


# Skip reasons by class (the first that matches), for the summary line.
REASON_CLASSES = (
    ("environment does not build", CLASS_PATTERN),
    ("toolchain download newer than its stand-in", r"downloads .* newer than its local stand-in"),
    ("build-time download (build_hosts)", r"build_hosts"),
    ("missing test file", r"names the test file"),
    ("another Python minor", r"names python \d+\.\d+, which no local stand-in"),
    ("agent files through /shared", r"through /shared"),
    ("digest mismatch", r"digest"),
    ("seeded trajectory", r"trajectory\.json"),
    ("artifacts or verifier", r"artifact|separate verifier|verifier\.(collect|environment)"),
    ("another reward format", r"reward\.json"),
    ("host variables", r"from the host"),
    ("test-time installs (egress_allow)", r"install packages at test time"),
    ("crate or module dependencies", r"depends on crates|requires modules"),
    ("needs the network", r"network|downloads|https?://"),
    ("no stand-in for the base image", r"no local stand-in"),
    ("newer toolchain than its stand-in", r"its local stand-in has"),
    ("another base image", r"base image|multi-stage"),
    ("apt packages the sandbox lacks", r"apt packages"),
    ("services", r"service|daemon|expose|volume"),
    ("GPU/TPU", r"gpu|tpu"),
    ("needs root", r"needs root"),
    ("writes outside the workdir", r"outside"),
    ("binary file over a limit", r"max_pack_blobs?_bytes"),
    ("binary files", r"binary"),
    ("missing files", r"^no |cannot be read|not in the task"),
    ("not supported", r"not supported|os ="),
)


def reason_class(reason: str) -> str:
    """A skip reason's class (REASON_CLASSES), 'other' for the rest."""
    text = reason.lower()
    return next((name for name, pattern in REASON_CLASSES if re.search(pattern, text)), "other")


def skip_classes(report: ImportReport) -> Counter[str]:
    """Skipped tasks by reason class, each task counted once a class."""
    classes: Counter[str] = Counter()
    for reasons in report.skipped.values():
        classes.update({reason_class(r) for r in reasons})
    return classes


def import_summary(report: ImportReport) -> str:
    """'N imported, M skipped: k × class; …' (each skipped task counted once a class)."""
    classes = skip_classes(report)
    why = "; ".join(f"{n} × {c}" for c, n in sorted(classes.items(), key=lambda kv: -kv[1]))
    return f"{len(report.imported)} imported, {len(report.skipped)} skipped" + (
        f" ({why})" if why else ""
    )


def record_summary(report: ImportReport) -> None:
    """Add the summary line and the skip counts by class (`skipped_by_reason`) to the
    report file the importer wrote (OUT/import-report.json), so both give the same counts."""
    path = Path(report.out) / REPORT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the importer wrote none (nothing to add to)
    data["summary"] = import_summary(report)
    data["skipped_by_reason"] = dict(sorted(skip_classes(report).items(), key=lambda kv: -kv[1]))
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def render_import(report: ImportReport, out: Console, *, verbose: bool = False) -> None:
    """The summary line (also written into the report file); with `verbose`, first the table
    of every task and why."""
    record_summary(report)
    if verbose:
        table = Table("task", "result", "why / notes", title=f"{report.format} → {report.out}")
        for tid, notes in sorted(report.imported.items()):
            table.add_row(tid, styled("imported", "green"), "; ".join(notes))
        for tid, reasons in sorted(report.skipped.items()):
            table.add_row(tid, styled("skipped", "red"), "; ".join(reasons))
        out.print(table)
    out.print(import_summary(report))
    out.print(
        f"each task and why: {Path(report.out) / REPORT_FILE}"
        f"{'' if verbose else ' (or --verbose)'}; next: palaestra pack check {report.out}"
    )


Src = Annotated[Path, typer.Argument(help="a task folder, or a folder of task folders")]
Out = Annotated[Path, typer.Argument(help="the pack folder to write (new or empty)")]
Name = Annotated[str | None, typer.Option(help="pack name org/name (default imported/<src>)")]
Version = Annotated[str, typer.Option(help="pack version")]
Split = Annotated[
    str | None,
    typer.Option(help="the split every task goes to (default train; an exported task's own)"),
]
Force = Annotated[bool, typer.Option(help="replace OUT if it is not empty")]
Strict = Annotated[bool, typer.Option(help="exit 1 if any task was skipped")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="print every task and why")]
Build = Annotated[
    bool,
    typer.Option(
        help="then build the imported tasks' environment images (docker), as "
        "`palaestra images build --pack OUT` does; a task whose environment does not build "
        "is refused (exit 1 with --strict, or when no task is left)"
    ),
]


Check = Annotated[
    int,
    typer.Option(
        "--check",
        help="then audit N imported tasks (0: none) as `pack check` does: the family's cheats "
        "and the generic cheat library; exit 1 if any cheat scores above the pack's "
        "cheat_max_reward, naming the cheat, the task and the reward",
    ),
]


def audit_import(out: Path, tasks: int, sandbox: str | None = None) -> bool:
    """`pack check --limit tasks` on the imported pack: `pack check`'s table and problems,
    its JSON in `.palaestra-check.json` (a dotfile: not part of the pack); False where a
    cheat scores over the limit."""
    import json

    from palaestra.cli.pack import render_report
    from palaestra.server.packcheck import check_pack

    with Stop("pack import --check") as stop, LiveProgress("pack check") as progress:
        report = stop.run(
            check_pack(
                out,
                limit=tasks,
                sandbox=sandbox,
                on_start=progress.start,
                on_task=lambda task: progress.advance(),
            )
        )
    render_report(report, console)
    (out / ".palaestra-check.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    for over in report.over_limit:
        console.print(
            styled("cheat over the limit", "red", f" {over.cheat} scored {over.reward:.3f} "
                   f"on {over.task} (limit {over.limit:g})")
        )  # fmt: skip
    return not report.over_limit


def ceilings() -> Ceilings:
    """This machine's operator ceilings (palaestra.toml, PALAESTRA_*), which imports clamp to."""
    s = load_settings()
    return Ceilings(
        memory_mb=s.ceiling_memory_mb,
        cpus=s.ceiling_cpus,
        workspace_mb=s.ceiling_workspace_mb,
        task_timeout_s=s.ceiling_task_timeout_s,
        wall_s=s.ceiling_wall_s,
        egress_allow=tuple(s.egress_allow),
    )


def base_images() -> BaseImages:
    """How this machine's builds get base images and downloads (image_aliases,
    image_registry_mirror, build_hosts), which imports judge each task's Dockerfile by."""
    s = load_settings()
    return BaseImages(s.image_aliases, s.image_registry_mirror, tuple(s.build_hosts))


def _run(
    fmt: str, src: Path, out: Path, name: str | None, version: str, split: str | None,
    force: bool, strict: bool, verbose: bool = False, build: bool = False, check: int = 0,
) -> None:  # fmt: skip
    try:
        settings = load_settings()
        report = import_tasks(
            fmt, src, out, name=name, version=version, split=split, force=force,
            ceilings=ceilings(), max_blob_bytes=settings.max_pack_blob_bytes,
            max_blobs_bytes=settings.max_pack_blobs_bytes,
            bases=base_images(),
        )  # fmt: skip
    except ValueError as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    render_import(report, console, verbose=verbose)
    if not report.imported or (strict and report.skipped):
        raise typer.Exit(1)
    if build:
        results = build_pack_environments(out, command="pack import --build")
        if refuse_unbuilt(report, results, out):
            record_summary(report)  # the refusals, in the report file and its summary line
            console.print(f"after --build: {import_summary(report)}")
            if not report.imported or strict:
                raise typer.Exit(1)
        if any(r.status == "failed" and not r.tasks for r in results):
            raise typer.Exit(1)  # the pack's environments could not be listed (said above)
    if check and not audit_import(out, check):
        raise typer.Exit(1)


@import_app.command("terminal-bench")
def terminal_bench_cmd(
    src: Src,
    out: Out,
    name: Name = None,
    version: Version = "0.1.0",
    split: Split = None,
    force: Force = False,
    strict: Strict = False,
    verbose: Verbose = False,
    build: Build = False,
    check: Check = 0,
) -> None:
    """Convert Terminal-Bench task folders (task.yaml, Dockerfile, run-tests.sh, solution.sh,
    tests/) into a pack of `terminal` tasks; unsupported ones are reported with the reason."""
    _run("terminal-bench", src, out, name, version, split, force, strict, verbose, build, check)


@import_app.command("harbor")
def harbor_cmd(
    src: Src,
    out: Out,
    name: Name = None,
    version: Version = "0.1.0",
    split: Split = None,
    force: Force = False,
    strict: Strict = False,
    verbose: Verbose = False,
    build: Build = False,
    check: Check = 0,
) -> None:
    """Convert Harbor task folders (task.toml, instruction.md, environment/Dockerfile,
    tests/test.sh, solution/solve.sh; a dataset.toml's digests are checked) into a pack of
    `terminal` tasks; unsupported ones are reported with the reason."""
    _run("harbor", src, out, name, version, split, force, strict, verbose, build, check)


@import_app.command("finqa")
def finqa_cmd(
    source: Annotated[Path, typer.Argument(help="FinQA or TAT-QA JSON file")],
    out: Out,
    name: Annotated[str, typer.Option(help="pack name, org/name")] = "imported/finqa",
    split: Annotated[str, typer.Option(help="the split every question goes to")] = "train",
    force: Force = False,
    strict: Strict = False,
    verbose: Verbose = False,
    check: Check = 0,
) -> None:
    """Import FinQA/TAT-QA JSON (table, text, question, program or derivation) as a finance
    pack; each question that cannot be imported is reported with the reason."""
    try:
        report = import_file(source, out, name, split, force=force)
    except ImportProblem as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    render_import(report, console, verbose=verbose)
    if strict and report.skipped:
        raise typer.Exit(1)
    if check and report.imported and not audit_import(out, check):
        raise typer.Exit(1)
