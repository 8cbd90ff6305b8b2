"""A hostile tenant's review of the tenancy, sealing and quota work (issue 14), with only
train, eval and publish tokens against the real app.

Found and fixed: a sealed task's `task_digest` (in the reset's info and every verdict) was
sha256 over its fields, private ones included, with public code: an eval token could hash
candidate answers offline until one matched and submit a sure 1.0. Sealed tasks' digests
are now keyed by the server's held-out secret (server/heldout.py `sealed_digest`).
The other tests are guards for attacks that failed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from palaestra.sdk.task import Task
from palaestra.server.app import create_app
from palaestra.server.auth import Quota, create_token
from palaestra.server.manager import EpisodeManager
from tests.redteam.tenants import ECHO, SAY, SEALED_ECHO, Tenant, tenant

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


def guesses(instruction: str) -> list[str]:
    """What an attacker tries: words of the instruction, as they are and reversed."""
    words = re.findall(r"[A-Za-z]+", instruction)
    return [w for word in words for w in (word, word[::-1], word.lower()[::-1])]


async def test_sealed_task_digest_is_no_answer_oracle(tenants: Factory) -> None:
    evaluator = tenants(["eval"])
    reply = await evaluator.reset(task=SEALED_ECHO)
    assert reply.status_code == 200, reply.text
    info = reply.json()["info"]
    instruction = reply.json()["observation"]["text"]
    served = info["task_digest"]
    # The offline attack: recompute the digest for each candidate private answer.
    hits = [
        g
        for g in guesses(instruction)
        if Task.compute_digest(
            info["family"], info["domain"], {"instruction": instruction}, {"answer": g}
        )
        == served
    ]
    assert hits == [], f"the served digest confirms the sealed answer {hits}"
    # A public split's digest stays the plain, reproducible one.
    public = (await evaluator.reset(task=ECHO)).json()
    text = public["observation"]["text"]
    plain = Task.compute_digest(
        "echo", public["info"]["domain"], {"instruction": text}, {"answer": "hcrib"}
    )
    assert public["info"]["task_digest"] == plain
    # And the verdict carries the same keyed digest (stable for the task on this server).
    eid = reply.json()["episode_id"]
    submit = {"action": {"tool": "submit", "arguments": {"answer": "x"}}}
    ended = (await evaluator.http.post(f"/v1/episodes/{eid}/step", json=submit)).json()
    assert ended["info"]["verdict"]["task_digest"] == served


async def test_batch_reset_cannot_race_past_the_live_quota(tenants: Factory) -> None:
    greedy = tenants(["train"], max_live=2)
    items = [{"task": ECHO} for _ in range(6)]
    reply = await greedy.http.post("/v1/batch/reset", json={"items": items})
    assert reply.status_code == 200, reply.text
    results = reply.json()["items"]
    ok = [r["result"]["episode_id"] for r in results if r["result"]]
    refused = [r["error"] for r in results if r["error"]]
    assert len(ok) == 2 and len(refused) == 4
    assert {e["status"] for e in refused} == {429} and all(e["retry_after"] for e in refused)
    # Closing twice frees one slot, not two.
    await greedy.http.delete(f"/v1/episodes/{ok[0]}")
    await greedy.http.delete(f"/v1/episodes/{ok[0]}")
    again = await asyncio.gather(*(greedy.reset() for _ in range(3)))
    assert sorted(r.status_code for r in again) == [200, 429, 429]


async def test_separator_in_a_chosen_id_reaches_only_its_own(
    tenants: Factory,
) -> None:
    alice, mallory, admin = tenants(["train"]), tenants(["train"]), tenants(["admin"])
    assert (await alice.reset(episode_id="a")).status_code == 200
    forged = f"{alice.token_id}:a"
    mine = await mallory.reset(episode_id=forged, task="palaestra/echo:say-cobalt")
    assert mine.status_code == 200 and mine.json()["episode_id"] == forged
    await mallory.step(forged)
    theirs = (await alice.http.get("/v1/episodes/a")).json()
    assert theirs["step_count"] == 0 and theirs["task"].endswith(":say-birch")
    seen = (await admin.http.get(f"/v1/episodes/{forged}")).json()
    assert seen["task"].endswith(":say-birch")  # admin's scoped form is still Alice's


async def test_revoked_token_stops_on_every_route(manager: EpisodeManager) -> None:
    db = manager.store.db
    token, record = create_token(db, ["train"], name="doomed", quota=Quota())
    admin_token = (manager.settings.data_dir / "admin.token").read_text().strip()
    app = create_app(manager.settings, manager=manager)
    app.state.manager = manager
    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(
            transport=transport, base_url="http://app", headers={"authorization": f"Bearer {token}"}
        ) as doomed,
        httpx.AsyncClient(
            transport=transport,
            base_url="http://app",
            headers={"authorization": f"Bearer {admin_token}"},
        ) as admin,
    ):
        eid = (await doomed.post("/v1/episodes", json={"task": ECHO})).json()["episode_id"]
        assert (await doomed.post(f"/v1/episodes/{eid}/step", json={"action": SAY})).is_success
        assert (await admin.delete(f"/v1/tokens/{record['id']}")).status_code == 204
        calls = [
            doomed.post(f"/v1/episodes/{eid}/step", json={"action": SAY}),
            doomed.post("/v1/batch/step", json={"items": [{"episode_id": eid, "action": SAY}]}),
            doomed.get(f"/v1/episodes/{eid}"),
            doomed.post("/v1/episodes", json={"task": ECHO}),
            doomed.get("/v1/tasks"),
        ]
        for reply in await asyncio.gather(*calls):
            assert reply.status_code == 401, reply.text
            assert reply.json()["error"]["code"] == "invalid_token"


def test_padded_headers_of_one_token_hold_no_memory(manager: EpisodeManager) -> None:
    """The step path remembers an Authorization header's token hash (server/auth.py). A
    tenant varying its header's padding and case (each still its valid token, each up to
    max_header_bytes long) would have filled that memo with ~64 KB keys; only the canonical
    `Bearer <token>` is remembered, and every variant still authenticates."""
    token, _ = create_token(manager.store.db, ["train"], name="padder", quota=Quota())
    auth = manager.services.auth
    variants = [f"Bearer{' ' * n}{token}{' ' * n}" for n in range(1, 300)]
    variants += ["bEaReR " + token, "BEARER " + token, f"Bearer {token}"]
    for value in variants:
        principal = auth.from_headers([(b"authorization", value.encode())])
        assert principal.name == "padder"
    remembered = auth._hashes  # the memo itself: nothing else shows its size
    assert list(remembered) == [f"Bearer {token}".encode()]
