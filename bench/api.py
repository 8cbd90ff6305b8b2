"""No-op step over HTTP: palaestra beside OpenEnv's own server, same load generator, same run.

DESIGN §10: steps/s at 64 clients ≥ 1.5× OpenEnv's HTTP routes; p50 ≤ 1 ms at 1 client.
With `--batch`: steps/s through `POST /v1/batch/step` (64 episodes a call) beside OpenEnv's
WebSocket sessions (64 sessions, its fastest path), target ≥ 5×.

Both servers run as subprocesses (one uvicorn worker each, log level warning, access log
off, uvloop + httptools). This process is the load generator: raw asyncio keep-alive
HTTP/1.1 connections with pre-built request bytes (an `asyncio.Protocol`, much cheaper
than an HTTP client library), so as little CPU as possible goes to the generator.

    .venv/bin/python bench/api.py            # 3 rounds, 5 s a phase
    .venv/bin/python bench/api.py --quick    # 1 round, 2 s a phase
    .venv/bin/python bench/api.py --batch    # also: batch steps vs OpenEnv WebSocket
    .venv/bin/python bench/api.py --batch-only --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apiservers import (  # bench/apiservers.py, beside this script
    ECHO_TASK,
    OPENENV_VERSION,
    Conn,
    HTTPError,
    Target,
    checked,
    connect,
    delete,
    post,
    servers,
)


# -- measurement ------------------------------------------------------------------------------
@dataclass
class Round:
    p50_ms: float
    p99_ms: float
    mean_ms: float
    steps_1: int
    steps_per_s_64: float
    p50_ms_64: float
    p99_ms_64: float
    server_cpu_us_per_step_64: float
    generator_cpu_us_per_step_64: float


@dataclass
class Result:
    name: str
    rounds: list[Round] = field(default_factory=list)

    def median(self, key: str) -> float:
        return float(statistics.median(getattr(r, key) for r in self.rounds))


def pct(sorted_ns: list[int], q: float) -> float:
    index = min(len(sorted_ns) - 1, max(0, round(q * (len(sorted_ns) - 1))))
    return sorted_ns[index] / 1e6


async def one_client(target: Target, warmup: float, duration: float) -> tuple[list[int], int]:
    conn, step = await target.open_client()
    clock = time.perf_counter_ns
    try:
        end = clock() + int(warmup * 1e9)
        while clock() < end:
            await checked(conn, step)
        latencies: list[int] = []
        end = clock() + int(duration * 1e9)
        while True:
            t0 = clock()
            status, body = await conn.request(step)
            t1 = clock()
            if status != 200:
                raise HTTPError(f"HTTP {status}: {body[:300]!r}")
            latencies.append(t1 - t0)
            if t1 >= end:
                break
        return latencies, len(latencies)
    finally:
        await target.close_client(conn)


async def many_clients(
    target: Target, clients: int, warmup: float, duration: float
) -> tuple[float, list[int], float, float]:
    opened = await asyncio.gather(*(target.open_client() for _ in range(clients)))
    return await closed_loop(target, opened, warmup, duration)


async def closed_loop(
    target: Target, opened: list[tuple[Conn, bytes]], warmup: float, duration: float
) -> tuple[float, list[int], float, float]:
    """Each opened client steps in a closed loop; steps/s, latencies (ns), server and
    generator CPU µs a step over the window after `warmup`. Closes the clients."""
    clock = time.perf_counter_ns
    done = 0
    recording = False
    stop = False
    latencies: list[int] = []

    async def worker(conn: Conn, step: bytes) -> None:
        nonlocal done
        while not stop:
            t0 = clock()
            status, body = await conn.request(step)
            if status != 200:
                raise HTTPError(f"HTTP {status}: {body[:300]!r}")
            done += 1
            if recording:
                latencies.append(clock() - t0)

    tasks = [asyncio.create_task(worker(c, s)) for c, s in opened]
    try:
        await asyncio.sleep(warmup)
        for task in tasks:
            if task.done():
                task.result()
        recording = True
        n0, t0, cpu0, gen0 = done, clock(), target.cpu_s(), time.process_time()
        await asyncio.sleep(duration)
        n1, t1, cpu1, gen1 = done, clock(), target.cpu_s(), time.process_time()
        recording = False
        stop = True
        await asyncio.gather(*tasks)
    finally:
        stop = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(target.close_client(c) for c, _ in opened))
    steps = n1 - n0
    rate = steps / ((t1 - t0) / 1e9)
    return rate, latencies, (cpu1 - cpu0) / steps * 1e6, (gen1 - gen0) / steps * 1e6


async def measure(target: Target, clients: int, warmup: float, duration: float) -> Round:
    gc.collect()
    gc.disable()
    try:
        lat, n = await one_client(target, warmup, duration)
        lat.sort()
        rate, lat64, server_us, gen_us = await many_clients(target, clients, warmup, duration)
        lat64.sort()
    finally:
        gc.enable()
    return Round(
        p50_ms=pct(lat, 0.50),
        p99_ms=pct(lat, 0.99),
        mean_ms=sum(lat) / len(lat) / 1e6,
        steps_1=n,
        steps_per_s_64=rate,
        p50_ms_64=pct(lat64, 0.50),
        p99_ms_64=pct(lat64, 0.99),
        server_cpu_us_per_step_64=server_us,
        generator_cpu_us_per_step_64=gen_us,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="palaestra-bench-api-") as tmp,
        servers(Path(tmp)) as (pal, oe),
    ):
        figures: dict[str, Any] = {}
        if args.batch or args.batch_only:
            figures["batch"] = await run_batch(pal, oe, args)
        if args.batch_only:
            return figures
        results = {t.name: Result(t.name) for t in (pal, oe)}
        for i in range(args.rounds):
            order: list[Target] = [pal, oe] if i % 2 == 0 else [oe, pal]
            for target in order:
                r = await measure(target, args.clients, args.warmup, args.duration)
                results[target.name].rounds.append(r)
                print(
                    f"round {i + 1}/{args.rounds} {target.name:9s} p50 {r.p50_ms:.3f} ms  "
                    f"p99 {r.p99_ms:.3f} ms  {r.steps_per_s_64:,.0f} steps/s at {args.clients}",
                    file=sys.stderr,
                    flush=True,
                )
    return {**report(results[pal.name], results[oe.name], args), **figures}


# -- batch mode: /v1/batch/step vs OpenEnv's WebSocket sessions ------------------------------
async def palaestra_batch_client(target: Target, per_call: int) -> tuple[Conn, bytes, list[str]]:
    """A connection with `per_call` fresh episodes and the bytes of one batch step of all."""
    conn = await connect(target.port)
    reset = {"task": ECHO_TASK, "options": {"max_steps": 1_000_000_000}}
    body = post("/v1/batch/reset", {"items": [reset] * per_call}, target.port, target.token)
    items = json.loads(await checked(conn, body))["items"]
    if any(item["error"] for item in items):
        raise HTTPError(f"batch reset failed: {items[:2]}")
    episodes = [item["result"]["episode_id"] for item in items]
    action = {"tool": "echo", "arguments": {"text": "hi"}}
    step = post(
        "/v1/batch/step",
        {"items": [{"episode_id": e, "action": action} for e in episodes]},
        target.port,
        target.token,
    )
    reply = json.loads(await checked(conn, step))["items"]
    if len(reply) != per_call or any(
        r["error"] or r["result"]["observation"]["text"] != "hi" for r in reply
    ):
        raise HTTPError(f"unexpected batch step reply: {reply[:2]}")
    return conn, step, episodes


async def palaestra_batch(
    target: Target, clients: int, per_call: int, warmup: float, duration: float
) -> tuple[float, float, float]:
    """(steps/s, p50 ms a call, server µs/step) with `clients` callers of `per_call` each."""
    opened = [await palaestra_batch_client(target, per_call) for _ in range(clients)]
    clock = time.perf_counter_ns
    done = 0
    stop = False
    recording = False
    latencies: list[int] = []

    async def worker(conn: Conn, step: bytes) -> None:
        nonlocal done
        while not stop:
            t0 = clock()
            status, body = await conn.request(step)
            if status != 200 or b'"error":{' in body:
                raise HTTPError(f"HTTP {status}: {body[:300]!r}")
            done += per_call
            if recording:
                latencies.append(clock() - t0)

    tasks = [asyncio.create_task(worker(c, s)) for c, s, _ in opened]
    try:
        await asyncio.sleep(warmup)
        recording = True
        n0, t0, cpu0 = done, clock(), target.cpu_s()
        await asyncio.sleep(duration)
        n1, t1, cpu1 = done, clock(), target.cpu_s()
        stop = True
        await asyncio.gather(*tasks)
    finally:
        stop = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn, _, episodes in opened:
            for episode in episodes:
                closing = delete(f"/v1/episodes/{episode}", target.port, target.token)
                await checked(conn, closing, ok=(200, 204))
            conn.close()
    latencies.sort()
    steps = n1 - n0
    return steps / ((t1 - t0) / 1e9), pct(latencies, 0.5), (cpu1 - cpu0) / steps * 1e6


async def openenv_ws(
    target: Target, sessions: int, warmup: float, duration: float
) -> tuple[float, float, float]:
    """(steps/s, p50 ms a step, server µs/step): `sessions` WebSocket sessions, each a
    closed loop of `{"type": "step"}` messages, as OpenEnv's own client sends them."""
    from websockets.asyncio.client import connect as ws_connect

    url = f"ws://127.0.0.1:{target.port}/ws"
    step = json.dumps({"type": "step", "data": {"message": "hi"}})
    conns = []
    for _ in range(sessions):
        ws = await ws_connect(url, max_size=None, ping_interval=None, compression=None)
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        await ws.recv()
        await ws.send(step)
        reply = json.loads(await ws.recv())
        if reply.get("data", {}).get("observation", {}).get("echoed_message") != "hi":
            raise HTTPError(f"unexpected OpenEnv WebSocket reply: {reply}")
        conns.append(ws)
    clock = time.perf_counter_ns
    done = 0
    stop = False
    recording = False
    latencies: list[int] = []

    async def worker(ws: Any) -> None:
        nonlocal done
        while not stop:
            t0 = clock()
            await ws.send(step)
            reply = await ws.recv()
            if '"type":"error"' in reply or '"type": "error"' in reply:
                raise HTTPError(f"OpenEnv WebSocket error: {reply[:300]}")
            done += 1
            if recording:
                latencies.append(clock() - t0)

    tasks = [asyncio.create_task(worker(ws)) for ws in conns]
    try:
        await asyncio.sleep(warmup)
        recording = True
        n0, t0, cpu0 = done, clock(), target.cpu_s()
        await asyncio.sleep(duration)
        n1, t1, cpu1 = done, clock(), target.cpu_s()
        stop = True
        await asyncio.gather(*tasks)
    finally:
        stop = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ws in conns:
            with contextlib.suppress(Exception):
                await ws.send(json.dumps({"type": "close"}))
                await ws.close()
    latencies.sort()
    steps = n1 - n0
    return steps / ((t1 - t0) / 1e9), pct(latencies, 0.5), (cpu1 - cpu0) / steps * 1e6


async def run_batch(pal: Target, oe: Target, args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, list[tuple[float, float, float]]] = {"palaestra": [], "OpenEnv": []}
    for i in range(args.rounds):
        order = ["palaestra", "OpenEnv"] if i % 2 == 0 else ["OpenEnv", "palaestra"]
        for name in order:
            gc.collect()
            gc.disable()
            try:
                if name == "palaestra":
                    r = await palaestra_batch(
                        pal, args.batch_clients, args.per_call, args.warmup, args.duration
                    )
                else:
                    r = await openenv_ws(oe, args.ws_sessions, args.warmup, args.duration)
            finally:
                gc.enable()
            rows[name].append(r)
            print(
                f"batch round {i + 1}/{args.rounds} {name:9s} {r[0]:,.0f} steps/s  "
                f"p50 {r[1]:.2f} ms a call  server {r[2]:.0f} µs/step",
                file=sys.stderr,
                flush=True,
            )

    def med(name: str, k: int) -> float:
        return float(statistics.median(r[k] for r in rows[name]))

    ratio = med("palaestra", 0) / med("OpenEnv", 0)
    cpu_ratio = med("OpenEnv", 2) / med("palaestra", 2)
    print()
    print(
        f"Batch steps: palaestra {args.batch_clients} callers × {args.per_call} episodes a "
        f"POST /v1/batch/step, vs OpenEnv {args.ws_sessions} WebSocket sessions; medians of "
        f"{args.rounds} round(s), {args.duration:g} s a phase, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print()
    print("| server                     | steps/s  | p50 ms a call | server µs/step |")
    print("| -------------------------- | -------- | ------------- | -------------- |")
    print(
        f"| palaestra batch ({args.per_call:>3d}/call) | {med('palaestra', 0):8,.0f} "
        f"| {med('palaestra', 1):13.2f} | {med('palaestra', 2):14.1f} |"
    )
    print(
        f"| OpenEnv WebSocket ({args.ws_sessions:>3d})    | {med('OpenEnv', 0):8,.0f} "
        f"| {med('OpenEnv', 1):13.2f} | {med('OpenEnv', 2):14.1f} |"
    )
    print()
    verdict = "PASS" if ratio >= 5 else "MISS"
    print(
        f"batch steps/s ratio palaestra/OpenEnv WebSocket: {ratio:.2f}x (target >= 5x: {verdict})"
    )
    print(f"server CPU per step, OpenEnv/palaestra: {cpu_ratio:.2f}x")
    print()
    return {
        "per_call": args.per_call,
        "batch_clients": args.batch_clients,
        "ws_sessions": args.ws_sessions,
        "ratio_steps_per_s": round(ratio, 3),
        "ratio_server_cpu_per_step": round(cpu_ratio, 3),
        "target_ratio": 5.0,
        "pass_ratio": ratio >= 5,
        "palaestra_steps_per_s": round(med("palaestra", 0), 1),
        "openenv_ws_steps_per_s": round(med("OpenEnv", 0), 1),
        "palaestra_server_us_per_step": round(med("palaestra", 2), 2),
        "openenv_server_us_per_step": round(med("OpenEnv", 2), 2),
    }


def report(pal: Result, oe: Result, args: argparse.Namespace) -> dict[str, Any]:
    c = args.clients
    rows = []
    for res in (pal, oe):
        rows.append(
            f"| {res.name:9s} | {res.median('p50_ms'):10.3f} | {res.median('p99_ms'):10.3f} "
            f"| {res.median('steps_per_s_64'):14,.0f} | {res.median('p50_ms_64'):11.2f} "
            f"| {res.median('server_cpu_us_per_step_64'):13.0f} "
            f"| {res.median('generator_cpu_us_per_step_64'):10.0f} |"
        )
    ratio = pal.median("steps_per_s_64") / oe.median("steps_per_s_64")
    p50 = pal.median("p50_ms")
    cpu_ratio = oe.median("server_cpu_us_per_step_64") / pal.median("server_cpu_us_per_step_64")
    print()
    print(
        f"No-op step over HTTP (loopback); medians of {args.rounds} round(s), "
        f"{args.duration:g} s a phase, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print()
    print(
        f"| server    | p50 ms (1) | p99 ms (1) | steps/s ({c:>2d} cl) | p50 ms ({c}) "
        "| server µs/step | gen µs/step |"
    )
    print(
        "| --------- | ---------- | ---------- | -------------- | ----------- "
        "| ------------- | ---------- |"
    )
    for row in rows:
        print(row)
    print()
    ok_ratio = "PASS" if ratio >= 1.5 else "MISS"
    ok_p50 = "PASS" if p50 <= 1.0 else "MISS"
    print(
        f"steps/s ratio palaestra/OpenEnv at {c} clients: {ratio:.2f}x  "
        f"(target >= 1.5x: {ok_ratio})"
    )
    print(f"palaestra p50 at 1 client: {p50:.3f} ms  (target <= 1 ms: {ok_p50})")
    print(
        f"server CPU per step, OpenEnv/palaestra: {cpu_ratio:.2f}x  (robust to other load on "
        "the machine; steps/s is not)"
    )
    print(
        "(server/gen µs/step: CPU time the server process / this load generator spent per step "
        f"in the {c}-client phase)"
    )
    return {
        "bench": "api",
        "clients": c,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "cpus": os.cpu_count(),
        "openenv_version": OPENENV_VERSION,
        "ratio_steps_per_s": round(ratio, 3),
        "ratio_server_cpu_per_step": round(cpu_ratio, 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "target_ratio": 1.5,
        "target_p50_ms": 1.0,
        "pass_ratio": ratio >= 1.5,
        "pass_p50": p50 <= 1.0,
        "servers": {
            res.name: {
                "p50_ms": round(res.median("p50_ms"), 4),
                "p99_ms": round(res.median("p99_ms"), 4),
                "steps_per_s": round(res.median("steps_per_s_64"), 1),
                "p50_ms_at_clients": round(res.median("p50_ms_64"), 4),
                "p99_ms_at_clients": round(res.median("p99_ms_64"), 4),
                "server_cpu_us_per_step": round(res.median("server_cpu_us_per_step_64"), 1),
                "generator_cpu_us_per_step": round(res.median("generator_cpu_us_per_step_64"), 1),
                "rounds": [
                    {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()}
                    for r in res.rounds
                ],
            }
            for res in (pal, oe)
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s a phase")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    parser.add_argument("--duration", type=float, default=None, help="s a phase (5; quick 2)")
    parser.add_argument("--warmup", type=float, default=None, help="s before each phase (1; 0.5)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--batch", action="store_true", help="also: /v1/batch/step vs OpenEnv WebSocket"
    )
    parser.add_argument("--batch-only", action="store_true", help="only the batch comparison")
    parser.add_argument("--per-call", type=int, default=64, help="batch: episodes a call")
    parser.add_argument("--batch-clients", type=int, default=4, help="batch: concurrent callers")
    parser.add_argument("--ws-sessions", type=int, default=64, help="OpenEnv WebSocket sessions")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    try:
        import uvloop
    except ImportError:
        figures, loop_name = asyncio.run(run(args)), "asyncio"
    else:
        figures, loop_name = uvloop.run(run(args)), "uvloop"
    figures["generator_loop"] = loop_name
    line = json.dumps(figures, separators=(",", ":"))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
