"""Run a policy over a split, k attempts a task, and summarize (DESIGN §8, first version).

Works against any `AsyncClient`, HTTP or in-process. Seeds are fixed (attempt i uses
seed i). An attempt that hits an infrastructure fault is `void` and is reported apart,
never averaged in as 0; a policy failure is an `error` with its class.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import InvalidActionError, PalaestraError
from palaestra.sdk.models import Observation, StepResponse, TaskInfo
from palaestra.sdk.policies import Policy, PolicyError


@dataclass
class Attempt:
    task: str
    family: str
    domain: str
    difficulty: str
    attempt: int
    seed: int
    episode_id: str = ""
    status: str = "ok"  # ok | void | error
    reward: float = 0.0
    passed: bool = False
    error_class: str = ""
    error: str = ""
    stop: str = ""  # terminated | truncated | error
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    duration_s: float = 0.0
    feedback: str = ""
    components: dict[str, float] = field(default_factory=dict)
    trajectory: list[dict[str, Any]] = field(default_factory=list)


ProgressCallback = Callable[[Attempt], None]


async def run_attempt(
    client: AsyncClient, policy: Policy, task: TaskInfo, attempt: int, *, max_steps: int = 50
) -> Attempt:
    result = Attempt(
        task=task.id,
        family=task.family,
        domain=task.domain,
        difficulty=task.difficulty,
        attempt=attempt,
        seed=attempt,
    )
    started = time.perf_counter()
    try:
        reset = await client.reset(
            task.id, seed=attempt, options={**policy.reset_options(), "max_steps": max_steps}
        )
    except PalaestraError as exc:
        result.status, result.stop, result.error_class = "error", "error", f"reset_{exc.code}"
        result.error = exc.message
        result.duration_s = time.perf_counter() - started
        return result
    result.episode_id = reset.episode_id
    session = await policy.start(reset)
    last: StepResponse | None = None
    try:
        for _ in range(max_steps * 2):
            action = await session.act(last)
            result.tool_calls += 1
            try:
                last = await client.step(reset.episode_id, action)
            except InvalidActionError as exc:
                result.tool_errors += 1
                last = StepResponse(observation=Observation(text=f"error: {exc.message}"))
                continue
            result.steps += 1
            if last.terminated or last.truncated:
                result.stop = "terminated" if last.terminated else "truncated"
                break
        else:
            result.stop = "truncated"
        verdict = await client.verify(reset.episode_id)
        result.reward, result.passed = verdict.reward, verdict.passed
        result.status = "void" if verdict.status == "void" else "ok"
        result.feedback, result.components = verdict.feedback, verdict.components
        state = await client.state(reset.episode_id)
        result.trajectory = [s.model_dump(mode="json") for s in state.trajectory]
    except PolicyError as exc:
        result.status, result.stop, result.error_class, result.error = (
            "error",
            "error",
            exc.error_class,
            str(exc),
        )
    except PalaestraError as exc:
        result.status, result.stop, result.error_class, result.error = (
            "error",
            "error",
            f"server_{exc.code}",
            exc.message,
        )
    finally:
        await session.aclose()
        with contextlib.suppress(PalaestraError):
            await client.close(reset.episode_id)
        result.duration_s = time.perf_counter() - started
    return result


async def run_eval(
    client: AsyncClient,
    policy: Policy,
    tasks: list[TaskInfo],
    *,
    k: int = 1,
    concurrency: int = 8,
    max_steps: int = 50,
    on_attempt: ProgressCallback | None = None,
) -> list[Attempt]:
    gate = asyncio.Semaphore(concurrency)

    async def one(task: TaskInfo, i: int) -> Attempt:
        async with gate:
            attempt = await run_attempt(client, policy, task, i, max_steps=max_steps)
        if on_attempt is not None:
            on_attempt(attempt)
        return attempt

    return list(await asyncio.gather(*(one(t, i) for t in tasks for i in range(k))))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(attempts: list[Attempt], k: int) -> dict[str, Any]:
    scored = [a for a in attempts if a.status == "ok"]
    rewards = [a.reward for a in scored]
    by_task: dict[str, list[Attempt]] = {}
    for a in scored:
        by_task.setdefault(a.task, []).append(a)
    passes = (
        {
            j: statistics.fmean(
                pass_at_k(len(v), sum(a.passed for a in v), j) for v in by_task.values()
            )
            for j in range(1, k + 1)
        }
        if by_task
        else {}
    )
    stderr = statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.0
    calls = sum(a.tool_calls for a in attempts)
    return {
        "attempts": len(attempts),
        "tasks": len({a.task for a in attempts}),
        "scored": len(scored),
        "void": sum(a.status == "void" for a in attempts),
        "errors": sum(a.status == "error" for a in attempts),
        "mean_reward": statistics.fmean(rewards) if rewards else 0.0,
        "stderr": stderr,
        "passed": sum(a.passed for a in scored),
        "pass_at_k": {str(j): v for j, v in passes.items()},
        "mean_steps": statistics.fmean(a.steps for a in attempts) if attempts else 0.0,
        "tool_call_success": 1 - sum(a.tool_errors for a in attempts) / calls if calls else 1.0,
        "error_classes": _count(a.error_class for a in attempts if a.error_class),
    }


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def build_report(attempts: list[Attempt], *, k: int, header: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, dict[str, list[Attempt]]] = {"family": {}, "domain": {}, "difficulty": {}}
    for a in attempts:
        for key in groups:
            groups[key].setdefault(getattr(a, key) or "-", []).append(a)
    return {
        "header": header,
        "summary": summarize(attempts, k),
        "by": {
            key: {name: summarize(v, k) for name, v in sorted(g.items())}
            for key, g in groups.items()
        },
        "attempts": [asdict(a) for a in attempts],
    }
