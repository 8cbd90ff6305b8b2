"""Regrading a run against another pack version from the final states the server kept
(`POST /v1/episodes/{id}/regrade`, `palaestra eval regrade`): no policy runs, no replay;
each verified attempt's final state is judged by the new version's verifier, and the
differences are reported (old → new per task, flips, the mean reward's delta)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from palaestra.sdk.client import AsyncServerClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.report import bootstrap_delta


async def rescore_attempt(client: AsyncServerClient, a: Attempt, pack: str) -> dict[str, Any]:
    """One attempt's new verdict under `pack` (`org/name@version`), or why it keeps its own:
    an attempt that never reached a verdict (void, policy error) has no final state."""
    if a.status != "ok" or not a.episode_id:
        return {"graded": "stored", "why": f"{a.status} attempt (no final state)"}
    try:
        verdict = await client.regrade(a.episode_id, pack)
    except PalaestraError as exc:
        return {"graded": "stored", "why": f"{exc.code}: {exc.message}"[:300]}
    if verdict.status == "void":
        return {"graded": "stored", "why": f"void on regrade: {verdict.feedback}"[:300]}
    return {
        "graded": "final_state",
        "pack": pack,
        "reward": verdict.reward,
        "passed": verdict.passed,
        "components": verdict.components,
        "feedback": verdict.feedback,
        "verifier": verdict.verifier.model_dump(mode="json"),
        "task_digest": verdict.task_digest,
        "stored_reward": a.reward,
        "stored_passed": a.passed,
        "changed": verdict.reward != a.reward or verdict.passed != a.passed,
    }


async def rescore(
    client: AsyncServerClient,
    attempts: Sequence[Attempt],
    pack: str,
    *,
    concurrency: int = 4,
    on_attempt: Callable[[Attempt, dict[str, Any]], None] | None = None,
) -> list[Attempt]:
    """Every attempt with the verdict `pack` gives its kept final state (where it has one;
    the others keep theirs, `regraded` says why), in the order given."""
    gate = asyncio.Semaphore(concurrency)

    async def one(a: Attempt) -> Attempt:
        async with gate:
            outcome = await rescore_attempt(client, a, pack)
        if on_attempt is not None:
            on_attempt(a, outcome)
        b = dataclasses.replace(a, regraded=outcome)
        if outcome["graded"] == "final_state":
            b.reward, b.passed = outcome["reward"], outcome["passed"]
            b.components, b.verifier = outcome["components"], outcome["verifier"]
            b.feedback, b.task_digest = outcome["feedback"], outcome["task_digest"]
            b.task = _retarget(a.task, pack)
        return b

    return list(await asyncio.gather(*(one(a) for a in attempts)))


def _retarget(ref: str, pack: str) -> str:
    """`org/name@old:id` as the task of `pack` (`org/name@new`)."""
    return f"{pack}:{ref.rpartition(':')[2]}" if "@" in pack else ref


def differences(
    old: Sequence[Attempt], new: Sequence[Attempt], *, samples: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """What changed from `old` to `new` (the same attempts, in the same order): per task
    the mean reward and passes before and after, flips of `passed` by direction, and the
    delta of the mean reward paired by task with a 95% bootstrap interval (`eval compare`'s
    statistic). Void attempts and those not regraded count on neither side of a flip."""
    tasks: dict[str, dict[str, Any]] = {}
    flips = {"pass_to_fail": 0, "fail_to_pass": 0}
    counts = {"regraded": 0, "kept": 0, "changed": 0}
    for a, b in zip(old, new, strict=True):
        key = a.task.rpartition(":")[2]
        row = tasks.setdefault(
            key, {"domain": a.domain or "-", "old": [], "new": [], "old_passed": 0, "new_passed": 0}
        )
        if a.status == "void":
            continue
        row["old"].append(a.reward)
        row["new"].append(b.reward)
        row["old_passed"] += a.passed
        row["new_passed"] += b.passed
        if b.regraded.get("graded") != "final_state":
            counts["kept"] += 1
            continue
        counts["regraded"] += 1
        counts["changed"] += bool(b.regraded.get("changed"))
        if a.passed and not b.passed:
            flips["pass_to_fail"] += 1
        elif b.passed and not a.passed:
            flips["fail_to_pass"] += 1
    per_task: dict[str, dict[str, Any]] = {}
    pairs: list[tuple[float, float]] = []
    for key, row in sorted(tasks.items()):
        if not row["old"]:
            continue
        mean_old, mean_new = statistics.fmean(row["old"]), statistics.fmean(row["new"])
        pairs.append((mean_old, mean_new))
        per_task[key] = {
            "domain": row["domain"],
            "attempts": len(row["old"]),
            "old_reward": mean_old,
            "new_reward": mean_new,
            "old_passed": row["old_passed"],
            "new_passed": row["new_passed"],
            "changed": mean_old != mean_new or row["old_passed"] != row["new_passed"],
        }
    delta, low, high = bootstrap_delta(pairs, samples=samples, seed=seed)
    return {
        "tasks": per_task,
        "flips": flips,
        "attempts": counts,
        "mean_old": statistics.fmean(p[0] for p in pairs) if pairs else 0.0,
        "mean_new": statistics.fmean(p[1] for p in pairs) if pairs else 0.0,
        "delta": delta,
        "ci_low": low,
        "ci_high": high,
        "significant": low > 0 or high < 0,
        "bootstrap": {"samples": samples, "seed": seed, "level": 0.95, "paired_by": "task"},
    }
