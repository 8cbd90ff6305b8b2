"""How long a generator waits on environments: the rollout collector on the coding family.

A simulated generator of fixed latency stands in for the model (each turn takes
`--latency` seconds, however many run at once: a continuous-batching server with room for
all). The real collector (palaestra.sdk.train) runs N episodes at once against a real
`palaestra serve` on loopback, on `openai/humaneval` (bwrap sandboxes), in groups of 8,
refilling as episodes finish (N/8 lanes of groups, started spread over one episode's
generation time so that episodes are not in lock-step). Every episode does three turns:
the oracle writes solution.py, `run_tests` runs the docstring examples in the sandbox,
the oracle submits (the hidden tests run in a fresh sandbox).

Generator wait share = 1 − (generator busy slot-time) / (N × window): the share of the
generator's N slots that sat idle because their episode was in the environment (reset,
step, verification, HTTP, the collector's own work). Measured at N = 64, 256 and 1,024,
with the batch routes on and off, in the same run. Target (DESIGN §10 / issue 8): < 5 %
at 256 with batch routes.

    .venv/bin/python bench/rollout.py                 # 64, 256, 1024; 30 s windows
    .venv/bin/python bench/rollout.py --quick         # 64, 256; 10 s windows
    options: --latency S --window S --warmup S --concurrency 64,256,1024 --json PATH
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.train.collector import CollectorConfig, RolloutCollector
from palaestra.sdk.train.types import Generation, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = (
    Action(tool="oracle"),  # writes solution.py
    Action(tool="run_tests"),  # the docstring's examples, in the episode's sandbox
    Action(tool="oracle"),  # submit: hidden tests in a fresh sandbox
)


class SimGenerator:
    """Fixed latency a turn, unlimited batch; returns the turn number as its one token and
    records how much generator slot-time fell inside the measuring window."""

    token_exact = True
    weight_version = 0

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.window: tuple[float, float] | None = None
        self.busy_s = 0.0
        self.calls = 0

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        start = time.monotonic()
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            # Also when cancelled at the end of the run: its slot was busy until then.
            end = time.monotonic()
            if self.window is not None:
                lo, hi = self.window
                self.busy_s += max(0.0, min(end, hi) - max(start, lo))
                self.calls += 1
        return Generation([len(prompt_ids) - 1], [0.0], "length", 0)


class ScriptFormat:
    """Turn k plays SCRIPT[k]; environment turns add no tokens (the generator is fake)."""

    stop_token_ids: tuple[int, ...] = ()

    def prompt_ids(self, reset: ResetResponse) -> list[int]:
        return [0]

    def observation_ids(self, reply: StepResponse) -> list[int]:
        return []

    def error_ids(self, message: str) -> list[int]:
        raise RuntimeError(f"the scripted episode was refused: {message}")

    def parse_action(self, ids: list[int]) -> Action:
        return SCRIPT[min(ids[0], len(SCRIPT) - 1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def server(workdir: Path) -> Iterator[tuple[str, str]]:
    port, log = free_port(), workdir / "palaestra.log"
    binary = ROOT / ".venv" / "bin" / "palaestra"
    cmd = [
        str(binary) if binary.exists() else "palaestra",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(workdir / "data"),
        "--log-level",
        "warning",
        "--max-episodes",
        "4096",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {log.read_text()}")
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"server not ready: {log.read_text()}")
            time.sleep(0.1)
        yield url, (workdir / "data" / "admin.token").read_text().strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Row:
    concurrency: int
    batch_routes: bool
    wait_share: float
    episodes_per_s: float
    env_s_per_step: float
    broken: int
    batch_calls: int
    batch_items: int


async def measure(
    url: str, token: str, tasks: list[str], n: int, batch: bool, args: argparse.Namespace
) -> Row:
    gen = SimGenerator(args.latency)
    config = CollectorConfig(
        concurrency=n,
        group_size=8,
        max_turns=len(SCRIPT),
        turn_timeout_s=300,
        episode_timeout_s=900,
        batch_routes=batch,
        reset_options={"oracle": True},
        sampling=SamplingParams(max_tokens=1),
    )
    collector = RolloutCollector.over_http(
        url, gen, ScriptFormat(), tasks, config, token=token, seed=n
    )
    trajectories = 0
    env_s = 0.0
    steps = 0
    counting = False

    lanes = max(1, n // config.group_size)
    cycle = args.latency * len(SCRIPT)

    async def lane(index: int) -> None:
        """One group after another; lanes start spread over one episode's generation time,
        so the episodes are not in lock-step (a steady state, not a synchronized burst)."""
        nonlocal trajectories, env_s, steps
        await asyncio.sleep(cycle * index / lanes)
        while True:
            group = await collector.group(*collector.next_group())
            if group is not None and counting:
                trajectories += len(group.trajectories)
                env_s += sum(t.environment_s for t in group.trajectories)
                steps += sum(t.turns for t in group.trajectories)

    tasks = [asyncio.create_task(lane(i)) for i in range(lanes)]
    try:
        await asyncio.sleep(cycle + args.warmup)
        for task in tasks:
            if task.done():
                task.result()
        start = time.monotonic()
        gen.window = (start, start + args.window)
        counting = True
        await asyncio.sleep(args.window)
        counting = False
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await collector.drain()
        await collector.aclose()
    broken = sum(v for k, v in collector.stats.items() if k.startswith("broken:"))
    calls = collector._steps.calls if collector._steps is not None else 0
    items = collector._steps.items if collector._steps is not None else 0
    return Row(
        concurrency=n,
        batch_routes=batch,
        wait_share=1.0 - gen.busy_s / (n * args.window),
        episodes_per_s=trajectories / args.window,
        env_s_per_step=env_s / steps if steps else float("nan"),
        broken=broken,
        batch_calls=calls,
        batch_items=items,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="palaestra-bench-rollout-") as tmp,
        server(Path(tmp)) as (url, token),
    ):
        listing = httpx.get(
            f"{url}/v1/tasks",
            params={"pack": "openai/humaneval", "limit": 1000},
            headers={"authorization": f"Bearer {token}"},
        ).json()
        tasks = [t["id"] for t in listing["tasks"]]
        rows: list[Row] = []
        for n in args.concurrency:
            for batch in (True, False):
                row = await measure(url, token, tasks, n, batch, args)
                rows.append(row)
                print(
                    f"N={n:5d} batch={'on ' if batch else 'off'} wait share "
                    f"{row.wait_share:6.1%}  {row.episodes_per_s:6.1f} episodes/s  "
                    f"env {row.env_s_per_step * 1e3:7.1f} ms/step  broken {row.broken}",
                    file=sys.stderr,
                    flush=True,
                )
    print()
    print(
        f"Generator wait share on openai/humaneval (coding, bwrap), simulated generator "
        f"{args.latency:g} s a turn, {args.window:g} s windows, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print()
    print(
        "| episodes | wait share, batch on | wait share, batch off | episodes/s on | "
        "episodes/s off | env ms/step on | env ms/step off |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    by = {(r.concurrency, r.batch_routes): r for r in rows}
    for n in args.concurrency:
        on, off = by[(n, True)], by[(n, False)]
        print(
            f"| {n:,} | {on.wait_share:.1%} | {off.wait_share:.1%} | {on.episodes_per_s:.1f} "
            f"| {off.episodes_per_s:.1f} | {on.env_s_per_step * 1e3:.1f} "
            f"| {off.env_s_per_step * 1e3:.1f} |"
        )
    target = by.get((256, True))
    if target is not None:
        verdict = "PASS" if target.wait_share < 0.05 else "MISS"
        share = f"{target.wait_share:.1%}"
        print(f"\nwait share at 256 with batch routes: {share} (target < 5%: {verdict})")
    return {
        "bench": "rollout",
        "latency_s": args.latency,
        "window_s": args.window,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "rows": [r.__dict__ for r in rows],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 and 256 only, 10 s windows")
    parser.add_argument("--latency", type=float, default=5.0, help="generator s a turn")
    parser.add_argument("--window", type=float, default=None, help="measuring window, s")
    parser.add_argument("--warmup", type=float, default=None, help="s before the window")
    parser.add_argument("--concurrency", type=str, default=None, help="e.g. 64,256,1024")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.window = args.window or (10.0 if args.quick else 30.0)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 5.0)
    default = "64,256" if args.quick else "64,256,1024"
    args.concurrency = [int(x) for x in (args.concurrency or default).split(",")]
    figures = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
