"""`palaestra eval`: run a policy on a split into a run directory, resume it, report, compare.

    palaestra eval run --pack ORG/NAME@VER --split heldout --policy POLICY -k K --concurrency N
    palaestra eval resume RUN
    palaestra eval report RUN          # regrades from stored trajectories where it can
    palaestra eval compare RUN_A RUN_B
    palaestra eval regrade RUN --pack ORG/NAME@NEWVER [-o NEWRUN]   # from kept final states

`palaestra eval --pack …` (no subcommand) is the first version's form: the same as `run`.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

import palaestra
from palaestra.cli.clients import open_client
from palaestra.cli.console import console, err, styled
from palaestra.cli.eval.console import fail, open_run
from palaestra.cli.eval.regrade import regrade_cmd
from palaestra.cli.eval.report import load_report, write_report
from palaestra.cli.eval.server import find_pack, server_version
from palaestra.cli.eval.session import execute
from palaestra.cli.options import DataDir, Token, Url
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import Stop
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt, AttemptLimits
from palaestra.sdk.evaluation.regrade import regrade
from palaestra.sdk.evaluation.rundir import RunDir, RunError, pending
from palaestra.sdk.models import TaskInfo
from palaestra.sdk.policies.base import Policy, PolicyError
from palaestra.sdk.policies.spec import PolicySpec, build_policy, parse_policy
from palaestra.sdk.report import CompareError, compare

eval_app = typer.Typer(
    help="Evaluate a policy on a split (k attempts a task) into a resumable run directory; "
    "report it as JSON and HTML; compare two runs. Without a subcommand, the options below "
    "run `eval run` (the first version's form).",
    no_args_is_help=False,
    invoke_without_command=True,
)

PackOpt = Annotated[str | None, typer.Option(help="org/name[@version]")]
SplitOpt = Annotated[str, typer.Option(help="split to evaluate")]
PolicyOpt = Annotated[
    str,
    typer.Option(
        help="oracle | null | openai (alias: chat; with --base-url, --model) | an "
        "OpenAI-compatible base URL | hf:MODEL_DIR (local transformers model) | module:callable"
    ),
]
KOpt = Annotated[int, typer.Option("-k", help="attempts per task (seeds 0..k-1)", min=1)]
ConcOpt = Annotated[int, typer.Option(help="episodes at once", min=1)]
StepsOpt = Annotated[int, typer.Option(help="steps per attempt", min=1)]
TokensOpt = Annotated[int, typer.Option(help="tokens per attempt (0: no limit)", min=0)]
WallOpt = Annotated[float, typer.Option(help="wall time per attempt (s)", min=0.1)]
LimitOpt = Annotated[int | None, typer.Option(help="only the first N tasks")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="openai policy: OpenAI-compatible URL")]
ModelOpt = Annotated[str | None, typer.Option(help="openai policy: model name")]
KeyEnvOpt = Annotated[str, typer.Option(help="openai policy: env var holding the key")]
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
            info = await find_pack(client, pack)
            ref = f"{info.name}@{info.version}"
            everything = await client.all_tasks(pack=ref, split=split)
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
                # the held-out draw the run measures (server/draws.py; None: no rotation)
                "heldout_draw": next((s.draw for s in info.splits if s.name == split), None),
                "tasks": [t.model_dump(mode="json") for t in chosen],
                "k": k,
                "seeds": list(range(k)),
                "policy": spec.model_dump(mode="json"),
                "limits": _limits_json(limits),
                "concurrency": concurrency,
                "server": url or "embedded",
                "data_dir": str(data_dir.resolve()) if data_dir else None,
                "server_version": await server_version(url),
                "palaestra_version": palaestra.__version__,
                "status": "running",
                "sessions": [],
            }
            try:
                store = RunDir.create(path, manifest)
            except RunError as exc:
                raise fail(str(exc)) from None
            err.print(f"run directory: {path}")
            await execute(client, live, store, chosen, k, concurrency, limits, server_patience_s)
            return path

    path = _run_async(go(), "eval run")
    write_report(RunDir.open(path), out=out)


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
    store = open_run(run_path)
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
        write_report(store, out=out)
        return

    async def go() -> None:
        async with open_client(target_url, token, target_dir) as client:
            info = await find_pack(client, f"{manifest['pack']}@{manifest['version']}")
            if info.digest != manifest["pack_digest"]:
                raise fail(
                    f"the server's {info.name}@{info.version} has digest {info.digest}, but the "
                    f"run was made on {manifest['pack_digest']}: refusing to mix them"
                )
            draw = next((s.draw for s in info.splits if s.name == manifest["split"]), None)
            if manifest.get("heldout_draw") is not None and draw != manifest["heldout_draw"]:
                raise fail(
                    f"the run measured held-out draw {manifest['heldout_draw']}, which the "
                    f"server has retired (it serves draw {draw}): start a new run and compare "
                    "the two with `palaestra eval compare`"
                )
            err.print(f"resuming {run_path}: {len(todo)} attempt(s) to run")
            await execute(
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

    _run_async(go(), "eval resume")
    write_report(store, out=out)


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
    store = open_run(run_path)
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
                "eval report",
                exit_on_error=False,
            )
        except (PalaestraError, OSError) as exc:
            message = getattr(exc, "message", str(exc))
            rest = f" ({message}); the report is rebuilt from the stored verdicts"
            err.print(styled("cannot regrade", "yellow", rest))
            grading = {
                "mode": "stored",
                "note": "rebuilt from the stored verdicts: the server could not regrade "
                f"({message})",
            }
    write_report(store, out=out, attempts=attempts, grading=grading)
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
        info = await find_pack(client, f"{manifest['pack']}@{manifest['version']}")
        if info.digest != manifest["pack_digest"]:
            raise PalaestraError(
                f"the server's pack digest {info.digest} is not the run's "
                f"{manifest['pack_digest']}",
                code="digest_mismatch",
            )
        with LiveProgress("regrading by replay", len(attempts), unit="attempts") as progress:
            return await regrade(
                client,
                attempts,
                concurrency=concurrency,
                on_attempt=lambda a, o: progress.advance(),
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
    a, b = load_report(run_a), load_report(run_b)
    try:
        result = compare(a, b, samples=samples, seed=seed)
    except CompareError as exc:
        raise fail(f"cannot compare {run_a} and {run_b}: {exc}") from None
    draws = result.get("draws")
    shown = {k: "?" if v is None else v for k, v in (draws or {}).items()}
    across = f", held-out draw {shown['a']} (A) vs {shown['b']} (B)" if draws else ""
    table = Table(
        "domain",
        "tasks" if not draws else "tasks A/B",
        "A",
        "B",
        "Δ (B − A)",
        "95% CI",
        "",
        title=f"{result['b']['policy']} (B) vs {result['a']['policy']} (A) on "
        f"{result['a']['pack']}@{result['a']['version']} ({result['a']['split']}{across})",
    )
    for name, row in result["domains"].items():
        table.add_row(
            name,
            f"{row['tasks_a']}/{row['tasks_b']}" if draws else str(row["tasks"]),
            f"{row['mean_a']:.3f}",
            f"{row['mean_b']:.3f}",
            f"{row['delta']:+.3f}",
            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]",
            "*" if row["significant"] else "",
        )
    console.print(table)
    console.print("* the 95% interval excludes 0")
    if draws:
        console.print("unpaired bootstrap: the two held-out draws share no task")
    if result.get("drop"):
        console.print(
            styled(
                "significant drop",
                "red",
                f": B scores {-result['domains']['all']['delta']:.3f} below A, the 95% interval "
                "excludes 0" + (" (a model that memorised draw A shows up so)" if draws else ""),
            )
        )
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        console.print(f"comparison written to {out}")


eval_app.command("regrade")(regrade_cmd)  # against another pack version (cli/eval/regrade.py)


# -- helpers -------------------------------------------------------------------------------------


def _build(spec: PolicySpec) -> Policy:
    try:
        return build_policy(spec)
    except PolicyError as exc:
        raise fail(f"policy {spec.label}: {exc}") from None


def _limits_json(limits: AttemptLimits) -> dict[str, Any]:
    return {
        "max_steps": limits.max_steps,
        "max_tokens": limits.max_tokens,
        "max_wall_s": limits.max_wall_s,
    }


def _run_async(coro: Any, command: str, *, exit_on_error: bool = True) -> Any:
    """Run the command's work; Ctrl-C / SIGTERM stop it cleanly (cli/stopping.py)."""
    try:
        with Stop(command) as stop:
            return stop.run(coro)
    except PalaestraError as exc:
        if not exit_on_error:
            raise
        raise fail(f"({exc.code}) {exc.message}") from None
