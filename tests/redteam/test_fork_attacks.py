"""Attacks on fork (`POST /v1/episodes/{id}/fork`, server/fork.py).

- a foreign fork: another token's episode, by its id or by the client-chosen id its owner
  gave it, answers the 404 of an unknown id and leaves the episode as it was;
- a fork to escape a quota or a limit: forks count in live episodes and starts per hour,
  and a fork has what is left of its parent's steps and wall time, never a fresh budget;
- a fork flood: concurrent forks past the token's live quota are refused (429) without
  leaking a sandbox, while another token is served meanwhile.

Real bwrap sandboxes, the real app over a real manager (ASGI)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from palaestra.server.manager import EpisodeManager
from tests.redteam.tenants import SAY, Tenant, shape, tenant

HE = "openai/humaneval:HumanEval-1"
Factory = Callable[..., Tenant]


@pytest.fixture
async def tenants(manager: EpisodeManager) -> AsyncIterator[Factory]:
    made: list[Tenant] = []

    def make(scopes: list[str], **quota: Any) -> Tenant:
        made.append(tenant(manager, scopes, **quota))
        return made[-1]

    yield make
    for t in made:
        await t.http.aclose()


async def fork(t: Tenant, eid: str, **body: Any) -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/fork", json=body or None)


async def test_a_foreign_fork_is_the_404_of_an_unknown_id(tenants: Factory) -> None:
    owner, stranger = tenants(["train"]), tenants(["train"])
    eid = await owner.start()
    named = await owner.start(episode_id="shared-name")
    await owner.step(eid)
    for target in (eid, "shared-name"):
        assert shape(await fork(stranger, target), target) == shape(
            await fork(stranger, "no-such-episode"), "no-such-episode"
        )
    # The stranger naming its fork after the owner's episode makes nothing of the owner's.
    own = await stranger.start()
    mine = await fork(stranger, own, episode_id="shared-name")
    assert mine.status_code == 200
    state = (await owner.http.get(f"/v1/episodes/{named}")).json()
    assert state["status"] == "active" and state["step_count"] == 0
    assert (await owner.http.get(f"/v1/episodes/{eid}")).json()["step_count"] == 1
    # The stranger's own episodes are all it can list or reach.
    assert (await stranger.http.get(f"/v1/episodes/{eid}")).status_code == 404


async def test_forks_count_as_starts_and_live_episodes(tenants: Factory) -> None:
    hourly = tenants(["train"], max_episodes_per_hour=2)
    eid = await hourly.start()
    assert (await fork(hourly, eid)).status_code == 200
    over = await fork(hourly, eid)
    assert over.status_code == 429 and "per hour" in over.json()["error"]["message"]
    assert float(over.headers["retry-after"]) >= 1
    live = tenants(["train"], max_live=1)
    solo = await live.start()
    refused = await fork(live, solo)
    assert refused.status_code == 429 and "live episodes" in refused.json()["error"]["message"]


async def test_a_fork_inherits_what_is_left_of_its_parents_limits(tenants: Factory) -> None:
    me = tenants(["train"])
    parent = await me.start(task=HE, options={"max_steps": 3})
    write = {"tool": "write_file", "arguments": {"path": "a.txt", "content": "x"}}
    for _ in range(2):
        body = await me.http.post(f"/v1/episodes/{parent}/step", json={"action": write})
        assert not body.json()["truncated"]
    child = (await fork(me, parent)).json()
    assert child["limits"]["max_steps"] == 3 and child["step_count"] == 2
    last = await me.http.post(f"/v1/episodes/{child['episode_id']}/step", json={"action": write})
    assert last.json()["truncated"], "a fork gets no fresh step budget"
    # Nor a fresh wall clock: a fork of an episode past its wall time ends at its first step.
    slow = await me.start(task=HE, options={"max_wall_s": 1})
    await asyncio.sleep(1.1)
    late = (await fork(me, slow)).json()["episode_id"]
    ended = await me.http.post(f"/v1/episodes/{late}/step", json={"action": write})
    assert ended.json()["truncated"] and "wall-time" in ended.json()["observation"]["text"]


async def test_a_fork_flood_is_bounded_and_leaks_nothing(
    tenants: Factory, manager: EpisodeManager
) -> None:
    flooder, quiet = tenants(["train"], max_live=4), tenants(["train"])
    boxes = manager.host.sandboxes.live_count  # type: ignore[attr-defined]
    parent = await flooder.start(task=HE)
    replies = await asyncio.gather(*(fork(flooder, parent) for _ in range(24)))
    codes = sorted(r.status_code for r in replies)
    assert codes.count(200) == 3 and codes.count(429) == 21, codes
    # Meanwhile another token is served as ever.
    other = await quiet.start()
    assert (await quiet.step(other)).status_code == 200
    forks = [r.json()["episode_id"] for r in replies if r.status_code == 200]
    for eid in [parent, *forks]:
        assert (await flooder.http.delete(f"/v1/episodes/{eid}")).status_code == 204
    await quiet.http.delete(f"/v1/episodes/{other}")
    assert manager.host.sandboxes.live_count == boxes  # type: ignore[attr-defined]
    # Its slots came back: it may fork again.
    again = await flooder.start(task=HE)
    assert (await fork(flooder, again)).status_code == 200


async def test_forks_of_a_sayer_are_its_own(tenants: Factory) -> None:
    """A family without a sandbox (echo) forks its state alone: the fork's steps are its own."""
    me = tenants(["train"])
    eid = await me.start()
    await me.step(eid)
    child = (await fork(me, eid)).json()["episode_id"]
    body = {"action": SAY}
    assert (await me.http.post(f"/v1/episodes/{child}/step", json=body)).status_code == 200
    states = [(await me.http.get(f"/v1/episodes/{e}")).json() for e in (eid, child)]
    assert [s["step_count"] for s in states] == [1, 2]
