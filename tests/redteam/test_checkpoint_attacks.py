"""Attacks on checkpoint and resume (`POST /v1/episodes/{id}/checkpoint`, `.../resume`,
server/checkpoint.py).

- a foreign resume or checkpoint: another token's episode, by its id or by the id its owner
  chose, answers the 404 of an unknown id and leaves the episode resumable for its owner;
- a sealed task's checkpoint never reveals what the split withholds: the replies carry no
  stored state, and after the resume the verdict's feedback is still withheld;
- a checkpoint flood: past `token_max_checkpoints_per_hour` a token is refused (429) while
  another is served, and storage stays one checkpoint an episode;
- a resume to escape a quota: it counts as a start and a live episode.

Real bwrap sandboxes, the real app over real managers restarted on one data dir (ASGI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from palaestra.server.sealed import WITHHELD
from tests.redteam.tenants import Tenant, shape
from tests.server.test_checkpoint import HE, Servers, post, step, write

HE_SEALED = "openai/humaneval:HumanEval-0"  # the sealed held-out split


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    made = Servers(make_settings(data_dir=tmp_path / "data", token_max_checkpoints_per_hour=3))
    await made.start()
    yield made
    await made.stop()
    for t in made.tenants:
        await t.http.aclose()


async def checkpoint(t: Tenant, eid: str) -> Any:
    reply = await post(t, eid, "checkpoint")
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_a_foreign_resume_is_the_404_of_an_unknown_id(servers: Servers) -> None:
    owner, stranger = servers.tenant(["train"]), servers.tenant(["train"])
    eid = await owner.start(task=HE)
    named = await owner.start(task=HE, episode_id="shared-name")
    for target in (eid, named):
        await checkpoint(owner, target)
        for what in ("checkpoint", "resume"):
            assert shape(await post(stranger, target, what), target) == shape(
                await post(stranger, "no-such-episode", what), "no-such-episode"
            )
    await servers.stop()
    await servers.start()
    for target in (eid, "shared-name"):
        refused = await post(stranger, target, "resume")
        assert shape(refused, target) == shape(
            await post(stranger, "nothing-here", "resume"), "nothing-here"
        )
    # The stranger's own "shared-name" is its own episode, never the owner's.
    own = await stranger.start(task=HE, episode_id="shared-name")
    assert (await post(stranger, own, "resume")).json()["error"]["code"] == "not_resumable"
    for target in (eid, "shared-name"):
        assert (await owner.http.get(f"/v1/episodes/{target}")).json()["status"] == "resumable"
        assert (await post(owner, target, "resume")).status_code == 200


async def test_a_sealed_checkpoint_reveals_nothing(servers: Servers) -> None:
    evaluator = servers.tenant(["eval"])
    eid = await evaluator.start(task=HE_SEALED)
    wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
    await step(evaluator, eid, write("solution.py", wrong))
    made = await checkpoint(evaluator, eid)
    assert set(made) == {
        "episode_id", "checkpoint_id", "step_count", "created_at", "workspace_bytes"
    }  # fmt: skip
    await servers.stop()
    await servers.start()
    reply = await post(evaluator, eid, "resume")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["info"]["split"] == "heldout"
    for hidden in ("check(", "candidate", "assert ", "oracle"):
        assert hidden not in reply.text, hidden
    state = (await evaluator.http.get(f"/v1/episodes/{eid}")).json()
    assert "checkpoint" not in state and "record" not in reply.text
    done = await step(evaluator, eid, {"tool": "submit", "arguments": {}})
    assert done["terminated"] and done["reward"] == 0.0
    assert done["info"]["verdict"]["feedback"].endswith(WITHHELD)
    # A train token never reaches it, checkpoint or resume: a sealed split's episode.
    trainer = servers.tenant(["train"])
    assert (await post(trainer, eid, "resume")).status_code == 404


async def test_a_checkpoint_flood_is_refused_per_token(servers: Servers) -> None:
    flooder, other = servers.tenant(["train"]), servers.tenant(["train"])
    eid = await flooder.start(task=HE)
    await step(flooder, eid, write("big.txt", "x" * 100_000))
    for _ in range(3):
        await checkpoint(flooder, eid)
    over = await post(flooder, eid, "checkpoint")
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "quota_checkpoints"
    assert float(over.headers["retry-after"]) >= 1
    # Another token is served meanwhile, and the flooder's episode goes on.
    theirs = await other.start(task=HE)
    await checkpoint(other, theirs)
    await step(flooder, eid, write("a.txt", "on"))
    # One checkpoint an episode is kept, whatever was asked.
    assert servers.manager is not None
    rows = servers.manager.store.db.all("SELECT episode_id FROM checkpoints")
    assert sorted(r[0] for r in rows) == sorted([eid, theirs])


async def test_a_resume_counts_as_a_start_and_a_live_episode(servers: Servers) -> None:
    me = servers.tenant(["train"], max_live=1)
    eid = await me.start(task=HE)
    await checkpoint(me, eid)
    await servers.stop()
    await servers.start()
    other = await me.start(task=HE)  # its one live episode
    refused = await post(me, eid, "resume")
    assert refused.status_code == 429 and "live episodes" in refused.json()["error"]["message"]
    assert (await me.http.get(f"/v1/episodes/{eid}")).json()["status"] == "resumable"
    assert (await me.http.delete(f"/v1/episodes/{other}")).status_code == 204
    assert (await post(me, eid, "resume")).status_code == 200
