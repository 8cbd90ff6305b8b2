"""Automatic checkpoints and their retention (server/checkpoint.py,
server/checkpoint_retention.py):

- `checkpoint_every_steps`: the server checkpoints a live episode every N steps in the
  background, so a stop loses at most N steps;
- `checkpoint_retention_hours`: a resumable episode nobody resumed within it expires, its
  checkpoint and snapshot deleted, and its resume is 409 `checkpoint_expired` naming the
  setting.

Real bwrap sandboxes, the real app over real managers restarted on one data dir (ASGI)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

from conftest import make_settings

from tests.server.test_checkpoint import HE, Servers, post, step, write


def checkpoint_rows(data: Path) -> list[tuple[str, int, str | None]]:
    with sqlite3.connect(data / "palaestra.sqlite3") as db:
        rows = db.execute("SELECT episode_id, step_count, workspace FROM checkpoints").fetchall()
    return [(str(a), int(b), c) for a, b, c in rows]


async def test_every_n_steps_the_server_checkpoints(tmp_path: Path) -> None:
    data = tmp_path / "data"
    servers = Servers(make_settings(data_dir=data, checkpoint_every_steps=2))
    await servers.start()
    try:
        me = servers.tenant(["train"])
        eid = await me.start(task=HE)
        for k in range(5):
            await step(me, eid, write(f"f{k}.txt", str(k)))
            deadline = time.monotonic() + 30
            taken = [(k + 1) // 2 * 2] if k else []  # steps 2 and 4, each before the next step
            while [steps for _, steps, _ in checkpoint_rows(data)] != taken:
                assert time.monotonic() < deadline, (k, checkpoint_rows(data))
                await asyncio.sleep(0.05)
        await servers.stop()  # parks it at its last (automatic) checkpoint
        await servers.start()
        reply = await post(me, eid, "resume")
        assert reply.status_code == 200, reply.text
        assert reply.json()["resumed_at_step"] == 4 and reply.json()["lost_steps"] == 1
        ls = {"tool": "run_python", "arguments": {"code": "import os; print(sorted(os.listdir()))"}}
        seen = await step(me, eid, ls)
        assert "'f3.txt'" in seen["observation"]["text"]
        assert "'f4.txt'" not in seen["observation"]["text"]
    finally:
        await servers.stop()
        for t in servers.tenants:
            await t.http.aclose()


async def test_a_resumable_episode_expires_past_the_retention(tmp_path: Path) -> None:
    data = tmp_path / "data"
    servers = Servers(make_settings(data_dir=data, checkpoint_retention_hours=1.0))
    await servers.start()
    try:
        me, stranger = servers.tenant(["train"]), servers.tenant(["train"])
        old, fresh = await me.start(task=HE), await me.start(task=HE)
        for eid in (old, fresh):
            await step(me, eid, write("a.txt", eid))
            reply = await post(me, eid, "checkpoint")
            assert reply.status_code == 200, reply.text
        await servers.stop()  # both resumable
        (digest,) = {ws for key, _, ws in checkpoint_rows(data) if key == old}
        assert digest is not None
        snapshot = data / "snapshots" / "sha256" / digest[7:9] / digest[9:]
        with sqlite3.connect(data / "palaestra.sqlite3") as db:  # two hours pass for one
            for table, at, key in (("checkpoints", "created_at", "episode_id"),
                                   ("episodes", "updated_at", "id")):  # fmt: skip
                db.execute(f"UPDATE {table} SET {at}={at}-7200 WHERE {key}=?", (old,))
        aged = snapshot.stat().st_mtime - 7200
        os.utime(snapshot, (aged, aged))
        await servers.start()
        assert [key for key, _, _ in checkpoint_rows(data)] == [fresh]
        assert not snapshot.exists()
        state = (await me.http.get(f"/v1/episodes/{old}")).json()
        assert state["status"] == "expired" and state["failure"]["kind"] == "expired"
        foreign = await post(stranger, old, "resume")  # not told it exists, nor why
        assert foreign.status_code == 404 and "retention" not in foreign.text, foreign.text
        refused = await post(me, old, "resume")
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "checkpoint_expired"
        assert "checkpoint_retention_hours=1" in error["message"]
        resumed = await post(me, fresh, "resume")
        assert resumed.status_code == 200, resumed.text
    finally:
        await servers.stop()
        for t in servers.tenants:
            await t.http.aclose()
