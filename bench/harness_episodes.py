"""Harness episodes end to end at concurrency (issue 20): N bash-agent episodes at once on
a real `palaestra serve` (bwrap sandboxes, each reaching its session proxy through its
gateway), each running K `bash` commands and then `submit`, verified (humaneval, hidden
tests in a fresh sandbox).

The model is a SCRIPTED FAKE (tests/peers/fake_model.py, answering by how many tool
results a conversation holds), so what is measured is palaestra: reset (sandbox, gateway,
session, staging), the harness's calls through the proxy and their step records, its
commands in the sandbox, and verification. Figures: episodes/s and model calls/s over the
whole run, and the p50/p99 of reset and of reset-to-verdict.

    .venv/bin/python bench/harness_episodes.py                 # 64 episodes, 3 calls each
    .venv/bin/python bench/harness_episodes.py --episodes 8 --calls 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.peers.fake_model import FakeModel, Reply, bash_call, submit_call  # noqa: E402

TASK = "openai/humaneval:HumanEval-2"


class PerConversation(FakeModel):
    """`calls - 1` bash commands, then submit, counted per conversation (its tool results)."""

    def __init__(self, calls: int) -> None:
        super().__init__([])
        self.calls = calls

    def next_reply(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.append({})
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        return bash_call("true") if done < self.calls - 1 else submit_call()


def serve(data: Path, port: int) -> subprocess.Popen[bytes]:
    packs = data / "packs"
    packs.mkdir()
    (packs / "humaneval").symlink_to(ROOT / "packs" / "humaneval")
    env = {**os.environ, "PALAESTRA_PACKS_DIRS": str(packs), "PALAESTRA_LOG_LEVEL": "warning"}
    argv = [str(Path(sys.executable).parent / "palaestra"), "serve", "--port", str(port),
            "--data-dir", str(data / "server")]  # fmt: skip
    log = open(data / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


async def one(client: httpx.AsyncClient, option: dict[str, Any]) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    reply = await client.post("/v1/episodes", json={"task": TASK, "options": {"harness": option}})
    reply.raise_for_status()
    t1 = time.perf_counter()
    episode = reply.json()["episode_id"]
    verdict = await client.post(f"/v1/episodes/{episode}/verify")
    verdict.raise_for_status()
    outcome = "void" if verdict.json()["status"] == "void" else str(verdict.json()["reward"])
    return t1 - t0, time.perf_counter() - t0, outcome


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def run(episodes: int, calls: int) -> dict[str, Any]:
    fake = PerConversation(calls)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp, fake.serve() as url:
        port = 18000 + os.getpid() % 1000
        proc = serve(Path(tmp), port)
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(base_url=base, timeout=600) as client:
                for _ in range(600):
                    try:
                        if (await client.get("/readyz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.1)
                token = (Path(tmp) / "server" / "admin.token").read_text().strip()
                client.headers["authorization"] = f"Bearer {token}"
                option = {"name": "bash-agent", "model_endpoint": url, "model": "fake"}
                await one(client, option)  # warm-up: imports, first sandbox
                fake.requests.clear()
                t0 = time.perf_counter()
                done = await asyncio.gather(*(one(client, option) for _ in range(episodes)))
                wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    resets, totals = [d[0] for d in done], [d[1] for d in done]
    return {
        "episodes": episodes,
        "calls_per_episode": calls,
        "wall_s": round(wall, 2),
        "episodes_per_s": round(episodes / wall, 2),
        "model_calls_per_s": round(len(fake.requests) / wall, 1),
        "reset_p50_s": round(pct(resets, 50), 3),
        "reset_p99_s": round(pct(resets, 99), 3),
        "episode_p50_s": round(pct(totals, 50), 3),
        "episode_p99_s": round(pct(totals, 99), 3),
        "rewards": {r: sum(1 for d in done if d[2] == r) for r in {d[2] for d in done}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3, help="model calls an episode")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.episodes, args.calls)), indent=1))


if __name__ == "__main__":
    main()
