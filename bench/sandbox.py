"""Sandbox start-up: bwrap (cold, warm pool), the fork server, `docker run` and `docker exec`.

DESIGN §10: bwrap create → first exec p50 ≤ 15 ms (p99 ≤ 60 ms), from the warm pool
(hand-out → first exec) p50 ≤ 3 ms, and ≥ 20× faster than `docker run --rm IMAGE true`,
measured in the same run.

Per row: create p50 (the `Backend.create` call alone), create → first exec p50/p99 (`true`),
exec round trip p50 (later execs of `true` in the same sandbox), creations per second
(sequential creates, no exec) and idle memory per sandbox with N idle sandboxes open: what
the kernel charges its cgroup (bwrap: the sandbox's own cgroup, plus this process's RSS
growth / N; docker: `docker stats`), and in the JSON the host MemAvailable drop / N, which
is noise on a shared machine. An idle bwrap sandbox is measured as an episode's is between
steps: with one jail started ahead for its next exec (bwrap's two processes and the exec
helper's stub, waiting). docker rows
use the docker CLI against the local engine and are skipped, with the reason, when it is
not up.

    .venv/bin/python bench/sandbox.py            # 200 iterations a row (docker: 30)
    .venv/bin/python bench/sandbox.py --quick    # 40 (docker: 8)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sandbox.forkrun import PythonRun

SPEC = SandboxSpec(workspace_mb=16, memory_mb=256)
DEFAULT_IMAGE = "palaestra/base:bookworm"


@dataclass
class Row:
    name: str
    how: str
    create_ms: list[float] = field(default_factory=list)
    first_ms: list[float] = field(default_factory=list)
    rt_ms: list[float] = field(default_factory=list)
    per_s: float | None = None
    idle_kib: float | None = None
    idle_rss_kib: float | None = None
    idle_host_kib: float | None = None  # host MemAvailable drop: noisy on a shared machine
    skipped: str = ""


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def cgroup_charge_kib(box: object) -> float | None:
    """Memory the kernel charges to a bwrap sandbox's cgroup (None: it has none)."""
    cg = getattr(box, "cgroup", None)
    d = getattr(cg, "memory_dir", None)
    if d is None:
        return None
    for name in ("memory.current", "memory.usage_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            return int((Path(d) / name).read_text()) / 1024
    return None


def parse_size_kib(text: str) -> float:
    """docker stats' "1.2MiB" → KiB."""
    units = {"B": 1 / 1024, "KiB": 1, "MiB": 1024, "GiB": 1024**2, "kB": 1000 / 1024}
    units |= {"MB": 1e6 / 1024, "GB": 1e9 / 1024}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def bwrap_rows(args: argparse.Namespace, runtime: Path) -> list[Row]:
    cold = Row("bwrap cold", "BwrapBackend.create + exec(['true'])")
    backend = BwrapBackend(runtime)
    try:
        async with await backend.create(SPEC) as box:  # warm-up: /etc files, caches
            await box.exec(["true"])
        for _ in range(args.n):
            t0 = time.perf_counter()
            box = await backend.create(SPEC)
            t1 = time.perf_counter()
            await box.exec(["true"])
            t2 = time.perf_counter()
            cold.create_ms.append((t1 - t0) * 1e3)
            cold.first_ms.append((t2 - t0) * 1e3)
            for _ in range(3):
                t3 = time.perf_counter()
                await box.exec(["true"])
                cold.rt_ms.append((time.perf_counter() - t3) * 1e3)
            await box.close()
        # creations per second and idle memory: N sandboxes created back to back, left open
        mem0, rss0 = mem_available_kib(), rss_kib()
        t0 = time.perf_counter()
        boxes = [await backend.create(SPEC) for _ in range(args.idle)]
        cold.per_s = args.idle / (time.perf_counter() - t0)
        for b in boxes:  # idle as an episode's sandbox is between steps: a jail waiting
            ready = getattr(b, "wait_ready", None)
            if ready is not None:
                await ready()
        await asyncio.sleep(0.2)
        cold.idle_host_kib = (mem0 - mem_available_kib()) / args.idle
        cold.idle_rss_kib = (rss_kib() - rss0) / args.idle
        charges = [c for b in boxes if (c := cgroup_charge_kib(b)) is not None]
        if charges:
            # what the kernel charges the sandbox (tmpfs, inodes) plus the server's share
            cold.idle_kib = statistics.fmean(charges) + max(0.0, cold.idle_rss_kib)
        await asyncio.gather(*(b.close() for b in boxes))
    finally:
        await backend.aclose()

    warm = Row("bwrap warm pool", "WarmPool(BwrapBackend, size=4): hand-out + exec(['true'])")
    try:
        from palaestra.sandbox.pool import WarmPool
    except ImportError as e:
        warm.skipped = f"palaestra.sandbox.pool.WarmPool not importable: {e}"
        return [cold, warm]
    pool = WarmPool(BwrapBackend(runtime), size=4)
    try:
        pool.prewarm(SPEC)
        for _ in range(args.n):
            deadline = time.monotonic() + 10
            while pool.pooled < pool.size and time.monotonic() < deadline:
                await asyncio.sleep(0.002)  # refills happen between episodes, not timed
            t0 = time.perf_counter()
            box = await pool.create(SPEC)
            t1 = time.perf_counter()
            await box.exec(["true"])
            t2 = time.perf_counter()
            warm.create_ms.append((t1 - t0) * 1e3)
            warm.first_ms.append((t2 - t0) * 1e3)
            for _ in range(3):
                t3 = time.perf_counter()
                await box.exec(["true"])
                warm.rt_ms.append((time.perf_counter() - t3) * 1e3)
            await box.close()
        warm.idle_kib, warm.idle_rss_kib = cold.idle_kib, cold.idle_rss_kib
        warm.idle_host_kib = cold.idle_host_kib
        deadline = time.monotonic() + 10
        while pool.pooled < pool.size and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        t0 = time.perf_counter()
        got = []
        for _ in range(pool.size):  # what the pool holds ready: hand-outs per second
            got.append(await pool.create(SPEC))
        warm.per_s = len(got) / (time.perf_counter() - t0)
        await asyncio.gather(*(b.close() for b in got))
    finally:
        await pool.aclose()
    return [cold, warm]


async def forkserver_row(args: argparse.Namespace) -> Row:
    row = Row("fork server one-shot", 'PythonForkServer.run("pass"): a fresh sandbox per run')
    try:
        from palaestra.sandbox.forkserver import ForkServerUnavailable, PythonForkServer
    except ImportError as e:
        row.skipped = f"palaestra.sandbox.forkserver not importable: {e}"
        return row
    server = PythonForkServer()
    try:
        await server.start()
    except ForkServerUnavailable as e:
        row.skipped = f"fork server unavailable: {e}"
        return row

    async def run() -> None:
        job = PythonRun("pass", timeout=10, max_output=65536, memory_mb=256, workspace_mb=16)
        r = await server.run(job)
        if r.exit_code != 0:
            raise RuntimeError(f"fork server run failed: {r}")

    try:
        await run()
        t_all = time.perf_counter()
        for _ in range(args.n):
            t0 = time.perf_counter()
            await run()
            ms = (time.perf_counter() - t0) * 1e3
            row.first_ms.append(ms)
            row.rt_ms.append(ms)
        row.per_s = args.n / (time.perf_counter() - t_all)
        row.idle_kib = 0.0  # a one-shot sandbox holds nothing between runs
    finally:
        await server.aclose()
    return row


def docker_reason(image: str) -> str:
    if shutil.which("docker") is None:
        return "docker CLI not found"
    info = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines() or ["docker info failed"]
        return f"docker engine unavailable: {lines[-1]}"
    img = subprocess.run(
        ["docker", "image", "inspect", image], capture_output=True, timeout=20, check=False
    )
    if img.returncode != 0:
        return f"docker image {image} not present locally (build images/ first)"
    return ""


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return (time.perf_counter() - t0) * 1e3


def docker_rows(args: argparse.Namespace) -> list[Row]:
    run = Row("docker run", f"docker run --rm --network none {args.docker_image} true")
    exe = Row("docker exec", f"docker exec CONTAINER true (a running {args.docker_image})")
    why = docker_reason(args.docker_image)
    if why:
        run.skipped = exe.skipped = why
        return [run, exe]
    argv = ["docker", "run", "--rm", "--network", "none", args.docker_image, "true"]
    timed(argv)  # warm-up
    t_all = time.perf_counter()
    for _ in range(args.docker_n):
        run.first_ms.append(timed(argv))
    run.per_s = args.docker_n / (time.perf_counter() - t_all)
    cid = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", args.docker_image, "sleep", "3600"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        timed(["docker", "exec", cid, "true"])
        for _ in range(args.docker_n):
            exe.rt_ms.append(timed(["docker", "exec", cid, "true"]))
        run.idle_kib, run.idle_host_kib = docker_idle_kib(args)
        exe.idle_kib, exe.idle_host_kib = run.idle_kib, run.idle_host_kib
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    return [run, exe]


def docker_idle_kib(args: argparse.Namespace) -> tuple[float | None, float]:
    """Per idle `sleep` container: its cgroup's charge (docker stats) and the host's
    MemAvailable drop, over N containers."""
    n = max(2, min(10, args.idle // 10))
    mem0 = mem_available_kib()
    ids = []
    try:
        for _ in range(n):
            ids.append(
                subprocess.run(
                    ["docker", "run", "-d", "--rm", "--network", "none", args.docker_image,
                     "sleep", "3600"],
                    capture_output=True, text=True, check=True,
                ).stdout.strip()
            )  # fmt: skip
        time.sleep(1.0)
        host = (mem0 - mem_available_kib()) / n
        stats = subprocess.run(
            ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *ids],
            capture_output=True, text=True, check=False,
        ).stdout.split("\n")  # fmt: skip
        used = [parse_size_kib(line.split("/")[0].strip()) for line in stats if "/" in line]
        return (statistics.fmean(used) if used else None), host
    finally:
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)


def fmt(x: float | None, spec: str = "7.2f") -> str:
    return "      —" if x is None else format(x, spec)


async def bench(args: argparse.Namespace, runtime: Path) -> dict[str, Any]:
    ok, why = bwrap_available()
    if not ok:
        raise SystemExit(f"bwrap unusable: {why}")
    steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("bwrap", lambda: bwrap_rows(args, runtime)),
        ("fork server", lambda: forkserver_row(args)),
        ("docker", lambda: asyncio.to_thread(docker_rows, args)),
    ]
    rows: list[Row] = []
    for label, step in steps:
        print(f"measuring {label}...", file=sys.stderr, flush=True)
        got = await step()
        rows += got if isinstance(got, list) else [got]

    print()
    print(
        f"Sandbox start-up, {args.n} iterations a row (docker {args.docker_n}), "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print()
    print(
        "| sandbox              | create p50 ms | →first exec p50 ms | p99 ms | exec rt p50 ms "
        "| creations/s | idle KiB/sandbox |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r.skipped:
            print(f"| {r.name:20s} | skipped: {r.skipped} |")
            continue
        print(
            f"| {r.name:20s} | {fmt(pct(r.create_ms, 0.5)):>13s} | "
            f"{fmt(pct(r.first_ms, 0.5)):>18s} | {fmt(pct(r.first_ms, 0.99)):>6s} | "
            f"{fmt(pct(r.rt_ms, 0.5)):>14s} | {fmt(r.per_s, '11.0f'):>11s} | "
            f"{fmt(r.idle_kib, '16.0f'):>16s} |"
        )
    print()
    by = {r.name: r for r in rows}
    cold, warm = by["bwrap cold"], by["bwrap warm pool"]
    cold_p50 = pct(cold.first_ms, 0.5)
    cold_p99 = pct(cold.first_ms, 0.99)
    warm_create = pct(warm.create_ms, 0.5)
    warm_first = pct(warm.first_ms, 0.5)
    drun = pct(by["docker run"].first_ms, 0.5)
    dexec = pct(by["docker exec"].rt_ms, 0.5)
    ratio = drun / cold_p50 if drun and cold_p50 else None
    exec_ratio = dexec / pct(cold.rt_ms, 0.5) if dexec and cold.rt_ms else None
    checks = {
        "cold_p50_le_15ms": cold_p50 is not None and cold_p50 <= 15,
        "cold_p99_le_60ms": cold_p99 is not None and cold_p99 <= 60,
        "warm_first_exec_p50_le_3ms": warm_first is not None and warm_first <= 3,
        "docker_run_ratio_ge_20": ratio is not None and ratio >= 20,
    }

    def verdict(key: str, known: bool = True) -> str:
        return "n/a" if not known else ("PASS" if checks[key] else "MISS")

    print(f"bwrap cold create → first exec p50: {fmt(cold_p50)} ms (target ≤ 15: "
          f"{verdict('cold_p50_le_15ms')}), p99 {fmt(cold_p99)} ms (target ≤ 60: "
          f"{verdict('cold_p99_le_60ms')})")  # fmt: skip
    if warm.skipped:
        print(f"warm pool: skipped ({warm.skipped})")
    else:
        print(
            f"warm pool hand-out → first exec p50: {fmt(warm_first)} ms (target ≤ 3: "
            f"{verdict('warm_first_exec_p50_le_3ms')}); hand-out alone p50 {fmt(warm_create)} ms"
        )
    if ratio is None:
        print(f"docker run / bwrap cold: n/a ({by['docker run'].skipped})")
    else:
        print(f"docker run / bwrap cold (p50): {ratio:.1f}× (target ≥ 20×: "
              f"{verdict('docker_run_ratio_ge_20')})")  # fmt: skip
    if exec_ratio is not None:
        print(f"docker exec / bwrap exec round trip (p50): {exec_ratio:.1f}×")
    fs = by["fork server one-shot"]
    if not fs.skipped and cold_p50:
        print(f"bwrap cold / fork server one-shot (p50): {cold_p50 / pct(fs.first_ms, 0.5):.1f}×")

    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "bench": "sandbox",
        "iterations": args.n,
        "docker_iterations": args.docker_n,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "rows": {
            r.name: {
                "skipped": r.skipped or None,
                "create_p50_ms": r3(pct(r.create_ms, 0.5)),
                "first_exec_p50_ms": r3(pct(r.first_ms, 0.5)),
                "first_exec_p99_ms": r3(pct(r.first_ms, 0.99)),
                "exec_rt_p50_ms": r3(pct(r.rt_ms, 0.5)),
                "creations_per_s": r3(r.per_s),
                "idle_kib_per_sandbox": r3(r.idle_kib),
                "idle_rss_kib_per_sandbox": r3(r.idle_rss_kib),
                "idle_host_memavailable_kib_per_sandbox": r3(r.idle_host_kib),
            }
            for r in rows
        },
        "ratio_docker_run_vs_bwrap_cold": r3(ratio),
        "ratio_docker_exec_vs_bwrap_exec": r3(exec_ratio),
        "checks": checks,
        "pass": all(checks.values()),
        "mean_first_exec_ms_bwrap_cold": r3(statistics.fmean(cold.first_ms)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--n", type=int, default=None, help="iterations a row (default 200)")
    parser.add_argument("--docker-n", type=int, default=None, help="docker iterations (30)")
    parser.add_argument("--idle", type=int, default=None, help="idle sandboxes (default 100)")
    parser.add_argument("--docker-image", default=DEFAULT_IMAGE, help="image for docker rows")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    args.n = args.n or (40 if args.quick else 200)
    args.docker_n = args.docker_n or (8 if args.quick else 30)
    args.idle = args.idle or (20 if args.quick else 100)
    base = Path("/run/palaestra/bench") if os.geteuid() == 0 else None
    runtime = (base or Path(f"/tmp/palaestra-bench-{os.getuid()}")) / f"sandbox-{os.getpid()}"
    try:
        figures = asyncio.run(bench(args, runtime))
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(runtime)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
