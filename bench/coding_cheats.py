"""Coding cheat floor: every cheat of the coding family on every HumanEval task.

Each cheat of `CodingFamily.cheats(task)` (the list `palaestra pack check` plays) is played
through the real episode path (an embedded manager, bwrap sandboxes and the fork server),
as is the oracle. Two figures a cheat: its reward, and the `tests_passed` component (the
fraction of hidden tests passed, public-example repeats left out: the reward before
verifier 1.4.0), so one run shows the floor under both rules.

    .venv/bin/python bench/coding_cheats.py [--limit N] [--json PATH]

Prints, per cheat, max and mean over the tasks and how many tasks score above 0.1, then the
worst cheat; the last line of stdout is the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from palaestra.envs.coding.family import CodingFamily
from palaestra.sdk.models import Action
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.runtime import build_manager

PACK = "openai/humaneval"
LIMIT = 0.1


async def play(client: AsyncInProcessClient, task: str, actions: list[Action]) -> dict[str, Any]:
    reset = await client.reset(task)
    reply = None
    for action in actions:
        reply = await client.step(reset.episode_id, action.model_dump())
        if reply.terminated or reply.truncated:
            break
    assert reply is not None and reply.terminated, task
    verdict: dict[str, Any] = reply.info["verdict"]
    return verdict


async def main(limit: int | None, concurrency: int) -> dict[str, Any]:
    family = CodingFamily()
    with tempfile.TemporaryDirectory() as tmp:
        manager = build_manager(Settings(data_dir=Path(tmp) / "data"))
        await manager.start()
        try:
            client = AsyncInProcessClient(manager)
            listing = await client.tasks(pack=PACK, limit=1000)
            ids = sorted(t.id for t in listing.tasks)[:limit]
            gate = asyncio.Semaphore(concurrency)
            rows: dict[str, list[tuple[str, float, float]]] = {}

            async def one(task_id: str) -> None:
                task = manager.packs.resolve(task_id)
                plays = [("oracle", family.oracle(task)), *family.cheats(task)]
                for name, actions in plays:
                    async with gate:
                        verdict = await play(client, task_id, actions)
                    assert verdict["status"] == "ok", (task_id, name, verdict)
                    fraction = float(verdict["components"].get("tests_passed", 0.0))
                    rows.setdefault(name, []).append((task_id, verdict["reward"], fraction))

            await asyncio.gather(*(one(t) for t in ids))
        finally:
            await manager.shutdown()
    figures: dict[str, Any] = {"tasks": len(ids), "cheats": {}}
    for name, got in sorted(rows.items()):
        rewards, fractions = [r for _, r, _ in got], [f for _, _, f in got]
        worst = max(got, key=lambda row: row[2])
        figures["cheats"][name] = {
            "max_reward": max(rewards),
            "mean_reward": statistics.fmean(rewards),
            "over_limit": sorted(t for t, r, _ in got if r > LIMIT),
            "max_fraction": max(fractions),
            "mean_fraction": statistics.fmean(fractions),
            "fraction_over_limit": sum(f > LIMIT for f in fractions),
            "worst_fraction_task": worst[0],
        }
    return figures


def report(figures: dict[str, Any]) -> None:
    print(f"{figures['tasks']} tasks; reward (all hidden tests pass) | fraction rule (before)")
    for name, c in figures["cheats"].items():
        print(
            f"{name:22} reward max {c['max_reward']:.3f} mean {c['mean_reward']:.4f} "
            f"> {LIMIT}: {len(c['over_limit']):3} | fraction max {c['max_fraction']:.3f} "
            f"mean {c['mean_fraction']:.4f} > {LIMIT}: {c['fraction_over_limit']:3} "
            f"(worst {c['worst_fraction_task']})"
        )
    cheats = {k: v for k, v in figures["cheats"].items() if k != "oracle"}
    after = max(cheats.items(), key=lambda kv: (kv[1]["max_reward"], kv[1]["mean_reward"]))
    before = max(cheats.items(), key=lambda kv: (kv[1]["max_fraction"], kv[1]["mean_fraction"]))
    print(
        f"worst cheat before: {before[0]} max {before[1]['max_fraction']:.3f} "
        f"mean {before[1]['mean_fraction']:.4f}; after: {after[0]} max "
        f"{after[1]['max_reward']:.3f} mean {after[1]['mean_reward']:.4f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args()
    result = asyncio.run(main(ns.limit, ns.concurrency))
    report(result)
    if ns.json is not None:
        ns.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
