"""A suite run into a run directory: what it lacks runs, each finished attempt on disk
before it counts; a server that goes away is waited for, then the run stops resumable."""

from __future__ import annotations

import asyncio
import time

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError, TransportError
from palaestra.sdk.evaluation.attempt import Attempt, AttemptLimits, ProgressCallback
from palaestra.sdk.evaluation.rundir import RunDir, pending
from palaestra.sdk.evaluation.runner import ResetUnreachable, run_attempt
from palaestra.sdk.models import TaskInfo
from palaestra.sdk.policies.base import Policy


class ServerGone(Exception):
    """The server stayed unreachable; the run stopped and can be resumed."""


async def wait_for_server(client: AsyncClient, patience_s: float) -> bool:
    """Poll a cheap route until the server answers again, or `patience_s` passes."""
    deadline = time.monotonic() + patience_s
    delay = 0.2
    while True:
        try:
            await client.packs()
            return True
        except TransportError:
            pass
        except PalaestraError:
            return True  # it answers, even if with an error
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 2.0)


async def run_suite(
    client: AsyncClient,
    policy: Policy,
    run: RunDir,
    tasks: list[TaskInfo],
    *,
    k: int,
    concurrency: int = 4,
    limits: AttemptLimits | None = None,
    retry_void: bool = True,
    retry_errors: bool = False,
    server_patience_s: float = 60.0,
    on_attempt: ProgressCallback | None = None,
) -> list[Attempt]:
    """Run what the run directory lacks; each finished attempt is on disk before it counts.

    An attempt whose reset cannot reach the server is not recorded: the runner waits for
    the server (up to `server_patience_s`) and starts it again; if the server stays away,
    `ServerGone` is raised and the run can be resumed later. Attempts cut off mid-episode
    by a server restart end `void` (class env_error / server_unreachable) and are rerun by
    a resume."""
    limits = limits or AttemptLimits()
    run.repair()
    todo = pending(tasks, k, run.latest(), retry_void=retry_void, retry_errors=retry_errors)
    gate = asyncio.Semaphore(concurrency)
    waiting = asyncio.Lock()
    finished: list[Attempt] = []

    async def one(task: TaskInfo, i: int) -> None:
        async with gate:
            while True:
                try:
                    attempt = await run_attempt(client, policy, task, i, limits=limits)
                    break
                except ResetUnreachable as exc:
                    async with waiting:
                        back = await wait_for_server(client, server_patience_s)
                    if not back:
                        raise ServerGone(
                            f"the server stayed unreachable for {server_patience_s:g} s ({exc})"
                        ) from None
        await asyncio.to_thread(run.append, attempt)
        finished.append(attempt)
        if on_attempt is not None:
            on_attempt(attempt)

    try:
        async with asyncio.TaskGroup() as group:
            for task, i in todo:
                group.create_task(one(task, i))
    except ExceptionGroup as group_error:
        for kind in (ServerGone, PalaestraError):
            found = group_error.subgroup(kind)
            if found is not None:
                first = found.exceptions[0]
                while isinstance(first, ExceptionGroup):
                    first = first.exceptions[0]
                raise first from None
        raise
    return finished
