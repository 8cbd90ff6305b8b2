"""Abuse classes against a quiet tenant: one hostile token (or client) at a time, in one run.

A real `palaestra serve` on loopback (default settings). The quiet token steps one echo
episode after another, one request at a time; its p50/p99 step latency, success rate and
the server's RSS are measured alone (the baseline) and while each abuse class of issue 34
runs from another process, one class after another:

- `jsonrpc`: MCP JSON-RPC batches as long as the door allows, and longer ones, back to back;
- `ors-sessions`: ORS sessions opened and never closed (one token's capacity);
- `connections`: thousands of unauthenticated TCP connections that send nothing;
- `big-batch`: 64-episode batch steps with 60 KB arguments, so as large replies;
- `publish`: pack publishes back to back (the install threads);
- `websockets`: OpenEnv WebSocket sessions held open, stepping now and then.

    .venv/bin/python bench/abuse.py            # 8 s a phase
    .venv/bin/python bench/abuse.py --quick    # 3 s a phase
    .venv/bin/python bench/abuse.py --only jsonrpc connections
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from tenancy import ECHO, Served, echo_archive, quiet_phase, server  # bench/tenancy.py
from websockets.asyncio.client import connect as ws_connect

Hostile = Callable[[str, str, float, Counter[str]], Awaitable[None]]
ECHO_PACK = "palaestra/echo"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the abuse classes (each in a process of its own) -----------------------------------------
async def jsonrpc(url: str, token: str, seconds: float, counts: Counter[str]) -> None:
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        episode = (await http.post("/v1/episodes", json={"task": ECHO})).json()["episode_id"]
        path = f"/v1/episodes/{episode}/mcp"
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
        init["params"] = {"protocolVersion": "2025-06-18", "capabilities": {}}
        opened = await http.post(path, json=init, headers={"accept": "application/json"})
        session = {"mcp-session-id": opened.headers.get("mcp-session-id", "")}
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            size = 64 if n % 2 else 100_000  # the allowed length, then far past it
            batch = [{"jsonrpc": "2.0", "id": i, "method": "tools/list"} for i in range(size)]
            reply = await http.post(path, json=batch, headers=session)
            counts[f"batch of {size}: {reply.status_code}"] += 1


async def ors_sessions(url: str, token: str, seconds: float, counts: Counter[str]) -> None:
    headers = {"x-api-key": token}
    task = {"task_spec": {"id": ECHO}, "env_name": ECHO_PACK}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n += 1
            reply = await http.post("/create", json=task, headers={"x-session-id": f"h{n}"})
            counts[f"create {reply.status_code}"] += 1


async def connections(url: str, token: str, seconds: float, counts: Counter[str]) -> None:
    host, port = url.removeprefix("http://").split(":")
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(held) < 4000:
        try:
            opened = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
            opened[1].write(b"GET /healthz HTTP/1.1\r\n")  # a head never finished
            held.append(opened)
            counts["opened"] += 1
        except (OSError, TimeoutError):
            counts["refused"] += 1
            await asyncio.sleep(0.01)
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    counts["closed by the server"] = sum(reader.at_eof() for reader, _ in held)
    for _, writer in held:
        writer.close()


async def big_batch(url: str, token: str, seconds: float, counts: Counter[str]) -> None:
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        items = [{"task": ECHO, "options": {"max_steps": 10_000}}] * 64
        reset = (await http.post("/v1/batch/reset", json={"items": items})).json()["items"]
        ids = [item["result"]["episode_id"] for item in reset if item["result"]]
        text = "x" * 60_000  # under the step's output limit, so the replies are as large
        action = {"tool": "echo", "arguments": {"text": text}}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            steps = [{"episode_id": e, "action": action} for e in ids]
            reply = await http.post("/v1/batch/step", json={"items": steps})
            counts[f"batch step {reply.status_code}"] += 1


async def publish(url: str, token: str, seconds: float, counts: Counter[str]) -> None:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/gzip"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        end, n = time.monotonic() + seconds, 0

        async def one() -> None:
            nonlocal n
            while time.monotonic() < end:
                n += 1
                data = await asyncio.to_thread(echo_archive, f"0.{int(time.time()) % 1000}.{n}")
                reply = await http.post("/v1/packs", content=data)
                counts[f"publish {reply.status_code}"] += 1

        await asyncio.gather(*(one() for _ in range(8)))


async def websockets(url: str, token: str, seconds: float, counts: Counter[str]) -> None:
    target = url.replace("http://", "ws://") + f"/openenv/{ECHO_PACK}/ws"
    headers = {"authorization": f"Bearer {token}"}

    async def session() -> None:
        try:
            async with ws_connect(target, additional_headers=headers) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {"task": "say-birch"}}))
                await ws.recv()
                counts["sessions"] += 1
                while time.monotonic() < end:
                    step = {"type": "step", "data": {"tool": "echo", "arguments": {"text": "x"}}}
                    await ws.send(json.dumps(step))
                    await ws.recv()
                    counts["steps"] += 1
                    await asyncio.sleep(0.5)
        except Exception as exc:  # a refused or cut session is what is counted
            counts[f"ended: {type(exc).__name__}"] += 1

    end = time.monotonic() + seconds
    await asyncio.gather(*(session() for _ in range(100)))


CLASSES: dict[str, Hostile] = {
    "jsonrpc": jsonrpc,
    "ors-sessions": ors_sessions,
    "connections": connections,
    "big-batch": big_batch,
    "publish": publish,
    "websockets": websockets,
}


def hostile_process(name: str, url: str, token: str, seconds: float, out: Any) -> None:
    counts: Counter[str] = Counter()
    with contextlib.suppress(Exception):
        asyncio.run(CLASSES[name](url, token, seconds, counts))
    out.put(dict(counts))


# -- the run ------------------------------------------------------------------------------------
def phase(served: Served, name: str | None, seconds: float) -> dict[str, Any]:
    """The quiet tenant's figures, with `name`'s abuse running beside it (None: alone)."""
    counts: dict[str, int] = {}
    if name is not None:  # a token of its own: what one class leaves live is not the next's
        admin = {"authorization": f"Bearer {(served.data / 'admin.token').read_text().strip()}"}
        made = httpx.post(
            f"{served.url}/v1/tokens",
            json={"scopes": ["train", "publish"], "name": f"hostile-{name}", "orgs": ["flood"]},
            headers=admin,
        )
        made.raise_for_status()
        hostile_token = made.json()["token"]
    if name is None:
        quiet = asyncio.run(quiet_phase(served.url, served.quiet, seconds))
    else:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        args = (name, served.url, hostile_token, seconds + 2, queue)
        hostile = ctx.Process(target=hostile_process, args=args)
        hostile.start()
        time.sleep(1.0)  # the abuse ramps up
        quiet = asyncio.run(quiet_phase(served.url, served.quiet, seconds))
        with contextlib.suppress(Exception):
            counts = queue.get(timeout=180)
        hostile.join(timeout=60)
        if hostile.is_alive():
            hostile.kill()
    return {**quiet, "rss_mb": round(rss_mb(served.pid), 1), "hostile": counts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s a phase")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--only", nargs="*", choices=sorted(CLASSES), help="these classes")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    names = args.only or list(CLASSES)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="palaestra-abuse-") as tmp, server(Path(tmp)) as served:
        asyncio.run(quiet_phase(served.url, served.quiet, 1.0))  # warm-up
        rows["(quiet alone)"] = phase(served, None, seconds)
        for name in names:
            rows[name] = phase(served, name, seconds)
            print(f"{name}: done", file=sys.stderr, flush=True)
    base = rows["(quiet alone)"]
    print("| abuse class   | steps | success | p50 ms | p99 ms | p99 / alone | server RSS MB |")
    print("| ------------- | ----- | ------- | ------ | ------ | ----------- | ------------- |")
    for name, r in rows.items():
        ratio = r["p99_ms"] / base["p99_ms"] if base["p99_ms"] else 0.0
        print(
            f"| {name:<13} | {r['steps']:>5} | {r['success']:>7.4f} | {r['p50_ms']:>6.2f} "
            f"| {r['p99_ms']:>6.2f} | {ratio:>11.2f} | {r['rss_mb']:>13.1f} |"
        )
    print()
    for name, r in rows.items():
        if r["hostile"]:
            print(f"{name}: hostile answers {json.dumps(dict(sorted(r['hostile'].items())))}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
