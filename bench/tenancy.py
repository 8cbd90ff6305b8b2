"""Tenancy under load: a quiet tenant's step latency while another token floods the server.

A real `palaestra serve` on loopback, two tokens. The quiet one (train) steps one echo
episode after another, one request at a time, and its p50/p99 step latency and success rate
are measured twice: alone (the baseline) and while the flooder (train + publish, its own
quota) runs in another process: episode starts past its live quota, 64-episode batch steps,
and pack publishes, all as fast as the server answers. The ratio flood/baseline is printed;
the flooder's answers are counted by status (its 429s are the quota at work).

    .venv/bin/python bench/tenancy.py            # 10 s a phase
    .venv/bin/python bench/tenancy.py --quick    # 3 s a phase
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from palaestra.server.auth import Quota, create_token
from palaestra.server.config import REPO_PACKS
from palaestra.server.db import Database
from palaestra.server.packs.archive import pack_archive

ROOT = Path(__file__).resolve().parent.parent
ECHO = "palaestra/echo:say-birch"
SAY = {"tool": "echo", "arguments": {"text": "hi"}}
FLOOD_LIVE = 128  # the flooder's own live-episode quota
BATCH = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Served:
    url: str
    quiet: str  # a train token
    flood: str  # a train + publish token of org `flood`, live quota FLOOD_LIVE
    pid: int  # the server process (its RSS: /proc/PID/status)
    data: Path  # its data dir (admin.token)


@contextlib.contextmanager
def server(workdir: Path, *args: str) -> Iterator[Served]:
    """`palaestra serve` (with `args`) on a fresh data dir, and two tokens."""
    data = workdir / "data"
    db = Database.open(data / "palaestra.sqlite3")
    quiet, _ = create_token(db, ["train"], name="quiet")
    flood, _ = create_token(
        db,
        ["train", "publish"],
        name="flood",
        orgs=["flood"],
        quota=Quota(max_live=FLOOD_LIVE),
    )
    port, log = free_port(), workdir / "server.log"
    binary = ROOT / ".venv" / "bin" / "palaestra"
    cmd = [str(binary) if binary.exists() else "palaestra", "serve", "--port", str(port)]
    cmd += ["--data-dir", str(data), "--log-level", "warning", *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a loaded machine starts slowly
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited ({proc.returncode}):\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"server not ready:\n{log.read_text()}")
            time.sleep(0.1)
        yield Served(url, quiet, flood, proc.pid, data)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the quiet tenant ---------------------------------------------------------------------
async def quiet_phase(url: str, token: str, seconds: float) -> dict[str, Any]:
    """Sequential no-op steps for `seconds`; latency in ms and success rate."""
    headers = {"authorization": f"Bearer {token}"}
    latencies: list[float] = []
    failed: Counter[int] = Counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

        async def start() -> str:
            reply = await http.post("/v1/episodes", json={"task": ECHO})
            reply.raise_for_status()
            episode: str = reply.json()["episode_id"]
            return episode

        episode = await start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.perf_counter()
            reply = await http.post(f"/v1/episodes/{episode}/step", json={"action": SAY})
            took = (time.perf_counter() - began) * 1000
            if reply.status_code != 200:
                failed[reply.status_code] += 1
                continue
            latencies.append(took)
            body = reply.json()
            if body["terminated"] or body["truncated"]:  # the step limit: a fresh episode
                await http.delete(f"/v1/episodes/{episode}")
                episode = await start()
        await http.delete(f"/v1/episodes/{episode}")
    latencies.sort()
    total = len(latencies) + sum(failed.values())

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0

    return {
        "steps": total,
        "success": len(latencies) / total if total else 0.0,
        "p50_ms": round(pct(0.50), 3),
        "p99_ms": round(pct(0.99), 3),
        "failed": dict(failed),
    }


# -- the flooder (its own process) ----------------------------------------------------------
def echo_archive(version: str) -> bytes:
    """The echo pack renamed into the flooder's org, at `version`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pack"
        shutil.copytree(REPO_PACKS / "echo", root)
        toml = (root / "pack.toml").read_text()
        toml = toml.replace('name = "palaestra/echo"', 'name = "flood/echo"')
        toml = toml.replace('version = "0.1.0"', f'version = "{version}"')
        (root / "pack.toml").write_text(toml)
        (root / "pack.lock").unlink(missing_ok=True)
        return pack_archive(root)


async def flood(url: str, token: str, seconds: float, out: Any) -> None:
    headers = {"authorization": f"Bearer {token}"}
    counts: Counter[str] = Counter()
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as http:

        async def batches() -> None:
            items = [{"task": ECHO, "options": {"max_steps": 10_000}}] * BATCH
            while time.monotonic() < end:
                reply = await http.post("/v1/batch/reset", json={"items": items})
                ids = []
                for item in reply.json().get("items", []):
                    status = 200 if item["error"] is None else item["error"]["status"]
                    counts[f"reset {status}"] += 1
                    if item["result"] is not None:
                        ids.append(item["result"]["episode_id"])
                for _ in range(5):
                    steps = [{"episode_id": e, "action": SAY} for e in ids]
                    if not steps:
                        break
                    reply = await http.post("/v1/batch/step", json={"items": steps})
                    for item in reply.json().get("items", []):
                        status = 200 if item["error"] is None else item["error"]["status"]
                        counts[f"batch step {status}"] += 1
                for e in ids:
                    await http.delete(f"/v1/episodes/{e}")

        async def starts() -> None:
            while time.monotonic() < end:  # past the live quota: 429s
                reply = await http.post("/v1/episodes", json={"task": ECHO})
                counts[f"reset {reply.status_code}"] += 1
                if reply.status_code == 429:
                    await asyncio.sleep(0)

        async def publishes() -> None:
            n = 0
            while time.monotonic() < end:
                n += 1
                data = await asyncio.to_thread(echo_archive, f"0.{os.getpid() % 1000}.{n}")
                reply = await http.post(
                    "/v1/packs", content=data, headers={"content-type": "application/gzip"}
                )
                counts[f"publish {reply.status_code}"] += 1

        await asyncio.gather(batches(), batches(), starts(), starts(), publishes())
    out.put(dict(counts))


def flood_process(url: str, token: str, seconds: float, out: Any) -> None:
    asyncio.run(flood(url, token, seconds, out))


# -- report ---------------------------------------------------------------------------------
def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s a phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    with (
        tempfile.TemporaryDirectory(prefix="palaestra-tenancy-") as tmp,
        server(Path(tmp)) as served,
    ):
        url, quiet, flood_token = served.url, served.quiet, served.flood
        asyncio.run(quiet_phase(url, quiet, 1.0))  # warm-up
        baseline = asyncio.run(quiet_phase(url, quiet, seconds))
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        flooder = ctx.Process(target=flood_process, args=(url, flood_token, seconds + 2, queue))
        flooder.start()
        time.sleep(1.0)  # let the flood ramp up
        flooded = asyncio.run(quiet_phase(url, quiet, seconds))
        counts = queue.get(timeout=120)
        flooder.join(timeout=60)
    result = {
        "seconds": seconds,
        "baseline": baseline,
        "flooded": flooded,
        "p50_ratio": round(flooded["p50_ms"] / baseline["p50_ms"], 2)
        if baseline["p50_ms"]
        else None,
        "p99_ratio": round(flooded["p99_ms"] / baseline["p99_ms"], 2)
        if baseline["p99_ms"]
        else None,
        "flooder": dict(sorted(counts.items())),
    }
    print(f"{'quiet tenant':<14}{'steps':>8}{'success':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name in ("baseline", "flooded"):
        r = result[name]
        print(
            f"{name:<14}{r['steps']:>8}{r['success']:>10.4f}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}"
        )
    print(f"flooded/baseline: p50 x{result['p50_ratio']}, p99 x{result['p99_ratio']}")
    print("flooder answers:", json.dumps(result["flooder"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
