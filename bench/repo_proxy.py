"""The repository runner's worker round trip: calls through repo_proxy.py to a real
repo_worker.py process beside the same calls in-process (rr-lru-cache's unsolved LRUCache
and rr-roman-numerals' to_roman, copied into a temporary workspace).

Prints µs per operation for a module-level function call (one round trip), a method call
(two: lookup, call), ``len`` and ``in`` (one each), and the ratio to in-process. The
repository tasks' heaviest hidden test makes about 25 000 round trips. Then one large call:
the Terminal-Bench 2 / Harbor cookbook multi-reward task's performance test (100 000
records in, 50 000 out, under 2 s), as its oracle's `deduplicate` (pytest_boot.py's worker).

    .venv/bin/python bench/repo_proxy.py            # 3000 operations a kind
    .venv/bin/python bench/repo_proxy.py --n 500
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from palaestra.verifiers.programs import repo_wire

sys.modules.setdefault("repo_wire", repo_wire)  # as repo_runner.py registers it
from palaestra.verifiers.programs import repo_proxy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "packs" / "terminal-core" / "tasks"
PACKAGES = {"cachelib": "rr-lru-cache", "numerals": "rr-roman-numerals"}
DEDUP = ROOT / "tests" / "fixtures" / "harbor-cookbook" / "multi-reward" / "solution" / "solve.sh"


def _per_op(n: int, op: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(n):
        op(i)
    return (time.perf_counter() - start) / n * 1e6


def _ops(lru: type, to_roman: Callable[[int], str]) -> dict[str, Callable[[int], object]]:
    cache = lru(5)
    for k in range(5):
        cache.put(k, k)
    return {
        "function call": lambda i: to_roman(i % 3999 + 1),
        "method call": lambda i: cache.get(i % 7, None),
        "len": lambda i: len(cache),
        "in": lambda i: (i % 7) in cache,
    }


def _large_call(dedup: Callable[[list[dict[str, object]]], list[object]]) -> float:
    """Seconds of one call of the multi-reward task's performance test."""
    records = [
        {"id": i, "email": f"user{i % 50000}@example.com", "name": f"User {i}"}
        for i in range(100_000)
    ]
    start = time.perf_counter()
    assert len(dedup(records)) == 50_000
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    n = parser.parse_args().n
    with tempfile.TemporaryDirectory(prefix="repo-proxy-bench-") as tmp:
        workdir = os.path.realpath(tmp)
        for pkg, task in PACKAGES.items():
            shutil.copytree(TASKS / task / "environment" / pkg, Path(workdir) / pkg)
        script = DEDUP.read_text()  # solve.sh writes deduplicate.py from a heredoc
        source = script.split("<< 'EOF'\n", 1)[1].split("\nEOF", 1)[0]
        (Path(workdir) / "deduplicate.py").write_text(source + "\n")
        sys.path.append(workdir)
        local = _ops(
            importlib.import_module("cachelib.lru").LRUCache,
            importlib.import_module("numerals.roman").to_roman,
        )
        large_here = _large_call(importlib.import_module("deduplicate").deduplicate)
        for name in [m for m in sys.modules if m.split(".")[0] in (*PACKAGES, "deduplicate")]:
            del sys.modules[name]
        worker = Path(repo_wire.__file__).with_name("repo_worker.py")
        remote = repo_proxy.Remote(str(worker), workdir, sorted(PACKAGES), timeout_s=30.0)
        repo_proxy.install(remote, lambda p: os.path.realpath(p).startswith(workdir + "/"), set())
        try:
            proxied = _ops(
                importlib.import_module("cachelib.lru").LRUCache,
                importlib.import_module("numerals.roman").to_roman,
            )
            print(f"{'operation':<14} {'in-process µs':>14} {'proxied µs':>11} {'ratio':>8}")
            for kind, op in proxied.items():
                here, there = _per_op(n, local[kind]), _per_op(n, op)
                print(f"{kind:<14} {here:>14.2f} {there:>11.1f} {there / here:>7.0f}x")
            there = _large_call(importlib.import_module("deduplicate").deduplicate)
            ratio = there / large_here
            print(f"100k-record call: {large_here:.3f} s in-process, {there:.3f} s proxied", end="")
            print(f", {ratio:.0f}x")
        finally:
            remote.close()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
