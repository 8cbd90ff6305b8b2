"""Store microbench: queued `add_step` (the step's hot path), committed steps/s, replay reads;
beside the same store with its writer's linger off (`store.LINGER_S = 0`: a transaction per
wake-up), in the same run.

.venv/bin/python bench/store.py                        # embedded SQLite in a temp dir
.venv/bin/python bench/store.py postgresql://…/db      # a PostgreSQL database
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from palaestra.sdk.models import EpisodeState
from palaestra.server import store as store_module
from palaestra.server.db import Database
from palaestra.server.store import Store

EPISODES, STEPS, READS, RUNS = 50, 20_000, 500, 5
RECORD = (
    '{"index": 0, "action": {"tool": "echo", "arguments": {}}, "observation": {"text": "'
    + "x" * 300
    + '"}, "reward": 0.0}'
)


def once(target: str | Path, run: int) -> tuple[float, float, float]:
    store = Store(Database.open(target))
    now = time.time()
    ids = [f"b{run}-{time.time_ns()}-{i}" for i in range(EPISODES)]
    numbers = []
    for eid in ids:
        state = EpisodeState(
            episode_id=eid,
            task="t",
            family="echo",
            domain="d",
            split="train",
            status="active",
            step_count=0,
            created_at=now,
            updated_at=now,
        )
        numbers.append(store.create_episode(state, "x", False).number)
    store.flush()
    start = time.perf_counter()
    for i in range(STEPS):
        store.add_step(numbers[i % EPISODES], i, f"r{i}", RECORD)
    queued = time.perf_counter() - start
    store.flush()
    total = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(READS):
        store.reads.find_step(ids[i % EPISODES], f"r{i}")  # blocking: this is no loop
    reads = time.perf_counter() - start
    store.close()
    return queued / STEPS * 1e6, STEPS / total, reads / READS * 1e6


def measured(linger: float) -> tuple[float, float, float]:
    store_module.LINGER_S = linger
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else Path(tmp) / "bench.sqlite3"
        runs = [once(target, run) for run in range(RUNS)]
    queued, committed, read = (statistics.median(r[k] for r in runs) for k in range(3))
    return queued, committed, read


def main() -> None:
    shipped = store_module.LINGER_S
    for label, linger in (("linger off", 0.0), (f"linger {shipped * 1000:g} ms", shipped)):
        queued, committed, read = measured(linger)
        print(
            f"{label:>14}: add_step queued {queued:.2f} us/step, committed {committed:.0f} "
            f"steps/s, find_step {read:.0f} us (median of {RUNS})"
        )


if __name__ == "__main__":
    main()
