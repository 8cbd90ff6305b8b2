"""`palaestra pack init|check|build|list`: write, prove, build and list task packs (DESIGN §6).

The check itself is server/packcheck.py; this module parses arguments and prints.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from palaestra.cli.console import console, err, error, styled
from palaestra.cli.heldout import heldout_app
from palaestra.cli.options import DataDir, Token, Url, judges_setting, sandbox_setting
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import Stop
from palaestra.sdk.errors import PalaestraError
from palaestra.server.families import FamilyRegistry
from palaestra.server.packcheck import CheckReport, check_pack
from palaestra.server.packs.archive import pack_archive
from palaestra.server.packs.loader import Pack, inspect_pack
from palaestra.server.packs.lock import LOCK_FILE, write_lock
from palaestra.server.packs.manifest import PackError, read_manifest

pack_app = typer.Typer(
    help="Write, check, build and list task packs (docs/writing-a-pack.md).",
    no_args_is_help=True,
)
pack_app.add_typer(heldout_app, name="heldout")  # pack heldout show|rotate (cli/heldout.py)


def _fmt(reward: float | None) -> str:
    return "-" if reward is None else f"{reward:.2f}"


def _verdict(report: CheckReport, task_id: str) -> Text:
    """pass, or the checks that failed; a void episode's reason after it."""
    failed = report.failed_checks(task_id)
    text = styled("pass", "green") if not failed else styled("fail", "red", f" {', '.join(failed)}")
    voids = report.results[task_id].void
    for label, reason in sorted(voids.items()):
        text.append("\n")
        text.append_text(styled("void", "yellow", f" {label}: {reason[:80]}"))
    return text


def _cheats(cheats: dict[str, float | None]) -> str:
    """Every cheat that scored above 0 or gave no verdict, with its reward; else the max."""
    shown = [f"{n} {_fmt(r)}" for n, r in sorted(cheats.items()) if r is None or r > 0]
    if shown:
        return ", ".join(shown)
    return f"all {len(cheats)} at 0.00" if cheats else "-"


def render_results(report: CheckReport, out: Console) -> None:
    """One row per task (oracle, rerun, null, the cheats that scored, verdict), each cheat's
    max and mean over the tasks, and the summary line (`--json` has every cheat's reward)."""
    if not report.results:
        return
    table = Table("task", "split", "oracle", "rerun", "null", "cheats", "verdict", title="per task")
    for task_id in sorted(report.results):
        r = report.results[task_id]
        table.add_row(
            task_id,
            r.split,
            _fmt(r.oracle),
            _fmt(r.rerun),
            _fmt(r.null),
            _cheats(r.cheats),
            _verdict(report, task_id),
        )
    out.print(table)
    for cheat, stats in report.cheat_summary().items():
        out.print(
            f"cheat {cheat}: max {stats['max']:.2f}, mean {stats['mean']:.3f} "
            f"over {stats['tasks']} task(s)"
        )
    out.print(report.summary_line())


def render_report(report: CheckReport, out: Console) -> None:
    name = report.pack or str(report.root)
    render_results(report, out)
    for note in report.notes:
        out.print(styled("note:", "dim", f" {note}"))
    reasons = report.allow_reasons
    for cheat, task_ids in sorted(report.allowed.items()):
        rest = f" {cheat} scored above the limit on {len(task_ids)} task(s) "
        out.print(styled("allowed cheat", "yellow", rest + f"({reasons.get(cheat, '')})"))
    if report.ok:
        rest = f" {name}: {report.checked}/{report.tasks} tasks checked, {report.episodes} "
        out.print(styled("ok", "green", rest + f"episodes, every check passed ({report.digest})"))
        return
    table = Table("where", "check", "problem (what to fix)", title=f"{name}: pack check failed")
    for p in report.problems:
        table.add_row(p.where, p.check, p.message)
    out.print(table)
    rest = f"; {report.checked}/{report.tasks} tasks checked, {report.episodes} episodes"
    out.print(styled(f"{len(report.problems)} problem(s)", "red", rest))


@pack_app.command("check")
def check_cmd(
    directory: Annotated[Path, typer.Argument(help="the pack directory")],
    limit: Annotated[
        int | None, typer.Option(help="check a fixed sample of N tasks (default: all)")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="tasks checked at once")] = 4,
    timeout: Annotated[
        float | None, typer.Option(help="per-episode timeout in s (default: [checks] timeout_s)")
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            callback=sandbox_setting, help="sandbox backend (setting `sandbox`): bwrap, docker, e2b"
        ),
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="also write the per-task rows, summary and problems as JSON here (-: stdout only)",
        ),
    ] = None,
    judge: Annotated[
        list[str] | None,
        typer.Option(
            "--judge",
            help="a judge endpoint for verifiers that ask one, NAME=URL,MODEL (repeatable; "
            "default: the `judges` setting)",
        ),
    ] = None,
) -> None:
    """Prove a pack: schema, lock, oracle ≥ expected, rerun identical, null 0, cheats ≤ 0.1."""
    import json

    with Stop("pack check") as stop, LiveProgress("pack check") as progress:
        report = stop.run(
            check_pack(
                directory,
                limit=limit,
                concurrency=concurrency,
                timeout_s=timeout,
                sandbox=sandbox,
                judges=judges_setting(judge),
                on_start=progress.start,
                on_task=lambda task: progress.advance(),
            )
        )
    if json_path == Path("-"):
        console.file.write(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        render_report(report, console)
    if json_path is not None and json_path != Path("-"):
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    if not report.ok:
        raise typer.Exit(1)


# -- build ---------------------------------------------------------------------------------------
def archive_name(pack: Pack) -> str:
    return f"{pack.name.replace('/', '-')}-{pack.version}.tar.gz"


def build_pack(root: Path, out: Path | None = None) -> tuple[Pack, Path, bytes]:
    """Refresh pack.lock, validate, write the archive; raises PackError listing the problems."""
    root = Path(root)
    read_manifest(root)  # a pack.toml that does not validate gets no lock
    write_lock(root)
    families = FamilyRegistry.discover()
    pack, problems = inspect_pack(root, families.all(), broken=families.unavailable())
    if pack is None or problems:
        raise PackError(problems)
    data = pack_archive(root)
    target = out or Path("dist") / archive_name(pack)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return pack, target, data


@pack_app.command("build")
def build_cmd(
    directory: Annotated[Path, typer.Argument(help="the pack directory")],
    out: Annotated[
        Path | None, typer.Option(help="archive path (default: dist/<org>-<name>-<version>.tar.gz)")
    ] = None,
) -> None:
    """Write (refresh) pack.lock, then a deterministic .tar.gz archive of the pack."""
    import hashlib

    try:
        pack, target, data = build_pack(directory, out)
    except PackError as exc:
        for problem in exc.problems:
            err.print(styled("problem", "red", f" {problem}"))
        raise typer.Exit(1) from None
    console.print(
        f"{pack.name}@{pack.version}: {len(pack.tasks)} tasks, digest {pack.digest}\n"
        f"wrote {directory / LOCK_FILE} and {target} "
        f"({len(data)} bytes, sha256:{hashlib.sha256(data).hexdigest()})"
    )


# -- list ----------------------------------------------------------------------------------------
@pack_app.command("list")
def list_cmd(
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """The packs a server has: version, tasks, domains, splits, digest."""
    from palaestra.cli.clients import open_client

    async def go() -> Table:
        table = Table("pack", "version", "tasks", "domains", "splits", "digest")
        async with open_client(url, token, data_dir, read_only=True) as client:
            for info in await client.packs():
                listing = await client.all_tasks(pack=f"{info.name}@{info.version}")
                domains = {t.domain for t in listing}
                splits = ", ".join(
                    f"{s.name} {s.tasks}" + (" (sealed)" if s.sealed else "") for s in info.splits
                )
                total = sum(s.tasks for s in info.splits)
                table.add_row(
                    info.name, info.version, str(total), str(len(domains)), splits, info.digest[:19]
                )
        return table

    try:
        console.print(asyncio.run(go()))
    except PalaestraError as exc:
        error(exc.message, exc.code)
        raise typer.Exit(2) from None


# -- init ----------------------------------------------------------------------------------------
@pack_app.command("init")
def init_cmd(
    directory: Annotated[Path, typer.Argument(help="a new (or empty) directory")],
    name: Annotated[str, typer.Option(help="org/name")],
    family: Annotated[str, typer.Option(help="the family of the example tasks")] = "echo",
    form: Annotated[
        str, typer.Option(help="directory | jsonl | generators (generators: echo only)")
    ] = "directory",
) -> None:
    """Write a pack scaffold with working example tasks; `pack check` passes on it at once."""
    from palaestra.cli.scaffold import ScaffoldError, scaffold

    try:
        written = scaffold(directory, name=name, family=family, form=form)
    except ScaffoldError as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"next: palaestra pack check {directory}")
