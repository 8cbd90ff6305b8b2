"""Attacks on automatic checkpoints (`checkpoint_every_steps`, server/checkpoint.py):

- a tenant stepping as fast as it can, each step a fresh workspace, cannot pile archives on
  the server's disk: one automatic checkpoint runs at a time an episode, each replaces the
  last, and the replaced archive goes at once;
- an automatic checkpoint racing the episode's close never leaves it resumable.

Real bwrap sandboxes, the real app over real managers restarted on one data dir (ASGI)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from conftest import make_settings

from tests.server.test_checkpoint import HE, Servers, post, step, write
from tests.server.test_checkpoint_upkeep import checkpoint_rows


def archives(data: Path) -> list[Path]:
    return [p for p in (data / "snapshots" / "sha256").rglob("*") if p.is_file()]


async def test_fast_steps_keep_one_archive_and_a_close_wins(tmp_path: Path) -> None:
    data = tmp_path / "data"
    servers = Servers(make_settings(data_dir=data, checkpoint_every_steps=1))
    await servers.start()
    try:
        me = servers.tenant(["train"])
        eid = await me.start(task=HE)
        for k in range(12):  # each step a new 64 KiB file: every archive differs
            await step(me, eid, write(f"f{k}.bin", f"{k}" * 65536))
        deadline = time.monotonic() + 30
        while [s for _, s, _ in checkpoint_rows(data)] != [12]:
            assert time.monotonic() < deadline, checkpoint_rows(data)
            await asyncio.sleep(0.05)
        assert len(archives(data)) == 1, archives(data)

        closed = await me.start(task=HE)
        await step(me, closed, write("a.txt", "a"))  # its automatic checkpoint is queued
        assert (await me.http.delete(f"/v1/episodes/{closed}")).status_code == 204
        await servers.stop()
        await servers.start()
        refused = await post(me, closed, "resume")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_resumable"
        assert {key for key, _, _ in checkpoint_rows(data)} <= {eid}
    finally:
        await servers.stop()
        for t in servers.tenants:
            await t.http.aclose()
