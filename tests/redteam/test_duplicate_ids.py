"""Duplicate client-chosen episode ids (issue 14, invariant 7): in one batch, concurrently,
reused, or reused after a restart (in the store but not in memory), the duplicate gets 409
`episode_exists` and nothing else is affected: the batch's other items proceed and the
original episode is untouched.

Before: the check looked at memory only and only before the reset's first await, so two
concurrent resets (or two items of one batch) with one id both passed it and both tried to
insert the same primary key; after a restart the id was free in memory and the insert of the
second episode failed in the store writer while the client was told it had started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import make_settings

from palaestra.envs.base import EpisodeContext
from palaestra.envs.echo import EchoFamily
from palaestra.sdk.models import Observation
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests.hosts import local_host
from tests.redteam.tenants import ECHO, Tenant, client, tenant


def conflict(item: dict[str, object], episode_id: str) -> None:
    assert item["status"] == 409 and item["code"] == "episode_exists", item
    assert repr(episode_id) in str(item["message"]) and item["retryable"] is False


class SlowStart(EchoFamily):
    """Echo whose reset waits a moment, as one that makes a sandbox does."""

    async def reset(self, ctx: EpisodeContext) -> Observation:
        await asyncio.sleep(0.05)
        return await super().reset(ctx)


@pytest.fixture
async def slow_manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    built = build_manager(make_settings(data_dir=tmp_path / "slow"))
    built.families.add(SlowStart())
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


async def test_duplicate_in_one_batch(slow_manager: EpisodeManager) -> None:
    manager = slow_manager
    alice = tenant(manager, ["train"])
    items = [
        {"task": ECHO, "episode_id": "dup"},
        {"task": ECHO, "episode_id": "dup"},
        {"task": ECHO, "episode_id": "other"},
    ]
    reply = await alice.http.post("/v1/batch/reset", json={"items": items})
    out = reply.json()["items"]
    winners = [i for i in out[:2] if i["result"] is not None]
    losers = [i["error"] for i in out[:2] if i["error"] is not None]
    assert len(winners) == 1 and len(losers) == 1, out
    conflict(losers[0], "dup")
    assert out[2]["result"]["episode_id"] == "other"  # the rest of the batch went on
    state = (await alice.http.get("/v1/episodes/dup")).json()
    assert state["status"] == "active" and state["step_count"] == 0
    await alice.http.aclose()


async def test_duplicate_concurrent_resets(slow_manager: EpisodeManager) -> None:
    manager = slow_manager
    alice = tenant(manager, ["train"])
    replies = await asyncio.gather(*(alice.reset(episode_id="race") for _ in range(5)))
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200, 409, 409, 409, 409], [r.text for r in replies]
    for r in replies:
        if r.status_code == 409:
            conflict({"status": 409, **r.json()["error"]}, "race")
    assert len([e for e in local_host(manager)._live.values() if e.owner == alice.token_id]) == 1
    await alice.http.aclose()


async def test_reused_id_leaves_the_original_alone(manager: EpisodeManager) -> None:
    alice = tenant(manager, ["train"])
    await alice.start(episode_id="mine")
    first = await alice.step("mine", request_id="r")
    again = await alice.reset(episode_id="mine")
    conflict({"status": again.status_code, **again.json()["error"]}, "mine")
    state = (await alice.http.get("/v1/episodes/mine")).json()
    assert state["status"] == "active" and state["step_count"] == 1
    assert (await alice.step("mine", request_id="r")).json() == first.json()
    # An ended one that left memory is still taken.
    await alice.http.delete("/v1/episodes/mine")
    local_host(manager)._ended.clear()
    late = await alice.reset(episode_id="mine")
    conflict({"status": late.status_code, **late.json()["error"]}, "mine")
    assert (await alice.http.get("/v1/episodes/mine")).json()["status"] == "closed"
    await alice.http.aclose()


async def test_reused_id_after_restart(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path / "data")
    before = build_manager(settings)
    await before.start()
    alice: Tenant = tenant(before, ["train"])
    await alice.start(episode_id="kept")
    await alice.step("kept", request_id="r")
    await alice.http.aclose()
    await before.shutdown()

    after = build_manager(settings)
    await after.start()
    try:
        same = Tenant(alice.name, alice.token_id, client(after, alice.token), alice.token)
        # The same token after the restart: its id is in the store, no longer in memory.
        again = await same.reset(episode_id="kept")
        conflict({"status": again.status_code, **again.json()["error"]}, "kept")
        state = (await same.http.get("/v1/episodes/kept")).json()
        assert state["status"] == "void" and state["step_count"] == 1  # as the restart left it
        assert len(state["trajectory"]) == 1
        # Another token may still choose that id: it is scoped per token.
        bob = tenant(after, ["train"])
        assert (await bob.reset(episode_id="kept")).status_code == 200
        # And the store writer is fine: a fresh episode's steps are recorded.
        fresh = await same.start()
        await same.step(fresh)
        assert (await same.http.get(f"/v1/episodes/{fresh}")).json()["step_count"] == 1
        await same.http.aclose()
        await bob.http.aclose()
    finally:
        await after.shutdown()
