"""`palaestra eval`: run a policy on a split into a run directory, resume it, report, compare.

    palaestra eval run --pack ORG/NAME@VER --split heldout --policy POLICY -k K --concurrency N
    palaestra eval resume RUN
    palaestra eval report RUN          # regrades from stored trajectories where it can
    palaestra eval compare RUN_A RUN_B

`palaestra eval --pack …` (no subcommand) is the first version's form: the same as `run`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

import palaestra
from palaestra.cli.clients import open_client
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation import (
    Attempt,
    AttemptLimits,
    RunDir,
    RunError,
    ServerGone,
    pending,
    regrade,
    run_suite,
)
from palaestra.sdk.models import PackInfo, TaskInfo
from palaestra.sdk.policies import (
    Policy,
    PolicyError,
    PolicySpec,
    build_policy,
    parse_policy,
)
from palaestra.sdk.report import CompareError, build_report, compare
from palaestra.sdk.report_html import render_html

eval_app = typer.Typer(
    help="Evaluate a policy on a split (k attempts a task) into a resumable run directory; "
    "report it as JSON and HTML; compare two runs. Without a subcommand, the options below "
    "run `eval run` (the first version's form).",
    no_args_is_help=False,
    invoke_without_command=True,
)
console = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)  # messages with paths stay on one line

Url = Annotated[
    str | None,
    typer.Option(envvar="PALAESTRA_URL", help="server URL; without it an embedded server runs"),
]
Token = Annotated[str | None, typer.Option(envvar="PALAESTRA_TOKEN", help="bearer token")]
DataDir = Annotated[Path | None, typer.Option(help="data dir of the embedded server")]
PackOpt = Annotated[str | None, typer.Option(help="org/name[@version]")]
SplitOpt = Annotated[str, typer.Option(help="split to evaluate")]
PolicyOpt = Annotated[
    str,
    typer.Option(
        help="oracle | null | chat (with --base-url, --model) | an OpenAI-compatible base URL "
        "| hf:MODEL_DIR (local transformers model) | module:callable"
    ),
]
KOpt = Annotated[int, typer.Option("-k", help="attempts per task (seeds 0..k-1)", min=1)]
ConcOpt = Annotated[int, typer.Option(help="episodes at once", min=1)]
StepsOpt = Annotated[int, typer.Option(help="steps per attempt", min=1)]
TokensOpt = Annotated[int, typer.Option(help="tokens per attempt (0: no limit)", min=0)]
WallOpt = Annotated[float, typer.Option(help="wall time per attempt (s)", min=0.1)]
LimitOpt = Annotated[int | None, typer.Option(help="only the first N tasks")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="chat policy: OpenAI-compatible URL")]
ModelOpt = Annotated[str | None, typer.Option(help="chat policy: model name")]
KeyEnvOpt = Annotated[str, typer.Option(help="chat policy: env var holding the key")]
TempOpt = Annotated[float, typer.Option(help="sampling temperature (models)")]
CallTokOpt = Annotated[int, typer.Option(help="max tokens per model call")]
SeedOpt = Annotated[int, typer.Option(help="policy sampling seed (added to the attempt's)")]
RunDirOpt = Annotated[Path | None, typer.Option(help="run directory (default runs/<run-id>)")]
RunsOpt = Annotated[Path, typer.Option(help="where new run directories go")]
OutOpt = Annotated[Path | None, typer.Option(help="also write the JSON report here")]
PatienceOpt = Annotated[
    float, typer.Option(help="wait this long (s) for an unreachable server before stopping")
]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60]


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error[/red]: {message}")
    return typer.Exit(code)


@eval_app.callback()
def eval_default(
    ctx: typer.Context,
    pack: PackOpt = None,
    split: SplitOpt = "heldout",
    policy: PolicyOpt = "oracle",
    k: KOpt = 1,
    concurrency: ConcOpt = 4,
    max_steps: StepsOpt = 30,
    limit: LimitOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key_env: KeyEnvOpt = "OPENAI_API_KEY",
    out: OutOpt = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Without a subcommand: `eval run` with these options (the first version's form)."""
    if ctx.invoked_subcommand is not None:
        return
    if pack is None:
        console.print(ctx.get_help())
        raise typer.Exit(0)
    run(
        pack=pack,
        split=split,
        policy=policy,
        k=k,
        concurrency=concurrency,
        max_steps=max_steps,
        limit=limit,
        base_url=base_url,
        model=model,
        api_key_env=api_key_env,
        out=out,
        url=url,
        token=token,
        data_dir=data_dir,
    )


@eval_app.command()
def run(
    pack: Annotated[str, typer.Option(help="org/name[@version]")],
    split: SplitOpt = "heldout",
    policy: PolicyOpt = "oracle",
    k: KOpt = 1,
    concurrency: ConcOpt = 4,
    max_steps: StepsOpt = 30,
    max_tokens: TokensOpt = 0,
    max_wall_s: WallOpt = 600.0,
    limit: LimitOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key_env: KeyEnvOpt = "OPENAI_API_KEY",
    temperature: TempOpt = 0.0,
    max_call_tokens: CallTokOpt = 1024,
    seed: SeedOpt = 0,
    run_dir: RunDirOpt = None,
    runs_dir: RunsOpt = Path("runs"),
    out: OutOpt = None,
    server_patience_s: PatienceOpt = 60.0,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Evaluate a policy: k attempts a task, stored attempt by attempt; then the report."""
    try:
        spec = parse_policy(
            policy,
            base_url=base_url,
            model=model,
            api_key_env=api_key_env,
            temperature=temperature,
            max_tokens=max_call_tokens,
            seed=seed,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from None
    live = _build(spec)
    limits = AttemptLimits(max_steps=max_steps, max_tokens=max_tokens, max_wall_s=max_wall_s)

    async def go() -> Path:
        async with open_client(url, token, data_dir) as client:
            info = await _find_pack(client, pack)
            ref = f"{info.name}@{info.version}"
            everything = await _all_tasks(client, ref, split)
            chosen = everything[:limit] if limit else everything
            if not chosen:
                splits = ", ".join(s.name for s in info.splits) or "none"
                raise PalaestraError(
                    f"pack {info.name}@{info.version} has no tasks in split {split!r} "
                    f"(its splits: {splits})",
                    code="no_tasks",
                )
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
            run_id = _slug(f"{info.name}-{split}-{spec.label.split('@')[0]}-{stamp}")
            path = run_dir or runs_dir / run_id
            manifest = {
                "run_id": run_id,
                "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
                "pack": info.name,
                "version": info.version,
                "pack_digest": info.digest,
                "split": split,
                "tasks": [t.model_dump(mode="json") for t in chosen],
                "k": k,
                "seeds": list(range(k)),
                "policy": spec.model_dump(mode="json"),
                "limits": _limits_json(limits),
                "concurrency": concurrency,
                "server": url or "embedded",
                "data_dir": str(data_dir.resolve()) if data_dir else None,
                "server_version": await _server_version(url),
                "palaestra_version": palaestra.__version__,
                "status": "running",
                "sessions": [],
            }
            try:
                store = RunDir.create(path, manifest)
            except RunError as exc:
                raise _fail(str(exc)) from None
            err.print(f"run directory: {path}")
            await _execute(client, live, store, chosen, k, concurrency, limits, server_patience_s)
            return path

    path = _run_async(go())
    _finish(RunDir.open(path), out=out)


@eval_app.command()
def resume(
    run_path: Annotated[Path, typer.Argument(metavar="RUN", help="a run directory")],
    retry_void: Annotated[
        bool, typer.Option(help="rerun attempts that ended void (infrastructure faults)")
    ] = True,
    retry_errors: Annotated[
        bool,
        typer.Option(help="rerun attempts the policy failed (e.g. its endpoint was down)"),
    ] = False,
    concurrency: Annotated[int | None, typer.Option(help="episodes at once", min=1)] = None,
    server_patience_s: PatienceOpt = 60.0,
    out: OutOpt = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Continue a run after a crash or Ctrl-C: only the attempts without a result run
    (and, unless --no-retry-void, the void ones); nothing finished is recomputed."""
    store = _open(run_path)
    manifest = store.manifest()
    spec = PolicySpec.model_validate(manifest["policy"])
    live = _build(spec)
    tasks = [TaskInfo.model_validate(t) for t in manifest["tasks"]]
    k = int(manifest["k"])
    limits = AttemptLimits(**manifest["limits"])
    target_url = url or (None if manifest["server"] == "embedded" else manifest["server"])
    target_dir = data_dir or (Path(manifest["data_dir"]) if manifest.get("data_dir") else None)
    todo = pending(tasks, k, store.latest(), retry_void=retry_void, retry_errors=retry_errors)
    if not todo:
        err.print(f"{run_path}: every attempt has a result; nothing to resume")
        _finish(store, out=out)
        return

    async def go() -> None:
        async with open_client(target_url, token, target_dir) as client:
            info = await _find_pack(client, f"{manifest['pack']}@{manifest['version']}")
            if info.digest != manifest["pack_digest"]:
                raise _fail(
                    f"the server's {info.name}@{info.version} has digest {info.digest}, but the "
                    f"run was made on {manifest['pack_digest']}: refusing to mix them"
                )
            err.print(f"resuming {run_path}: {len(todo)} attempt(s) to run")
            await _execute(
                client,
                live,
                store,
                tasks,
                k,
                concurrency or int(manifest.get("concurrency", 4)),
                limits,
                server_patience_s,
                retry_void=retry_void,
                retry_errors=retry_errors,
            )

    _run_async(go())
    _finish(store, out=out)


@eval_app.command()
def report(
    run_path: Annotated[Path, typer.Argument(metavar="RUN", help="a run directory")],
    regrade_: Annotated[
        bool,
        typer.Option(
            "--regrade/--no-regrade",
            help="regrade by replaying stored trajectories on the server (else: stored verdicts)",
        ),
    ] = True,
    concurrency: Annotated[int, typer.Option(help="replays at once", min=1)] = 4,
    out: OutOpt = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Rebuild the report (JSON + HTML) of a run, regrading where the verifier allows it."""
    store = _open(run_path)
    manifest = store.manifest()
    attempts = list(store.latest().values())
    grading: dict[str, Any] = {
        "mode": "stored",
        "note": "rebuilt from the stored verdicts of the run (--no-regrade)",
    }
    if regrade_ and attempts:
        target_url = url or (None if manifest["server"] == "embedded" else manifest["server"])
        target_dir = data_dir or (Path(manifest["data_dir"]) if manifest.get("data_dir") else None)
        try:
            attempts, grading = _run_async(
                _regrade(target_url, token, target_dir, manifest, attempts, concurrency),
                exit_on_error=False,
            )
        except (PalaestraError, OSError) as exc:
            message = getattr(exc, "message", str(exc))
            err.print(
                f"[yellow]cannot regrade[/yellow] ({message}); the report is rebuilt from the "
                "stored verdicts"
            )
            grading = {
                "mode": "stored",
                "note": "rebuilt from the stored verdicts: the server could not regrade "
                f"({message})",
            }
    _finish(store, out=out, attempts=attempts, grading=grading)
    err.print(f"grading: {grading['note']}")


async def _regrade(
    url: str | None,
    token: str | None,
    data_dir: Path | None,
    manifest: dict[str, Any],
    attempts: list[Attempt],
    concurrency: int,
) -> tuple[list[Attempt], dict[str, Any]]:
    async with open_client(url, token, data_dir) as client:
        info = await _find_pack(client, f"{manifest['pack']}@{manifest['version']}")
        if info.digest != manifest["pack_digest"]:
            raise PalaestraError(
                f"the server's pack digest {info.digest} is not the run's "
                f"{manifest['pack_digest']}",
                code="digest_mismatch",
            )
        with _progress(stats=False) as progress:
            bar = progress.add_task("regrading by replay", total=len(attempts))
            return await regrade(
                client,
                attempts,
                concurrency=concurrency,
                on_attempt=lambda a, o: progress.update(bar, advance=1),
            )


@eval_app.command("compare")
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(metavar="RUN_A", help="run directory or report JSON")],
    run_b: Annotated[Path, typer.Argument(metavar="RUN_B", help="run directory or report JSON")],
    samples: Annotated[int, typer.Option(help="bootstrap resamples", min=100)] = 2000,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
    out: OutOpt = None,
) -> None:
    """Per-domain deltas of mean reward (B − A) with 95% bootstrap CIs (paired by task)."""
    a, b = _load_report(run_a), _load_report(run_b)
    try:
        result = compare(a, b, samples=samples, seed=seed)
    except CompareError as exc:
        raise _fail(f"cannot compare {run_a} and {run_b}: {exc}") from None
    table = Table(
        "domain",
        "tasks",
        "A",
        "B",
        "Δ (B − A)",
        "95% CI",
        "",
        title=f"{result['b']['policy']} (B) vs {result['a']['policy']} (A) on "
        f"{result['a']['pack']}@{result['a']['version']} ({result['a']['split']})",
    )
    for name, row in result["domains"].items():
        table.add_row(
            name,
            str(row["tasks"]),
            f"{row['mean_a']:.3f}",
            f"{row['mean_b']:.3f}",
            f"{row['delta']:+.3f}",
            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]",
            "*" if row["significant"] else "",
        )
    console.print(table)
    console.print("* the 95% interval excludes 0")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        console.print(f"comparison written to {out}")


# -- helpers -------------------------------------------------------------------------------------


def _build(spec: PolicySpec) -> Policy:
    try:
        return build_policy(spec)
    except PolicyError as exc:
        raise _fail(f"policy {spec.label}: {exc}") from None


def _limits_json(limits: AttemptLimits) -> dict[str, Any]:
    return {
        "max_steps": limits.max_steps,
        "max_tokens": limits.max_tokens,
        "max_wall_s": limits.max_wall_s,
    }


def _open(path: Path) -> RunDir:
    try:
        return RunDir.open(path)
    except RunError as exc:
        raise _fail(str(exc)) from None


def _run_async(coro: Any, *, exit_on_error: bool = True) -> Any:
    try:
        return asyncio.run(coro)
    except PalaestraError as exc:
        if not exit_on_error:
            raise
        raise _fail(f"({exc.code}) {exc.message}") from None


async def _find_pack(client: AsyncClient, pack: str) -> PackInfo:
    name, _, version = pack.partition("@")
    infos = [p for p in await client.packs() if p.name == name]
    if not infos:
        raise PalaestraError(f"the server has no pack {pack!r}", code="not_found")
    if version:
        match = next((p for p in infos if p.version == version), None)
        if match is None:
            served = sorted({v for p in infos for v in (p.versions or [p.version])})
            raise PalaestraError(
                f"the server has no version {version} of {name} (it serves {', '.join(served)})",
                code="not_found",
            )
        return match
    return infos[-1] if len(infos) > 1 else infos[0]


async def _all_tasks(client: AsyncClient, pack: str, split: str) -> list[TaskInfo]:
    """Every task of the split, a page at a time (the server caps a page)."""
    out: list[TaskInfo] = []
    while True:
        page = await client.tasks(pack=pack, split=split, limit=1000, offset=len(out))
        out.extend(page.tasks)
        if not page.tasks or len(out) >= page.total:
            return out


async def _server_version(url: str | None) -> str:
    """The server's palaestra version (its OpenAPI document says it)."""
    if not url:
        return palaestra.__version__
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            doc = (await http.get(f"{url.rstrip('/')}/openapi.json")).json()
            return str(doc["info"]["version"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "unknown"


def _progress(stats: bool = True) -> Progress:
    """A live bar: done/total, reward so far, voids and errors, elapsed time and ETA."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if stats:
        columns.append(
            TextColumn(
                "reward {task.fields[reward]:.3f} · void {task.fields[void]} · "
                "errors {task.fields[errors]}"
            )
        )
    return Progress(
        *columns, TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err
    )


async def _execute(
    client: AsyncClient,
    policy: Policy,
    store: RunDir,
    tasks: list[TaskInfo],
    k: int,
    concurrency: int,
    limits: AttemptLimits,
    server_patience_s: float,
    *,
    retry_void: bool = True,
    retry_errors: bool = False,
) -> None:
    """Run what the directory lacks under a live progress bar; record how the session ended."""
    done = store.latest()
    todo = pending(tasks, k, done, retry_void=retry_void, retry_errors=retry_errors)
    redo = {(t.id, i) for t, i in todo}
    kept = [a for key, a in done.items() if key not in redo]
    rewards = [a.reward for a in kept if a.status != "void"]
    counts = {"void": sum(a.status == "void" for a in kept), "errors": 0}
    counts["errors"] = sum(a.status == "error" for a in kept)
    session: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "to_run": len(todo),
    }
    ended, reason = "complete", ""
    with _progress() as progress:
        bar = progress.add_task(
            f"{policy.name} · {len(tasks)} tasks × {k}",
            total=len(tasks) * k,
            completed=len(tasks) * k - len(todo),
            reward=sum(rewards) / len(rewards) if rewards else 0.0,
            void=counts["void"],
            errors=counts["errors"],
        )

        def tick(a: Attempt) -> None:
            if a.status != "void":
                rewards.append(a.reward)
            counts["void"] += a.status == "void"
            counts["errors"] += a.status == "error"
            progress.update(
                bar,
                advance=1,
                reward=sum(rewards) / len(rewards) if rewards else 0.0,
                void=counts["void"],
                errors=counts["errors"],
            )

        try:
            await run_suite(
                client,
                policy,
                store,
                tasks,
                k=k,
                concurrency=concurrency,
                limits=limits,
                retry_void=retry_void,
                retry_errors=retry_errors,
                server_patience_s=server_patience_s,
                on_attempt=tick,
            )
            ended = "complete"
        except ServerGone as exc:
            ended, reason = "server_unreachable", str(exc)
        except (KeyboardInterrupt, asyncio.CancelledError):
            ended = "interrupted"
        except PalaestraError:
            _record_session(store, session, "refused")
            raise
    _record_session(store, session, ended)
    resume_hint = f"continue with `palaestra eval resume {store.path}`"
    if ended == "server_unreachable":
        raise _fail(
            f"{reason}. Every finished attempt is saved in {store.path}; {resume_hint}", code=3
        )
    if ended == "interrupted":
        err.print(f"interrupted: finished attempts are saved in {store.path}; {resume_hint}")
        raise typer.Exit(130)


def _record_session(store: RunDir, session: dict[str, Any], how: str) -> None:
    manifest = store.manifest()
    session["ended"] = how
    session["ended_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    complete = how == "complete" and not pending(
        [TaskInfo.model_validate(t) for t in manifest["tasks"]],
        int(manifest["k"]),
        store.latest(),
        retry_void=False,
    )
    store.update_manifest(
        status="complete" if complete else how,
        sessions=[*manifest.get("sessions", []), session],
    )


def report_header(manifest: dict[str, Any], store: RunDir) -> dict[str, Any]:
    spec = PolicySpec.model_validate(manifest["policy"])
    records = store.records()
    return {
        "run_id": manifest.get("run_id"),
        "pack": manifest["pack"],
        "version": manifest["version"],
        "pack_digest": manifest["pack_digest"],
        "split": manifest["split"],
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


def _finish(
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
        console.print(
            f"[yellow]{missing} attempt(s) have no result yet[/yellow]: "
            f"`palaestra eval resume {store.path}`"
        )
    if built["summary"]["attempts"] == 0:
        raise typer.Exit(1)


def _load_report(path: Path) -> dict[str, Any]:
    """A run directory's report (rebuilt from stored verdicts if it has none), or a report file."""
    if path.is_file():
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        except (OSError, json.JSONDecodeError) as exc:
            raise _fail(f"{path} is not a report: {exc}") from None
    store = _open(path)
    saved = store.path / "report.json"
    if saved.is_file() and saved.stat().st_mtime >= store.attempts_path.stat().st_mtime:
        loaded: dict[str, Any] = json.loads(saved.read_text())
        return loaded
    manifest = store.manifest()
    header = report_header(manifest, store)
    return build_report(list(store.latest().values()), k=int(manifest["k"]), header=header)


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
        title=f"{h['policy']} on {h['pack']}@{h['version']} ({h['split']})",
    )
    rows = [*report["by"]["domain"].items(), ("all", report["summary"])]
    for name, s in rows:
        table.add_row(
            name,
            str(s["tasks"]),
            str(s["attempts"]),
            f"{s['mean_reward']:.3f} ± {s['stderr']:.3f}",
            str(s["passed"]),
            *(f"{s['pass_at_k'].get(p.removeprefix('pass@'), 0):.3f}" for p in passes),
            str(s["void"]),
            str(s["errors"]),
        )
    console.print(table)
    failures = report["process"]["failure_classes"]
    if failures:
        console.print(
            "failure classes: " + ", ".join(f"{name} {n}" for name, n in failures.items())
        )
