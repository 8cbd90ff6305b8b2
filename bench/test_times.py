"""Where the test suite's time goes: seconds per module from pytest's JUnit XML, the total,
and the wall time two workers would take handing modules out in order (`--dist loadfile`,
as `make test` runs), in collection order and longest module first.

    .venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=/tmp/t.xml tests/...
    .venv/bin/python bench/test_times.py /tmp/t.xml [more.xml ...] [--workers 2] [--top 30]

Several XML files (chunks of the suite run one after another) add up. A chunk run on a
loaded machine reads slow: note the load (`uptime`) beside each chunk.
"""

from __future__ import annotations

import argparse
import heapq
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def module_seconds(paths: list[Path]) -> dict[str, float]:
    """Seconds per test module (setup, call and teardown: JUnit's `time`), in file order."""
    seconds: dict[str, float] = defaultdict(float)
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            module = case.get("file") or case.get("classname", "?").replace(".", "/") + ".py"
            seconds[module] += float(case.get("time") or 0)
    return dict(seconds)


def wall(durations: list[float], workers: int) -> float:
    """The wall time of handing `durations` out in order, each to the first free worker."""
    free = [0.0] * workers
    for seconds in durations:
        heapq.heapreplace(free, free[0] + seconds)
    return max(free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", nargs="+", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    seconds = module_seconds(args.xml)
    total = sum(seconds.values())
    print(f"{'seconds':>8}  {'share':>6}  module")
    for module, s in sorted(seconds.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{s:8.1f}  {s / total:6.1%}  {module}")
    in_order = wall(list(seconds.values()), args.workers)
    longest_first = wall(sorted(seconds.values(), reverse=True), args.workers)
    print(f"modules: {len(seconds)}, summed test time: {total:.0f} s")
    print(f"wall on {args.workers} workers, collection order: {in_order:.0f} s")
    print(f"wall on {args.workers} workers, longest module first: {longest_first:.0f} s")
    print(f"ratio (longest first / collection order): {longest_first / in_order:.2f}")


if __name__ == "__main__":
    main()
