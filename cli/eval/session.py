"""One session of a run: what its directory lacks runs under live progress, and the
manifest records how the session ended (complete, interrupted, server unreachable)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import typer

from palaestra.cli.eval.console import fail
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import keep
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt, AttemptLimits
from palaestra.sdk.evaluation.rundir import RunDir, pending
from palaestra.sdk.evaluation.suite import ServerGone, run_suite
from palaestra.sdk.models import TaskInfo
from palaestra.sdk.policies.base import Policy


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
    """Run what the directory lacks under live progress; record how the session ended."""
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

    def note() -> str:
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        return f"reward {mean:.3f} · void {counts['void']} · errors {counts['errors']}"

    with LiveProgress(
        f"{policy.name} · {len(tasks)} tasks × {k}",
        len(tasks) * k,
        unit="attempts",
        done=len(tasks) * k - len(todo),
    ) as progress:
        progress.update(note=note())

        def tick(a: Attempt) -> None:
            if a.status != "void":
                rewards.append(a.reward)
            counts["void"] += a.status == "void"
            counts["errors"] += a.status == "error"
            progress.advance(note=note())

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
        progress.close(finished=ended == "complete")
    record_session(store, session, ended)
    resume_hint = f"continue with `palaestra eval resume {store.path}`"
    if ended == "server_unreachable":
        raise fail(
            f"{reason}. Every finished attempt is saved in {store.path}; {resume_hint}", code=3
        )
    if ended == "interrupted":
        keep(f"finished attempts are saved in {store.path}; {resume_hint}")
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
