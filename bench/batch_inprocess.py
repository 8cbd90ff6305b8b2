"""A batch step's server CPU per item, in process: `EpisodeManager` + `batch.step_reply`, no HTTP.

What `bench/api.py --batch` measures through uvicorn, less the HTTP server and the load
generator, so a change to the hot path shows in µs per item on a busy machine: the event
loop's CPU (this thread's `thread_time`) and the whole process's (the SQLite writer thread
as well). The server is set up as `palaestra serve` runs it (the local admin token, the
garbage collector frozen after start-up) and the calls are the bench's: 4 callers, each
owning 64 echo episodes, each call one `POST /v1/batch/step` body of 64 echo items.

    .venv/bin/python bench/batch_inprocess.py              # 5 rounds × 2 s
    .venv/bin/python bench/batch_inprocess.py --rounds 9 --duration 1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from palaestra.server import batch
from palaestra.server.app import YOUNG_COLLECTION_EVERY
from palaestra.server.auth import Authenticator, Principal, ensure_admin_token
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager

ECHO_TASK = "palaestra/echo:say-birch"
RESET = {"task": ECHO_TASK, "options": {"max_steps": 1_000_000_000}}


async def open_episodes(manager: EpisodeManager, principal: Principal, count: int) -> bytes:
    """`count` fresh echo episodes, and the body of one batch step of them all."""
    body = json.dumps({"items": [RESET] * count}).encode()
    reply = json.loads(await batch.reset_reply(manager, body, principal))
    ids = [item["result"]["episode_id"] for item in reply["items"] if item["result"]]
    if len(ids) != count:
        raise SystemExit(f"batch reset failed: {reply['items'][:2]}")
    action = {"tool": "echo", "arguments": {"text": "hi"}}
    return json.dumps({"items": [{"episode_id": e, "action": action} for e in ids]}).encode()


async def rounds(args: argparse.Namespace, data_dir: Path) -> list[tuple[float, float]]:
    settings = Settings(data_dir=data_dir, ceiling_steps=1_000_000_000)  # as bench/apiservers.py
    manager = build_manager(settings)
    await manager.start()
    try:
        token = ensure_admin_token(data_dir, manager.services.store.db).read_text().strip()
        auth = Authenticator(manager.services.store.db, settings.auth)
        principal = auth.from_value(f"Bearer {token}")
        bodies = [
            await open_episodes(manager, principal, args.per_call) for _ in range(args.callers)
        ]
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])

        async def one_call(body: bytes) -> None:
            reply = await batch.step_reply(manager, body, principal)
            if b'"error":{' in reply:
                raise SystemExit(f"an item failed: {reply[:300]!r}")

        async def for_a_while(seconds: float) -> int:
            calls, stop = 0, time.monotonic() + seconds
            while time.monotonic() < stop:
                await asyncio.gather(*(one_call(body) for body in bodies))
                calls += len(bodies)
            await manager.services.store.commit()  # the writer's share lands in this round
            return calls * int(args.per_call)

        await for_a_while(args.warmup)
        figures = []
        for _ in range(args.rounds):
            loop0, all0 = time.thread_time(), time.process_time()
            items = await for_a_while(args.duration)
            loop1, all1 = time.thread_time(), time.process_time()
            figures.append(((loop1 - loop0) / items * 1e6, (all1 - all0) / items * 1e6))
        return figures
    finally:
        await manager.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds a round")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--per-call", type=int, default=64)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="palaestra-bench-") as tmp:
        figures = asyncio.run(rounds(args, Path(tmp) / "data"))
    # The median, and the least (the round other work on the machine disturbed least).
    loop_us, all_us = (statistics.median(f[i] for f in figures) for i in (0, 1))
    print(
        f"batch item in process ({args.callers} callers × {args.per_call} items, "
        f"{args.rounds} rounds × {args.duration:g} s, load average {os.getloadavg()[0]:.1f}): "
        f"event loop {loop_us:.1f} µs (least {min(f[0] for f in figures):.1f}), "
        f"process {all_us:.1f} µs (least {min(f[1] for f in figures):.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
