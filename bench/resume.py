"""Checkpoint and resume latency (`POST /v1/episodes/{id}/checkpoint` and `.../resume`,
server/checkpoint.py), beside a reset of the same task, on bwrap and (where the engine is
up) docker.

The episode is a HumanEval task of the built-in packs three steps in (a solution written,
run once, a scratch file written), as bench/fork.py plays it; the `+8 MiB` row adds 8 MiB
of files to the workspace (the snapshot's cost). N episodes are checkpointed one at a time
(timed), the server is stopped (a graceful stop leaves them `resumable`) and started again
on the same data dir, and each is resumed one at a time (timed), through the server's front
(`EpisodeManager`: quota, store and all, no HTTP). A checkpoint streams the workdir into a
spool file and stores it content-addressed, then writes its row durably; a resume makes a
sandbox (from the warm pool), unpacks the snapshot into it and cuts the trajectory back.

    .venv/bin/python bench/resume.py                 # 50 a row (docker: 20)
    .venv/bin/python bench/resume.py --quick         # 15 (docker: 8)
    .venv/bin/python bench/resume.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from coding_episode import BULK, STEPS, TASK, pct  # bench/coding_episode.py

from palaestra.sandbox.docker import BASE_IMAGE, docker_available
from palaestra.sdk.models import ResetRequest, StepRequest
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


async def started(manager: EpisodeManager, bulk: bool) -> str:
    eid = (await manager.reset(ResetRequest(task=TASK))).episode_id
    for action in [*STEPS, *([BULK] if bulk else [])]:
        reply = await manager.step(eid, StepRequest(action=action))
        assert not reply.terminated, reply.observation.text
    return eid


async def row(settings: Settings, n: int, bulk: bool) -> dict[str, Any]:
    manager = build_manager(settings)
    await manager.start()
    checkpoints: list[float] = []
    resets: list[float] = []
    episodes: list[str] = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            eid = (await manager.reset(ResetRequest(task=TASK))).episode_id
            resets.append(ms(start))
            await manager.close(eid)
        for i in range(n + 2):
            eid = await started(manager, bulk)
            start = time.perf_counter()
            made = await manager.checkpoint(eid)
            if i >= 2:  # the first two warm the statements and the snapshot folder
                checkpoints.append(ms(start))
            assert made.step_count == len(STEPS) + bulk
            episodes.append(eid)
    finally:
        await manager.shutdown()  # they are parked: resumable
    manager = build_manager(settings)
    await manager.start()
    resumes: list[float] = []
    try:
        for i, eid in enumerate(episodes):
            start = time.perf_counter()
            back = await manager.resume(eid)
            if i >= 2:
                resumes.append(ms(start))
            assert back.resumed_at_step == len(STEPS) + bulk and back.lost_steps == 0
            await manager.close(eid)
    finally:
        await manager.shutdown()
    return {
        "checkpoint_p50_ms": statistics.median(checkpoints),
        "checkpoint_p95_ms": pct(checkpoints, 0.95),
        "resume_p50_ms": statistics.median(resumes),
        "resume_p95_ms": pct(resumes, 0.95),
        "reset_p50_ms": statistics.median(resets),
        "resume_over_reset": statistics.median(resumes) / statistics.median(resets),
        "n": n,
    }


async def backend_rows(backend: str, n: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, bulk in (("coding episode", False), ("+8 MiB", True)):
        with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
            settings = Settings(data_dir=Path(tmp) / "data", sandbox=backend)
            rows[name] = await row(settings, n, bulk)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for backend in ("bwrap", "docker"):
        n = (15 if args.quick else 50) if backend == "bwrap" else (8 if args.quick else 20)
        if backend == "docker":
            ok, why = docker_available()
            if not ok:
                print(f"docker: skipped ({why})")
                results[backend] = {"skipped": why}
                continue
            print(f"docker: default image {BASE_IMAGE}")
        results[backend] = asyncio.run(backend_rows(backend, n))
    head = (
        f"{'ckpt p50':>9} {'p95':>9} {'resume p50':>11} {'p95':>9} {'reset p50':>10} "
        f"{'resume/reset':>12}"
    )
    print(f"\n{'backend':8} {'row':15} {head}")
    for backend, rows in results.items():
        for name, r in rows.items():
            if name == "skipped":
                continue
            print(
                f"{backend:8} {name:15} {r['checkpoint_p50_ms']:7.1f}ms "
                f"{r['checkpoint_p95_ms']:7.1f}ms {r['resume_p50_ms']:9.1f}ms "
                f"{r['resume_p95_ms']:7.1f}ms {r['reset_p50_ms']:8.1f}ms "
                f"{r['resume_over_reset']:11.1f}x"
            )
    print(json.dumps(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
