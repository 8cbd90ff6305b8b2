"""Cluster mode (`serve --ray`) beside the embedded server, over HTTP, in one run.

(a) no-op echo step p50/p99 (1 client) and steps/s (N clients): `serve --ray local:1`
    vs `serve`; target: the Ray path adds ≤ 0.5 ms to the p50.
(b) a coding episode's wall time (openai/humaneval, the oracle writes and submits the
    canonical solution, the hidden tests grade it): each task run 5 times a side,
    interleaved; the ratio of the summed per-task medians; target ≤ 1.10×.
(c) steps/s and live episodes at 1, 2 and 3 local nodes for echo with a delay (a step that
    waits on I/O), each node with a fixed number of episode slots (`ray_node_episodes`),
    every slot filled by a client stepping in a closed loop; one more reset must get 429.
    Target: steps/s at 3 nodes ≥ 0.9 × 3 × steps/s at 1 node. The defaults (500 ms, 32
    slots) keep the whole load under one core here (a step costs about 1.2 ms of CPU over
    client, front and worker), so what grows is the cluster, not the 2 cores: at 200 ms and
    64 slots, 3 nodes need about 0.9 cores more than 1 and the machine, not Ray, is the cap.

Every server is a real `palaestra serve` subprocess on loopback (`--auth off`, data dirs in
a temp dir); the load generator is bench/api.py's (raw keep-alive HTTP/1.1).

    .venv/bin/python bench/scale.py            # 3 rounds × 5 s, 10 coding tasks
    .venv/bin/python bench/scale.py --quick    # 1 round × 2 s, 3 coding tasks
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from api import closed_loop, one_client, pct  # bench/api.py, beside this script
from apiservers import (
    CLK_TCK,
    ROOT,
    HTTPError,
    Palaestra,
    checked,
    connect,
    delete,
    free_port,
    get,
    post,
    wait_ready,
)

DELAY_PACK = "bench/echo-delay"
DELAY_TASK = f"{DELAY_PACK}:wait"
CODING_PACK = "openai/humaneval"
TARGET_ADDED_P50_MS = 0.5
TARGET_CODING_RATIO = 1.10
TARGET_SCALING = 0.9


# -- servers ----------------------------------------------------------------------------------
def write_delay_pack(folder: Path, delay_ms: int) -> Path:
    """A one-task echo pack whose `echo` step sleeps `delay_ms` (a step that waits on I/O)."""
    folder.mkdir(parents=True)
    (folder / "pack.toml").write_text(
        f'name = "{DELAY_PACK}"\nversion = "0.1.0"\n'
        f'description = "echo with a {delay_ms} ms step, for bench/scale.py"\n'
        'license = "Apache-2.0"\nfamilies = ["echo"]\n\n[splits.train]\nsealed = false\n'
    )
    task = {
        "id": "wait",
        "family": "echo",
        "domain": "echo/delay",
        "split": "train",
        "public": {"instruction": "Echo anything; each echo waits.", "delay_ms": delay_ms},
        "private": {"answer": "done"},
    }
    (folder / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    return folder


def process_table() -> dict[int, tuple[int, str, float]]:
    """pid → (parent pid, command name, CPU seconds) of every process now."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
            table[int(stat.parent.name)] = (int(fields[1]), name, cpu)
    return table


def descendants(root: int) -> dict[int, str]:
    """The processes under `root` (itself included): pid → command name."""
    table = process_table()
    found = {root: table[root][1]} if root in table else {}
    grew = True
    while grew:
        grew = False
        for pid, (parent, name, _) in table.items():
            if parent in found and pid not in found:
                found[pid] = name
                grew = True
    return found


class Server(Palaestra):
    def cpu_s(self) -> float:
        """CPU time of the server and every process under it (a local cluster's raylets,
        GCS and worker actors are the front's descendants)."""
        table = process_table()
        return sum(table[pid][2] for pid in descendants(self.proc.pid) if pid in table)


def stop(server: Server) -> list[str]:
    """SIGTERM the server; what it left running under it (killed here), as names."""
    tree = descendants(server.proc.pid)
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    deadline = time.monotonic() + 15
    left = {pid: name for pid, name in tree.items() if Path(f"/proc/{pid}").exists()}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {pid: name for pid, name in left.items() if Path(f"/proc/{pid}").exists()}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return sorted(f"{name}({pid})" for pid, name in left.items())


@contextlib.contextmanager
def serve(workdir: Path, name: str, ray: str, args: argparse.Namespace) -> Iterator[Server]:
    port, log = free_port(), workdir / f"{name}.log"
    binary = ROOT / ".venv" / "bin" / "palaestra"
    cmd = [
        str(binary) if binary.exists() else "palaestra",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(workdir / f"{name}-data"),
        "--log-level",
        "warning",
        "--auth",
        "off",
    ]
    for pack in (ROOT / "packs" / "echo", ROOT / "packs" / "humaneval", args.delay_pack):
        cmd += ["--packs", str(pack)]
    if ray:
        cmd += ["--ray", ray]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PALAESTRA_CEILING_STEPS": "1000000000",  # a client steps one episode all run long
        "PALAESTRA_RAY_NODE_EPISODES": str(args.capacity),
    }
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=out)
    server = Server(name, port, proc, log)
    try:
        wait_ready(proc, port, "/readyz", log, timeout_s=600.0)
        note(f"{name}: ready in {time.monotonic() - started:.1f} s")
        yield server
    finally:
        left = stop(server)
        if left:
            note(f"{name}: left running after it exited (killed): {', '.join(left)}")
        args.left_running += left


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- (a) no-op step ---------------------------------------------------------------------------
async def noop_round(server: Server, args: argparse.Namespace) -> dict[str, float]:
    server.task = "palaestra/echo:say-birch"
    gc.collect()
    gc.disable()
    try:
        lat, _ = await one_client(server, args.warmup, args.duration)
        lat.sort()
        opened = await asyncio.gather(*(server.open_client() for _ in range(args.clients)))
        rate, many, cpu_us, _ = await closed_loop(server, opened, args.warmup, args.duration)
        many.sort()
    finally:
        gc.enable()
    return {
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "steps_per_s": rate,
        "p50_ms_many": pct(many, 0.5),
        "cpu_us_per_step": cpu_us,
    }


# -- (b) coding episode -----------------------------------------------------------------------
async def coding_tasks(server: Server, n: int) -> list[str]:
    conn = await connect(server.port)
    try:
        query = f"/v1/tasks?pack={CODING_PACK}&split=train&limit={n}"
        body = json.loads(await checked(conn, get(query, server.port)))
    finally:
        conn.close()
    return [t["id"] for t in body["tasks"]]


async def coding_episode(server: Server, task: str) -> float:
    """Seconds from reset to the verdict of one oracle-driven episode (which must pass)."""
    conn = await connect(server.port)
    try:
        t0 = time.perf_counter()
        reset = {"task": task, "options": {"oracle": True}}
        episode = json.loads(await checked(conn, post("/v1/episodes", reset, server.port)))
        step = post(
            f"/v1/episodes/{episode['episode_id']}/step",
            {"action": {"tool": "oracle"}},
            server.port,
        )
        for _ in range(20):
            reply = json.loads(await checked(conn, step))
            if reply["terminated"] or reply["truncated"]:
                wall = time.perf_counter() - t0
                verdict = reply["info"].get("verdict") or {}
                if not verdict.get("passed"):
                    raise HTTPError(f"{server.name} {task}: the oracle did not pass: {reply}")
                return wall
        raise HTTPError(f"{server.name} {task}: the oracle did not end the episode")
    finally:
        conn.close()


# -- (c) scaling ------------------------------------------------------------------------------
async def fill_and_step(server: Server, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Fill every slot with a stepping client; one more reset must get 429."""
    server.task = DELAY_TASK
    slots = nodes * args.capacity
    opened = await asyncio.gather(*(server.open_client() for _ in range(slots)))
    extra = await connect(server.port)
    try:
        status, body = await extra.request(post("/v1/episodes", {"task": DELAY_TASK}, server.port))
        if status == 200:  # admitted over the slots: a MISS, counted as live
            episode = json.loads(body)["episode_id"]
            await checked(extra, delete(f"/v1/episodes/{episode}", server.port), ok=(204,))
    finally:
        extra.close()
    gc.collect()
    gc.disable()
    try:
        rate, lat, cpu_us, _ = await closed_loop(server, opened, args.warmup, args.duration)
    finally:
        gc.enable()
    lat.sort()
    ideal = slots * 1000.0 / args.delay_ms
    return {
        "nodes": nodes,
        "slots": slots,
        "live": slots + (status == 200),
        "extra_reset_status": status,
        "extra_reset_reply": body[:160].decode(errors="replace"),
        "steps_per_s": rate,
        "ideal_steps_per_s": ideal,
        "efficiency": rate / ideal,
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "cpu_us_per_step": cpu_us,
    }


# -- the run ----------------------------------------------------------------------------------
async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    noop: dict[str, list[dict[str, float]]] = {"embedded": [], "ray": []}
    coding: dict[str, list[float]] = {"embedded": [], "ray": []}
    scaling: list[dict[str, Any]] = []
    with (
        serve(workdir, "embedded", "", args) as embedded,
        serve(workdir, "ray", "local:1", args) as ray1,
    ):
        pair = {"embedded": embedded, "ray": ray1}
        for i in range(args.rounds):
            for name in ("embedded", "ray") if i % 2 == 0 else ("ray", "embedded"):
                r = await noop_round(pair[name], args)
                noop[name].append(r)
                note(
                    f"(a) round {i + 1}/{args.rounds} {name:8s} p50 {r['p50_ms']:.3f} ms "
                    f"p99 {r['p99_ms']:.3f} ms {r['steps_per_s']:,.0f} steps/s at {args.clients}"
                )
        tasks = await coding_tasks(embedded, args.coding_tasks + 1)
        for name in ("embedded", "ray"):  # warm-up: each side's first episode is not counted
            await coding_episode(pair[name], tasks[0])
        for task in tasks[1:]:  # each task `coding_reps` times a side, interleaved
            walls: dict[str, list[float]] = {"embedded": [], "ray": []}
            for i in range(args.coding_reps):
                for name in ("embedded", "ray") if i % 2 == 0 else ("ray", "embedded"):
                    walls[name].append(await coding_episode(pair[name], task))
            for name, times in walls.items():
                coding[name].append(statistics.median(times))
        note(
            f"(b) coding episode median: embedded {statistics.median(coding['embedded']):.3f} s, "
            f"ray {statistics.median(coding['ray']):.3f} s"
        )
        embedded_exit = stop(embedded)  # not needed for (c): its CPU goes to the cluster
        args.left_running += embedded_exit
        scaling.append(await fill_and_step(ray1, 1, args))
        note(f"(c) 1 node: {scaling[-1]['steps_per_s']:,.0f} steps/s")
    for nodes in args.nodes[1:]:
        with serve(workdir, f"ray{nodes}", f"local:{nodes}", args) as server:
            scaling.append(await fill_and_step(server, nodes, args))
            note(f"(c) {nodes} nodes: {scaling[-1]['steps_per_s']:,.0f} steps/s")
    return report(noop, coding, scaling, args)


def med(rounds: list[dict[str, float]], key: str) -> float:
    return float(statistics.median(r[key] for r in rounds))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(
    noop: dict[str, list[dict[str, float]]],
    coding: dict[str, list[float]],
    scaling: list[dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    load = os.getloadavg()
    print(
        f"\nbench/scale.py: {args.rounds} rounds x {args.duration:g} s, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n"
    )
    print(f"(a) no-op echo step over HTTP, 1 client / {args.clients} clients (median of rounds)\n")
    print(
        "| server             | p50 ms (1) | p99 ms (1) | steps/s | p50 ms (many) | CPU µs/step |"
    )
    print(
        "| ------------------ | ---------- | ---------- | ------- | ------------- | ----------- |"
    )
    for name, label in (("embedded", "serve (embedded)"), ("ray", "serve --ray local:1")):
        rounds = noop[name]
        print(
            f"| {label:18s} | {med(rounds, 'p50_ms'):10.3f} | {med(rounds, 'p99_ms'):10.3f} | "
            f"{med(rounds, 'steps_per_s'):7,.0f} | {med(rounds, 'p50_ms_many'):13.2f} | "
            f"{med(rounds, 'cpu_us_per_step'):11.0f} |"
        )
    added = med(noop["ray"], "p50_ms") - med(noop["embedded"], "p50_ms")
    rate_ratio = med(noop["ray"], "steps_per_s") / med(noop["embedded"], "steps_per_s")
    print(
        f"\nadded p50 (ray − embedded): **{added:.3f} ms** (target ≤ {TARGET_ADDED_P50_MS} ms: "
        f"{verdict(added <= TARGET_ADDED_P50_MS)}); steps/s ray/embedded {rate_ratio:.2f}×"
    )
    c_emb, c_ray = statistics.median(coding["embedded"]), statistics.median(coding["ray"])
    ratio = sum(coding["ray"]) / sum(coding["embedded"])  # the same tasks on both sides
    print(
        f"\n(b) coding episode ({CODING_PACK}, oracle, {len(coding['ray'])} tasks × "
        f"{args.coding_reps}, each task's median): median embedded {c_emb * 1000:.1f} ms, ray "
        f"{c_ray * 1000:.1f} ms; the whole set ray/embedded **{ratio:.3f}** "
        f"(target ≤ {TARGET_CODING_RATIO}: {verdict(ratio <= TARGET_CODING_RATIO)})"
    )
    print(
        f"\n(c) echo with a {args.delay_ms} ms step, {args.capacity} slots a node, every slot "
        "a client stepping in a closed loop\n"
    )
    print("| nodes | live | next reset | steps/s | ideal | efficiency | p50 ms | CPU µs/step |")
    print("| ----- | ---- | ---------- | ------- | ----- | ---------- | ------ | ----------- |")
    for row in scaling:
        print(
            f"| {row['nodes']:5d} | {row['live']:4d} | {row['extra_reset_status']:10d} | "
            f"{row['steps_per_s']:7,.0f} | {row['ideal_steps_per_s']:5,.0f} | "
            f"{row['efficiency']:10.3f} | {row['p50_ms']:6.1f} | {row['cpu_us_per_step']:11.0f} |"
        )
    figures: dict[str, Any] = {
        "noop": noop,
        "added_p50_ms": added,
        "noop_steps_per_s_ratio": rate_ratio,
        "coding_s": coding,
        "coding_ratio": ratio,
        "scaling": scaling,
        "full_at_capacity": all(r["extra_reset_status"] == 429 for r in scaling),
        "left_running": args.left_running,
        "load_average": load,
    }
    one = next((r for r in scaling if r["nodes"] == 1), None)
    top = max(scaling, key=lambda r: r["nodes"])
    if one is not None and top["nodes"] > 1:
        linear = top["steps_per_s"] / (top["nodes"] * one["steps_per_s"])
        figures["scaling_ratio"] = linear
        print(
            f"\nscaling {top['nodes']} nodes / ({top['nodes']} × 1 node): **{linear:.3f}** "
            f"(target ≥ {TARGET_SCALING}: {verdict(linear >= TARGET_SCALING)}); one reset "
            f"past the slots got {', '.join(str(r['extra_reset_status']) for r in scaling)} "
            f"(429 expected: {verdict(figures['full_at_capacity'])})"
        )
    print(
        "processes left running after the servers exited: "
        + (", ".join(args.left_running) if args.left_running else "none")
    )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s a phase, 3 tasks")
    parser.add_argument("--rounds", type=int, default=None, help="(a) rounds (3; quick 1)")
    parser.add_argument("--duration", type=float, default=None, help="s a phase (5; quick 2)")
    parser.add_argument("--warmup", type=float, default=None, help="s before each (1; 0.5)")
    parser.add_argument("--clients", type=int, default=32, help="(a) concurrent clients")
    parser.add_argument("--coding-tasks", type=int, default=None, help="(b) tasks (10; 3)")
    parser.add_argument("--coding-reps", type=int, default=None, help="(b) runs a task (5; 2)")
    parser.add_argument("--delay-ms", type=int, default=500, help="(c) each echo step waits")
    parser.add_argument("--capacity", type=int, default=32, help="(c) episode slots a node")
    parser.add_argument("--nodes", default="1,2,3", help="(c) node counts, from 1")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    args.coding_tasks = args.coding_tasks or (3 if args.quick else 10)
    args.coding_reps = args.coding_reps or (2 if args.quick else 5)
    args.nodes = sorted({int(n) for n in args.nodes.split(",")})
    if args.nodes[0] != 1 or args.clients > args.capacity:
        parser.error("--nodes must start at 1, and --clients be at most --capacity")
    args.left_running = []
    with tempfile.TemporaryDirectory(prefix="palaestra-bench-scale-") as tmp:
        workdir = Path(tmp)
        args.delay_pack = write_delay_pack(workdir / "echo-delay", args.delay_ms)
        try:
            import uvloop
        except ImportError:
            figures = asyncio.run(run(args, workdir))
        else:
            figures = uvloop.run(run(args, workdir))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
