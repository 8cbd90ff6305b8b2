"""Races on checkpoint and resume (server/checkpoint.py).

- the same episode resumed twice at once: one resume, one 409 `not_resumable`, one live
  episode and one sandbox;
- a checkpoint racing a close: whichever wins, the closed episode is never resumable after
  a restart;
- a fork of a checkpointed episode has no checkpoint of its own: after a restart the
  parent is resumable and the fork void;
- a checkpoint while a step runs waits for it: it holds what the step left, never half.

Real bwrap sandboxes, the real app over real managers restarted on one data dir (ASGI)."""

from __future__ import annotations

import asyncio
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


def run(code: str) -> dict[str, Any]:
    return {"tool": "run_python", "arguments": {"code": code}}


async def restart(servers: Servers) -> None:
    await servers.stop()
    await servers.start()


def live_boxes(servers: Servers) -> int:
    assert servers.manager is not None
    return int(servers.manager.host.sandboxes.live_count)  # type: ignore[attr-defined]


async def test_a_double_resume_makes_one_episode(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eid = await me.start(task=HE)
    await step(me, eid, write("a.txt", "one"))
    assert (await post(me, eid, "checkpoint")).status_code == 200
    await restart(servers)
    before = live_boxes(servers)
    replies = await asyncio.gather(*(post(me, eid, "resume") for _ in range(4)))
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 409, 409, 409], [r.text for r in replies]
    assert all(
        r.json()["error"]["code"] == "not_resumable" for r in replies if r.status_code != 200
    )
    assert live_boxes(servers) == before + 1
    assert (await me.http.delete(f"/v1/episodes/{eid}")).status_code == 204
    assert live_boxes(servers) == before


async def test_a_closed_episode_is_never_resumed(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eids = []
    for _ in range(3):
        eid = await me.start(task=HE)
        await step(me, eid, write("a.txt", "one"))
        made, closed = await asyncio.gather(
            post(me, eid, "checkpoint"), me.http.delete(f"/v1/episodes/{eid}")
        )
        assert made.status_code in (200, 409) and closed.status_code == 204, made.text
        eids.append(eid)
    await restart(servers)
    for eid in eids:
        state = (await me.http.get(f"/v1/episodes/{eid}")).json()
        assert state["status"] not in ("resumable", "active"), state["status"]
        assert (await post(me, eid, "resume")).status_code == 409


async def test_a_fork_of_a_checkpointed_episode_has_no_checkpoint(servers: Servers) -> None:
    me = servers.tenant(["train"])
    parent = await me.start(task=HE)
    await step(me, parent, write("a.txt", "one"))
    assert (await post(me, parent, "checkpoint")).status_code == 200
    child = (await post(me, parent, "fork")).json()["episode_id"]
    await restart(servers)
    assert (await me.http.get(f"/v1/episodes/{parent}")).json()["status"] == "resumable"
    assert (await me.http.get(f"/v1/episodes/{child}")).json()["status"] == "void"
    assert (await post(me, child, "resume")).status_code == 409


async def test_a_checkpoint_waits_for_the_running_step(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eid = await me.start(task=HE)
    slow = run("import time\nopen('a', 'w').write('1')\ntime.sleep(1)\nopen('b', 'w').write('2')")
    running = asyncio.create_task(step(me, eid, slow))
    await asyncio.sleep(0.3)
    made = await post(me, eid, "checkpoint")
    await running
    assert made.status_code == 200 and made.json()["step_count"] == 1
    await restart(servers)
    assert (await post(me, eid, "resume")).status_code == 200
    seen = await step(me, eid, run("import os; print(sorted(os.listdir()))"))
    assert "'a', 'b'" in seen["observation"]["text"]
