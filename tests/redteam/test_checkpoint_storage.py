"""Disk exhaustion through checkpoints (server/checkpoint.py, server/snapshots.py): an
episode keeps one checkpoint row, but each checkpoint of a changed workspace is a new
snapshot file, and the replaced ones were pruned only when some checkpointed episode ended
(or at start): one episode checkpointed up to `token_max_checkpoints_per_hour` times, a
fresh workspace each time, kept every archive. A replaced snapshot nobody else refers to
goes at once; one another episode's checkpoint shares (content-addressed) stays.

Real bwrap sandboxes, the real app over real managers restarted on one data dir (ASGI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from tests.server.test_checkpoint import HE, Servers, post, step, write


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    made = Servers(make_settings(data_dir=tmp_path / "data"))
    await made.start()
    yield made
    await made.stop()
    for t in made.tenants:
        await t.http.aclose()


def snapshots(servers: Servers) -> list[Path]:
    root = servers.settings.data_dir / "snapshots" / "sha256"
    return [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []


# What makes two workspaces written a second apart the same bytes: a tar keeps each entry's
# mtime (to the second), the folder's too, which a new file changes.
EPOCH_MTIMES = {
    "tool": "run_python",
    "arguments": {"code": "import os\nfor p in ('same.txt', '.'):\n    os.utime(p, (0, 0))"},
}


def fresh(i: int) -> dict[str, Any]:
    code = f"import os\nopen('blob', 'wb').write(b'{i}' + os.urandom(200_000))"
    return {"tool": "run_python", "arguments": {"code": code}}


async def test_replaced_checkpoints_leave_no_archives_behind(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eid = await me.start(task=HE)
    for i in range(6):
        await step(me, eid, fresh(i))
        assert (await post(me, eid, "checkpoint")).status_code == 200
    assert len(snapshots(servers)) == 1  # the last one: six checkpoints, one archive kept
    await servers.stop()
    await servers.start()
    assert (await post(me, eid, "resume")).status_code == 200


async def test_a_shared_snapshot_stays_for_the_other_episode(servers: Servers) -> None:
    me = servers.tenant(["train"])
    one, two = await me.start(task=HE), await me.start(task=HE)
    for eid in (one, two):  # the same workspace: one archive, two rows
        await step(me, eid, write("same.txt", "same"))
        await step(me, eid, EPOCH_MTIMES)  # the writes may fall in two seconds: tar keeps mtimes
        assert (await post(me, eid, "checkpoint")).status_code == 200
    assert len(snapshots(servers)) == 1
    await step(me, one, write("other.txt", "changed"))
    assert (await post(me, one, "checkpoint")).status_code == 200
    assert len(snapshots(servers)) == 2  # `two` still refers to the shared one
    await servers.stop()
    await servers.start()
    for eid in (one, two):
        assert (await post(me, eid, "resume")).status_code == 200, eid
