"""One session of a run: what its directory lacks runs under a live progress bar, and the
manifest records how the session ended (complete, interrupted, server unreachable)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from palaestra.cli.console import err
from palaestra.cli.eval.console import fail
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt, AttemptLimits
from palaestra.sdk.evaluation.rundir import RunDir, pending
from palaestra.sdk.evaluation.suite import ServerGone, run_suite
from palaestra.sdk.models import TaskInfo
from palaestra.sdk.policies.base import Policy


def progress_bar(stats: bool = True) -> Progress:
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


async def execute(
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
    with progress_bar() as progress:
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
            record_session(store, session, "refused")
            raise
    record_session(store, session, ended)
    resume_hint = f"continue with `palaestra eval resume {store.path}`"
    if ended == "server_unreachable":
        raise fail(
            f"{reason}. Every finished attempt is saved in {store.path}; {resume_hint}", code=3
        )
    if ended == "interrupted":
        err.print(f"interrupted: finished attempts are saved in {store.path}; {resume_hint}")
        raise typer.Exit(130)


def record_session(store: RunDir, session: dict[str, Any], how: str) -> None:
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
