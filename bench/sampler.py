"""Task sampling cost at scale: the curriculum sampler beside a uniform draw over a list.

A synthetic catalog of D domains × T tasks (default 100 × 10,000 = 1,000,000 tasks) in one
pack plus a small second pack; half the tasks get recorded outcomes so the curriculum
weights differ. Measured per call, in one process: `Sampler.sample` (seeded and with a
shared generator), `Sampler.record`, and the peer, `PackCatalog.sample` (a filter over
every task, then `random.choice`; the server's first sampler).

    .venv/bin/python bench/sampler.py                 # 100 domains × 10,000 tasks
    .venv/bin/python bench/sampler.py --tasks 100     # 100 × 100
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.loader import Pack
from palaestra.server.sampler import Sampler


def pack(name: str, domains: int, tasks: int) -> Pack:
    short = name.split("/")[1]
    made = {
        f"d{d}-t{i}": Task(
            id=f"d{d}-t{i}",
            family="echo",
            domain=f"{short}/d{d}",
            split="train",
            pack=name,
            version="1.0.0",
            public={},
            private={},
        )
        for d in range(domains)
        for i in range(tasks)
    }
    return Pack(name, "1.0.0", "", "", ["echo"], {"train": False}, "sha256:x", Path("."), made)


def per_call_us(fn: object, n: int) -> float:
    assert callable(fn)
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--domains", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per domain")
    parser.add_argument("-n", type=int, default=20_000, help="calls per measurement")
    args = parser.parse_args()
    catalog = PackCatalog()
    catalog.add(pack("bench/big", args.domains, args.tasks))
    catalog.add(pack("bench/small", 2, 10))
    sampler = Sampler(Settings(sampler_weights={"bench/big": 3.0}), catalog)
    started = time.perf_counter()
    sampler.refresh()
    index_s = time.perf_counter() - started
    refs = [t.ref for t in catalog.select(pack="bench/big")]
    rng = random.Random(0)
    for ref in rng.sample(refs, min(len(refs), 200_000)):
        for _ in range(3):
            sampler.record(ref, "done", 1.0, rng.random() < 0.7)
    shared = random.Random(1)
    n = args.n
    results = {
        "Sampler.sample(seed)": per_call_us(lambda i: sampler.sample(i), n),
        "Sampler.sample(shared rng)": per_call_us(lambda i: sampler.sample(shared), n),
        "Sampler.sample(seed, domain=)": per_call_us(
            lambda i: sampler.sample(i, domain=f"big/d{i % args.domains}"), n
        ),
        "Sampler.record(done)": per_call_us(
            lambda i: sampler.record(refs[i % len(refs)], "done", 0.0, i % 2 == 0), n
        ),
    }
    peer_n = max(3, min(n, 2_000_000 // max(len(refs), 1)))
    results["peer: PackCatalog.sample(seed)"] = per_call_us(
        lambda i: catalog.sample(random.Random(i)), peer_n
    )
    total = len(refs) + 20
    print(f"{args.domains} domains × {args.tasks} tasks + 20: {total:,} tasks")
    print(f"index build: {index_s * 1000:.0f} ms (once, and when packs change)")
    for name, us in results.items():
        print(f"{name:34s} {us:10.1f} µs/call")
    ratio = results["peer: PackCatalog.sample(seed)"] / results["Sampler.sample(seed)"]
    print(f"sampler vs uniform list draw: {ratio:.0f}× faster")


if __name__ == "__main__":
    main()
