"""Regrading a run from its stored trajectories: each attempt replayed in a fresh episode,
its verdict kept only where the replay matches the stored observations."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt, observation_json


async def replay_attempt(client: AsyncClient, a: Attempt) -> dict[str, Any]:
    """Regrade one attempt: replay its accepted actions in a fresh episode (same task, seed
    and reset options) and verify. The verdict stands only if every replayed observation
    equals the stored one (the final state is then the same, and the verifier is
    deterministic on it, DESIGN §4); otherwise, or for attempts that never reached a
    verdict, the stored verdict is kept and the reason given."""
    if a.status != "ok":
        return {"graded": "stored", "why": f"{a.status} attempt ({a.error_class or 'no verdict'})"}
    steps = [s for s in a.trajectory if s.get("accepted")]
    if len(steps) != a.steps:
        return {"graded": "stored", "why": "the stored trajectory is incomplete"}
    try:
        reset = await client.reset(a.task, seed=a.seed, options=a.options)
    except PalaestraError as exc:
        return {"graded": "stored", "why": f"replay refused: {exc.code}: {exc.message}"[:300]}
    try:
        digest = str(reset.info.get("task_digest", ""))
        if a.task_digest and digest and digest != a.task_digest:
            return {"graded": "stored", "why": "the task changed since the run (digest differs)"}
        for s in steps:
            reply = await client.step(reset.episode_id, s["action"])
            if observation_json(reply.observation)["text"] != s["observation"]["text"]:
                return {
                    "graded": "stored",
                    "why": f"replay diverged at step {s['index']} (non-deterministic environment)",
                }
        verdict = await client.verify(reset.episode_id)
        if verdict.status == "void":
            return {"graded": "stored", "why": f"void on replay: {verdict.feedback}"[:300]}
        return {
            "graded": "replay",
            "reward": verdict.reward,
            "passed": verdict.passed,
            "components": verdict.components,
            "verifier": verdict.verifier.model_dump(mode="json"),
            "changed": verdict.reward != a.reward or verdict.passed != a.passed,
            "stored_reward": a.reward,
        }
    except PalaestraError as exc:
        return {"graded": "stored", "why": f"replay failed: {exc.code}: {exc.message}"[:300]}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(reset.episode_id), 5.0)


async def regrade(
    client: AsyncClient,
    attempts: list[Attempt],
    *,
    concurrency: int = 4,
    on_attempt: Callable[[Attempt, dict[str, Any]], None] | None = None,
) -> tuple[list[Attempt], dict[str, Any]]:
    """Every attempt regraded where it can be; (attempts with the new verdicts, a summary)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(a: Attempt) -> tuple[Attempt, dict[str, Any]]:
        async with gate:
            outcome = await replay_attempt(client, a)
        if on_attempt is not None:
            on_attempt(a, outcome)
        return a, outcome

    results = await asyncio.gather(*(one(a) for a in attempts))
    out: list[Attempt] = []
    reasons: dict[str, int] = {}
    regraded = changed = 0
    for a, outcome in results:
        b = dataclasses.replace(a)
        if outcome["graded"] == "replay":
            regraded += 1
            changed += bool(outcome["changed"])
            b.reward, b.passed = outcome["reward"], outcome["passed"]
            b.components, b.verifier = outcome["components"], outcome["verifier"]
        else:
            reasons[outcome["why"]] = reasons.get(outcome["why"], 0) + 1
        b.regraded = outcome
        out.append(b)
    summary = {
        "mode": "replay" if regraded else "stored",
        "regraded": regraded,
        "changed": changed,
        "kept_stored": len(attempts) - regraded,
        "kept_reasons": reasons,
        "note": (
            f"{regraded} of {len(attempts)} attempts regraded by replaying their stored "
            f"trajectories ({changed} changed); {len(attempts) - regraded} kept their stored "
            "verdicts"
        ),
    }
    return out, summary
