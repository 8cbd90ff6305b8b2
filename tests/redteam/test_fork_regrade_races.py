"""Races and quota escapes on fork and regrade (server/fork.py, server/regrade.py).

- two forks racing for one client-chosen id: one fork, one 409 `episode_exists`, never a
  5xx and never a sandbox left behind;
- a fork while the parent's step runs waits for the step (the parent's lock): the fork
  sees what the step left, never half of it;
- a close racing a fork: the fork is made whole or refused, the parent ends, nothing leaks;
- a regrade flood: each regrade makes sandboxes and runs a verifier, so it holds one of the
  token's live slots while it runs; past them it is 429 while another token is served;
- malformed fork and regrade bodies are 4xx (checkpoint and resume take none), never 5xx.

Real bwrap sandboxes, the real app over a real manager (ASGI)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from palaestra.server.manager import EpisodeManager
from tests.redteam.tenants import Tenant, tenant

HE = "openai/humaneval:HumanEval-1"
SOLUTION = """def separate_paren_groups(paren_string):
    groups, depth, cur = [], 0, ""
    for c in paren_string.replace(" ", ""):
        cur += c
        depth += 1 if c == "(" else -1
        if depth == 0:
            groups.append(cur)
            cur = ""
    return groups
"""
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


def write(content: str, path: str = "solution.py") -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


def run(code: str) -> dict[str, Any]:
    return {"tool": "run_python", "arguments": {"code": code}}


async def step(t: Tenant, eid: str, action: dict[str, Any]) -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/step", json={"action": action})


async def fork(t: Tenant, eid: str, **body: Any) -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/fork", json=body or None)


def boxes(manager: EpisodeManager) -> int:
    return int(manager.host.sandboxes.live_count)  # type: ignore[attr-defined]


async def solved(t: Tenant) -> str:
    eid = await t.start(task=HE)
    assert (await step(t, eid, write(SOLUTION))).status_code == 200
    done = await step(t, eid, {"tool": "submit", "arguments": {}})
    assert done.json()["terminated"]
    return eid


async def test_two_forks_racing_for_one_id(tenants: Factory, manager: EpisodeManager) -> None:
    me = tenants(["train"])
    before = boxes(manager)
    parent = await me.start(task=HE)
    replies = await asyncio.gather(*(fork(me, parent, episode_id="twin") for _ in range(4)))
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 409, 409, 409], [r.text for r in replies]
    assert all(
        r.json()["error"]["code"] == "episode_exists" for r in replies if r.status_code == 409
    )
    for eid in (parent, "twin"):
        assert (await me.http.delete(f"/v1/episodes/{eid}")).status_code == 204
    assert boxes(manager) == before


async def test_a_fork_waits_for_the_running_step(tenants: Factory) -> None:
    me = tenants(["train"])
    parent = await me.start(task=HE)
    slow = run("import time\nopen('a', 'w').write('1')\ntime.sleep(1)\nopen('b', 'w').write('2')")
    running = asyncio.create_task(step(me, parent, slow))
    await asyncio.sleep(0.3)
    child = await fork(me, parent)
    assert child.status_code == 200, child.text
    assert (await running).status_code == 200
    assert child.json()["step_count"] == 1  # after the step, not in its middle
    seen = await step(me, child.json()["episode_id"], run("import os; print(sorted(os.listdir()))"))
    assert "'a', 'b'" in seen.json()["observation"]["text"]


async def test_a_close_racing_a_fork(tenants: Factory, manager: EpisodeManager) -> None:
    me = tenants(["train"])
    before = boxes(manager)
    for _ in range(3):
        parent = await me.start(task=HE)
        made, closed = await asyncio.gather(
            fork(me, parent), me.http.delete(f"/v1/episodes/{parent}")
        )
        assert made.status_code in (200, 409), made.text
        assert closed.status_code == 204
        if made.status_code == 200:
            child = made.json()["episode_id"]
            assert (await step(me, child, write("x", "y.txt"))).status_code == 200
            assert (await me.http.delete(f"/v1/episodes/{child}")).status_code == 204
    assert boxes(manager) == before


async def test_a_regrade_flood_is_held_to_the_live_quota(
    tenants: Factory, manager: EpisodeManager
) -> None:
    flooder, quiet = tenants(["train"], max_live=1), tenants(["train"])
    eid = await solved(flooder)
    body = {"pack": "openai/humaneval"}
    replies = await asyncio.gather(
        *(flooder.http.post(f"/v1/episodes/{eid}/regrade", json=body) for _ in range(6))
    )
    codes = sorted(r.status_code for r in replies)
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}, codes
    refused = next(r for r in replies if r.status_code == 429)
    assert "live episodes" in refused.json()["error"]["message"]
    # A live episode takes the token's one slot: no regrade beside it.
    live = await flooder.start(task=HE)
    assert (await flooder.http.post(f"/v1/episodes/{eid}/regrade", json=body)).status_code == 429
    other = await quiet.start(task=HE)
    assert (await step(quiet, other, write(SOLUTION))).status_code == 200
    await flooder.http.delete(f"/v1/episodes/{live}")
    again = await flooder.http.post(f"/v1/episodes/{eid}/regrade", json=body)
    assert again.status_code == 200 and again.json()["reward"] == 1.0


@pytest.mark.parametrize(
    "route, body",
    [
        ("fork", {"episode_id": 5}),
        ("fork", {"episode_id": "x" * 129}),
        ("fork", {"episode_id": "a\u0000b"}),
        ("fork", [1, 2]),
        ("fork", "nope"),
        ("regrade", {}),
        ("regrade", {"pack": 5}),
        ("regrade", {"pack": "../../etc"}),
        ("regrade", {"pack": "a/b@" + "9" * 300}),
        ("regrade", {"pack": "openai/humaneval@0.0.0-nothing"}),
        ("regrade", {"pack": "echo/none"}),
        ("regrade", {"pack": "a/b\u0000"}),
        ("regrade", None),
        ("checkpoint", {"junk": [1] * 1000}),
        ("resume", {"junk": True}),
    ],
)
async def test_malformed_bodies_are_4xx(tenants: Factory, route: str, body: Any) -> None:
    me = tenants(["train"])
    live = await me.start()
    ended = await me.start()
    await me.http.delete(f"/v1/episodes/{ended}")
    for eid in (live, ended, "no-such"):
        reply = await me.http.post(f"/v1/episodes/{eid}/{route}", json=body)
        assert reply.status_code < 500, (eid, reply.status_code, reply.text)
        if route in ("fork", "regrade") or reply.status_code >= 400:  # those take a body
            assert 400 <= reply.status_code < 500 and reply.json()["error"]["code"], reply.text
