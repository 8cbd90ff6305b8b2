"""Fork latency (`POST /v1/episodes/{id}/fork`, server/fork.py) against a reset of the same
task, measured in the same run, on bwrap and (where the engine is up) docker.

Issue 35's target: a fork of a coding episode in < 100 ms p50 on bwrap, < 1 s on docker.
The episode is a HumanEval task of the built-in packs, three steps in (a solution written,
run once, a scratch file written), so the fork copies a real workspace, the family's state
and a trajectory; the `+8 MiB` row adds 8 MiB of files to the workspace (the copy's cost).
Each fork and each reset is timed through the server's front (`EpisodeManager`: quota,
store commit and all, no HTTP), one at a time, and closed untimed. The ratio is the fork's
p50 over the reset's: what a fork costs in resets (a reset's sandbox comes ready from the
warm pool; a fork's too, then the copy).

    .venv/bin/python bench/fork.py                 # 100 forks and resets a row (docker: 30)
    .venv/bin/python bench/fork.py --quick         # 30 (docker: 10)
    .venv/bin/python bench/fork.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from coding_episode import BULK, STEPS, TASK, pct  # bench/coding_episode.py

from palaestra.sandbox.docker import BASE_IMAGE, docker_available
from palaestra.sdk.models import ResetRequest, StepRequest
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager


async def timed(
    n: int, call: Callable[[], Awaitable[str]], close: Callable[[str], Awaitable[None]]
) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        eid = await call()
        out.append((time.perf_counter() - start) * 1000)
        await close(eid)
    return out


async def row(manager: EpisodeManager, n: int, bulk: bool) -> dict[str, Any]:
    parent = (await manager.reset(ResetRequest(task=TASK))).episode_id
    for action in [*STEPS, *([BULK] if bulk else [])]:
        reply = await manager.step(parent, StepRequest(action=action))
        assert not reply.terminated, reply.observation.text

    async def fork() -> str:
        return (await manager.fork(parent)).episode_id

    async def reset() -> str:
        return (await manager.reset(ResetRequest(task=TASK))).episode_id

    await timed(3, fork, manager.close)  # warm: the pool's spec, the store's statements
    forks = await timed(n, fork, manager.close)
    resets = await timed(n, reset, manager.close)
    await manager.close(parent)
    return {
        "fork_p50_ms": statistics.median(forks),
        "fork_p95_ms": pct(forks, 0.95),
        "reset_p50_ms": statistics.median(resets),
        "reset_p95_ms": pct(resets, 0.95),
        "fork_over_reset": statistics.median(forks) / statistics.median(resets),
        "n": n,
    }


async def backend_rows(backend: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        manager = build_manager(Settings(data_dir=Path(tmp) / "data", sandbox=backend))
        await manager.start()
        try:
            return {
                "coding episode": await row(manager, n, bulk=False),
                "+8 MiB": await row(manager, n, bulk=True),
            }
        finally:
            await manager.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    targets = {"bwrap": 100.0, "docker": 1000.0}
    for backend in ("bwrap", "docker"):
        n = (30 if args.quick else 100) if backend == "bwrap" else (10 if args.quick else 30)
        if backend == "docker":
            ok, why = docker_available()
            if not ok:
                print(f"docker: skipped ({why})")
                results[backend] = {"skipped": why}
                continue
            print(f"docker: default image {BASE_IMAGE}")
        results[backend] = asyncio.run(backend_rows(backend, n))
    head = f"{'fork p50':>9} {'p95':>9} {'reset p50':>10} {'p95':>9} {'fork/reset':>10}"
    print(f"\n{'backend':8} {'row':15} {head}  target")
    for backend, rows in results.items():
        for name, r in rows.items():
            if name == "skipped":
                continue
            ok = "PASS" if r["fork_p50_ms"] < targets[backend] else "MISS"
            print(
                f"{backend:8} {name:15} {r['fork_p50_ms']:7.1f}ms {r['fork_p95_ms']:7.1f}ms "
                f"{r['reset_p50_ms']:8.1f}ms {r['reset_p95_ms']:7.1f}ms "
                f"{r['fork_over_reset']:9.1f}x"
                f"  p50 < {targets[backend]:g} ms: {ok}"
            )
    print(json.dumps(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
