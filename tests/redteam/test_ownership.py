"""Episodes belong to their token (DESIGN §3): a hostile train/eval token that knows or
guesses another token's episode id gets exactly the 404 of an id nobody has, on every route,
for live, ended and stored-only episodes; client-chosen ids are scoped per token.

Before: any token could read, step, replay, verify, close and batch-step any episode whose id
it knew; a train token probing an eval token's sealed episode got 403 (a split oracle); two
tokens choosing the same episode_id collided (409, an existence oracle)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from palaestra.server.manager import EpisodeManager
from tests.hosts import local_host
from tests.redteam.tenants import SAY, SEALED_ECHO, Tenant, shape, tenant

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


async def attacks(mallory: Tenant, episode_id: str) -> list[httpx.Response]:
    """Everything a token may try on an episode id: state, step, replay, verify, close, batch."""
    base = f"/v1/episodes/{episode_id}"
    batch = await mallory.http.post(
        "/v1/batch/step",
        json={"items": [{"episode_id": episode_id, "action": SAY, "request_id": "r-1"}]},
    )
    assert batch.status_code == 200, batch.text
    item = batch.json()["items"][0]["error"]
    as_response = httpx.Response(
        item["status"],
        json={"error": {k: item[k] for k in ("code", "message", "retryable")}},
    )
    return [
        await mallory.http.get(base),
        await mallory.step(episode_id),
        await mallory.step(episode_id, request_id="r-1"),  # replay the owner's request id
        await mallory.http.post(f"{base}/verify"),
        await mallory.http.delete(base),
        as_response,
    ]


async def same_as_unknown(mallory: Tenant, episode_id: str) -> None:
    unknown = uuid.uuid4().hex
    expected = [shape(r, unknown) for r in await attacks(mallory, unknown)]
    assert all(s[0] == 404 for s in expected), expected
    got = [shape(r, episode_id) for r in await attacks(mallory, episode_id)]
    assert got == expected


async def test_live_episode_of_another_token_is_404(tenants: Factory) -> None:
    alice, mallory = tenants(["train"]), tenants(["train"])
    episode = await alice.start()
    first = await alice.step(episode, request_id="r-1")
    assert first.status_code == 200
    await same_as_unknown(mallory, episode)
    state = (await alice.http.get(f"/v1/episodes/{episode}")).json()
    assert state["status"] == "active" and state["step_count"] == 1  # untouched
    assert len(state["trajectory"]) == 1
    assert (await alice.step(episode, request_id="r-1")).json() == first.json()


async def test_ended_and_stored_episode_of_another_token_is_404(
    tenants: Factory, manager: EpisodeManager
) -> None:
    alice, mallory = tenants(["train"]), tenants(["eval"])
    episode = await alice.start()
    await alice.step(episode, request_id="r-1")
    submit = {"action": {"tool": "submit", "arguments": {"answer": "hcrib"}}}
    ended = await alice.http.post(f"/v1/episodes/{episode}/step", json=submit)
    assert ended.json()["terminated"]
    await same_as_unknown(mallory, episode)  # in the ended cache
    local_host(manager)._ended.clear()
    await same_as_unknown(mallory, episode)  # in the store only
    state = (await alice.http.get(f"/v1/episodes/{episode}")).json()
    assert state["status"] == "done" and state["verdict"]["reward"] == 1.0


async def test_sealed_episode_is_no_split_oracle(tenants: Factory, manager: EpisodeManager) -> None:
    evaluator, trainer = tenants(["eval"]), tenants(["train"])
    episode = await evaluator.start(task=SEALED_ECHO)
    await same_as_unknown(trainer, episode)  # was 403 missing_scope: "this id is sealed"
    await evaluator.http.delete(f"/v1/episodes/{episode}")
    local_host(manager)._ended.clear()
    await same_as_unknown(trainer, episode)


async def test_client_chosen_ids_are_scoped_per_token(tenants: Factory) -> None:
    alice, bob = tenants(["train"]), tenants(["train"])
    a = await alice.reset(episode_id="a")
    b = await bob.reset(episode_id="a", task="palaestra/echo:say-cobalt")
    assert a.status_code == 200 and b.status_code == 200, b.text
    assert a.json()["episode_id"] == "a" and b.json()["episode_id"] == "a"
    await bob.step("a")
    await bob.step("a")
    mine = (await alice.http.get("/v1/episodes/a")).json()
    theirs = (await bob.http.get("/v1/episodes/a")).json()
    assert mine["step_count"] == 0
    assert mine["task"].endswith(":say-birch") and theirs["task"].endswith(":say-cobalt")
    assert theirs["step_count"] == 2 and mine["episode_id"] == theirs["episode_id"] == "a"
    # Naming the other's scoped key from outside is no way in either.
    await same_as_unknown(bob, f"{alice.token_id}:a")


async def test_admin_reaches_every_episode(tenants: Factory) -> None:
    alice, admin = tenants(["train"]), tenants(["admin"])
    server_made = await alice.start()
    await alice.start(episode_id="mine")
    got = await admin.http.get(f"/v1/episodes/{server_made}")
    assert got.status_code == 200 and got.json()["episode_id"] == server_made
    scoped = await admin.http.get(f"/v1/episodes/{alice.token_id}:mine")
    assert scoped.status_code == 200, scoped.text
    assert (await admin.http.get("/v1/episodes/mine")).status_code == 404  # not admin's own
