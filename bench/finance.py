"""Tool-call latency of the finance family on a ~30-page report, against re-parsing per call.

Ours: one `FinanceFamily` episode (in-process, the family's own step path); the first reset
generates and parses the PDF, later tool calls read the cached parse. Peer, measured in the
same run: the same tool answered by opening the PDF with pdfplumber on every call (what a
tool without a per-document cache does). Prints p50/p95 of each and the ratio.

    .venv/bin/python bench/finance.py [--calls 60] [--quick] [--json PATH]

Like the other benches: a PASS/MISS line against the target and, last, the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import pdfplumber

from palaestra.envs.base import EpisodeContext, Sandboxes
from palaestra.envs.finance.family import FinanceFamily, FinanceSettings
from palaestra.envs.finance.tasks import generate_task
from palaestra.sandbox import Sandbox, SandboxSpec
from palaestra.sdk.models import Action
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.inprocess import InProcessClient


def _task() -> Task:
    raw = generate_task(seed=424_242, index=2, level=3)
    return Task(
        id=raw["id"],
        family="finance",
        domain=raw["domain"],
        split="train",
        pack="bench/finance",
        version="1.0.0",
        public=raw["public"],
        private=raw["private"],
        difficulty=raw["difficulty"],
        sealed=False,
        digest=Task.compute_digest("finance", raw["domain"], raw["public"], raw["private"]),
    )


async def _no_sandbox(spec: SandboxSpec) -> Sandbox:
    raise RuntimeError("no sandbox")


def _through_manager(tmp: Path, task: Task, actions: list[Action]) -> list[float]:
    """The same calls through the episode manager (in-process client): the full step path."""
    pack = tmp / "packs" / "bench"
    pack.mkdir(parents=True)
    (pack / "pack.toml").write_text(
        'name = "bench/finance"\nversion = "1.0.0"\nfamilies = ["finance"]\n\n'
        "[splits.train]\nsealed = false\n",
        encoding="utf-8",
    )
    record = {
        "id": task.id,
        "family": "finance",
        "domain": task.domain,
        "split": "train",
        "difficulty": task.difficulty,
        "public": task.public,
        "private": task.private,
    }
    (pack / "tasks.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    times = []
    # The parse is cached by the first reset, in this run's own cache.
    settings = Settings(data_dir=tmp / "data", packs_dirs=[tmp / "packs"], cache=tmp / "cache")
    with InProcessClient(settings) as client:
        eid = client.reset(
            f"bench/finance@1.0.0:{task.id}", options={"max_steps": 10_000}
        ).episode_id
        for action in actions:
            t = time.perf_counter()
            client.step(eid, action)
            times.append(time.perf_counter() - t)
    return times


async def main(calls: int, json_path: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        family = FinanceFamily(FinanceSettings(cache_dir=Path(tmp) / "cache" / "finance"))
        task = _task()
        ctx = EpisodeContext("bench", task, None, {}, Sandboxes(_no_sandbox))
        started = time.perf_counter()
        await family.reset(ctx)
        first = time.perf_counter() - started
        doc = ctx.state.document()
        pages = len(doc.parsed.pages)
        actions = [
            Action(tool="read_page", arguments={"page": 1 + i % pages})
            if i % 3 == 0
            else Action(tool="extract_tables", arguments={"page": 1 + i % pages})
            if i % 3 == 1
            else Action(tool="search", arguments={"text": "revenue"})
            for i in range(calls)
        ]
        ours = []
        for action in actions:
            t = time.perf_counter()
            tool, args = family.parse_action(action)
            await family.step(ctx, tool, args)
            ours.append(time.perf_counter() - t)
        peer = []
        for action in actions[: max(6, calls // 4)]:
            t = time.perf_counter()
            with pdfplumber.open(io.BytesIO(doc.pdf)) as pdf:
                if action.tool == "search":
                    for page in pdf.pages:
                        (page.extract_text() or "").lower().count("revenue")
                else:
                    page = pdf.pages[int(action.arguments["page"]) - 1]
                    if action.tool == "read_page":
                        page.extract_text()
                    else:
                        page.extract_tables()
            peer.append(time.perf_counter() - t)
        managed = _through_manager(Path(tmp), task, actions)

    def ms(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if len(xs) > 2 else xs[0] * 1e3

    p50, peer50 = statistics.median(ours) * 1000, statistics.median(peer) * 1000
    m50 = statistics.median(managed) * 1000
    print(f"report: {pages} pages; first reset (generate + render + parse): {first:.2f} s")
    print(
        f"ours, family step (cached parse): p50 {p50:.3f} ms, p95 {ms(ours, 95):.3f} ms "
        f"over {calls} calls"
    )
    print(
        f"ours, through the episode manager (in-process client): p50 {m50:.3f} ms, "
        f"p95 {ms(managed, 95):.3f} ms"
    )
    print(
        f"peer, pdfplumber per call: p50 {peer50:.1f} ms, p95 {ms(peer, 95):.1f} ms over "
        f"{len(peer)} calls"
    )
    print(
        f"ratio at p50: peer / ours = {peer50 / p50:.0f}x (family), {peer50 / m50:.0f}x (manager)"
    )
    print(
        f"{'PASS' if m50 <= 50 else 'MISS'}: p50 {m50:.3f} ms through the manager (target "
        "<= 50 ms after the first parse)"
    )
    figures = {
        "pages": pages,
        "first_reset_s": round(first, 3),
        "ours_p50_ms": round(p50, 4),
        "ours_p95_ms": round(ms(ours, 95), 4),
        "peer_p50_ms": round(peer50, 2),
        "ratio_p50": round(peer50 / p50, 1),
        "manager_p50_ms": round(m50, 4),
        "manager_ratio_p50": round(peer50 / m50, 1),
    }
    text = json.dumps(figures)
    if json_path:
        Path(json_path).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="12 calls")
    parser.add_argument("--json", default=None, help="also write the figures here")
    opts = parser.parse_args()
    asyncio.run(main(12 if opts.quick else opts.calls, opts.json))
