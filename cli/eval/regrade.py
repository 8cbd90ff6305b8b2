"""`palaestra eval regrade RUN --pack ORG/NAME@NEWVERSION [-o NEWRUN]`: the run's verified
attempts graded again by a newer (or older) pack version's verifier on the final states the
server kept (server/final_state.py), without rerunning the policy; prints what changed and
writes it as `regrade-<version>.json` in the run (and, with -o, a new run directory)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from palaestra.cli.clients import open_client
from palaestra.cli.console import console, err, styled
from palaestra.cli.eval.console import fail, open_run
from palaestra.cli.eval.report import write_report
from palaestra.cli.eval.server import find_pack
from palaestra.cli.options import DataDir, Token, Url
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import Stop
from palaestra.sdk.client import AsyncServerClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.evaluation.rescore import differences, rescore
from palaestra.sdk.evaluation.rundir import RunDir, RunError
from palaestra.sdk.models import PackInfo


def regrade_cmd(
    run_path: Annotated[Path, typer.Argument(metavar="RUN", help="a run directory")],
    pack: Annotated[str, typer.Option(help="the pack version to regrade against: org/name@ver")],
    out_run: Annotated[
        Path | None,
        typer.Option("-o", "--out-run", help="also write the regraded run as a new run directory"),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="regrades at once", min=1)] = 4,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Regrade a run's attempts against another pack version from the final states the
    server kept (no policy, no replay); print per task old → new, flips and the delta."""
    store = open_run(run_path)
    manifest = store.manifest()
    attempts = sorted(store.latest().values(), key=lambda a: a.key)
    if not attempts:
        raise fail(f"{run_path}: no attempt has a result; nothing to regrade")
    name = pack.partition("@")[0]
    if name != manifest["pack"]:
        raise fail(f"--pack {pack} is not a version of the run's pack {manifest['pack']}")
    target_url = url or (None if manifest["server"] == "embedded" else manifest["server"])
    target_dir = data_dir or (Path(manifest["data_dir"]) if manifest.get("data_dir") else None)

    async def go() -> tuple[PackInfo, list[Attempt]]:
        async with open_client(target_url, token, target_dir) as client:
            if not isinstance(client, AsyncServerClient):  # both the HTTP and embedded are
                raise PalaestraError("this client cannot regrade", code="unsupported")
            info = await find_pack(client, pack)
            ref = f"{info.name}@{info.version}"
            with LiveProgress(f"regrading against {ref}", len(attempts), unit="attempts") as bar:
                new = await rescore(
                    client,
                    attempts,
                    ref,
                    concurrency=concurrency,
                    on_attempt=lambda a, o: bar.advance(),
                )
            return info, new

    try:
        with Stop("eval regrade") as stop:
            info, regraded = stop.run(go())
    except PalaestraError as exc:
        raise fail(f"({exc.code}) {exc.message}") from None
    diff = differences(attempts, regraded)
    result = {
        "run": str(run_path),
        "from": f"{manifest['pack']}@{manifest['version']}",
        "to": f"{info.name}@{info.version}",
        "to_digest": info.digest,
        "split": manifest["split"],
        **diff,
        "kept_reasons": _reasons(regraded),
    }
    print_differences(result)
    written = store.path / f"regrade-{info.version}.json"
    written.write_text(json.dumps(result, indent=1))
    console.print(f"differences written to {written}")
    if out_run is not None:
        new = _new_run(out_run, manifest, info, run_path)
        for a in regraded:
            new.append(a)
        note = f"regraded from {run_path} against {result['to']}"
        grading = {"mode": "final_state", "note": note}
        write_report(new, out=None, attempts=regraded, grading=grading)


def _reasons(attempts: list[Attempt]) -> dict[str, int]:
    """Why attempts kept their stored verdicts, counted."""
    reasons: dict[str, int] = {}
    for a in attempts:
        if a.regraded.get("graded") != "final_state":
            why = str(a.regraded.get("why", "?"))
            reasons[why] = reasons.get(why, 0) + 1
    return reasons


def _new_run(path: Path, manifest: dict[str, Any], info: PackInfo, source: Path) -> RunDir:
    now = datetime.datetime.now(datetime.UTC)
    prefix = f"{manifest['pack']}@{manifest['version']}:"
    tasks = [
        {**t, "id": f"{info.name}@{info.version}:{t['id'].removeprefix(prefix)}"}
        for t in manifest["tasks"]
    ]
    made = {
        **manifest,
        "run_id": f"{manifest.get('run_id', 'run')}-regrade-{info.version}",
        "created_at": now.isoformat(),
        "version": info.version,
        "pack_digest": info.digest,
        "tasks": tasks,
        "status": "done",
        "sessions": [],
        "regraded_from": {
            "run": str(source),
            "run_id": manifest.get("run_id"),
            "version": manifest["version"],
            "pack_digest": manifest["pack_digest"],
        },
    }
    made.pop("format", None)
    try:
        return RunDir.create(path, made)
    except RunError as exc:
        raise fail(str(exc)) from None


def print_differences(result: dict[str, Any]) -> None:
    table = Table(
        "task",
        "attempts",
        "old reward",
        "new reward",
        "passed old → new",
        "",
        title=f"{result['run']}: {result['from']} → {result['to']} ({result['split']})",
    )
    for task, row in result["tasks"].items():
        table.add_row(
            task,
            str(row["attempts"]),
            f"{row['old_reward']:.3f}",
            f"{row['new_reward']:.3f}",
            f"{row['old_passed']} → {row['new_passed']}",
            "changed" if row["changed"] else "",
        )
    console.print(table)
    flips, counts = result["flips"], result["attempts"]
    console.print(
        f"flips: pass→fail {flips['pass_to_fail']}, fail→pass {flips['fail_to_pass']}; "
        f"{counts['changed']} of {counts['regraded']} regraded attempts changed"
    )
    console.print(
        f"mean reward {result['mean_old']:.3f} → {result['mean_new']:.3f} "
        f"(Δ {result['delta']:+.3f}, 95% CI [{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]"
        + (", significant)" if result["significant"] else ")")
    )
    if result["kept_reasons"]:
        reasons = "; ".join(f"{why} ({n})" for why, n in result["kept_reasons"].items())
        err.print(styled(f"{counts['kept']} kept their stored verdicts: ", "yellow", reasons))
