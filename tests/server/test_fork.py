"""Fork (`POST /v1/episodes/{id}/fork`, server/fork.py): a new episode of the same token with
a copy of the sandbox's workspace, the family's state and the trajectory so far; the parent
goes on unchanged. Real bwrap sandboxes, the real app over a real manager (ASGI), and the
session's `palaestra serve` on loopback for the HTTP client's `fork`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import docker_skip_reason, make_settings

from palaestra.sandbox.docker import BASE_IMAGE
from palaestra.sdk.errors import ConflictError, NotFoundError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import Action, ResetRequest, StepRequest
from palaestra.server.auth import ADMIN_PRINCIPAL
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.server.sealed import WITHHELD
from tests.redteam.tenants import Tenant, tenant

DOCKER_SKIP = docker_skip_reason(BASE_IMAGE)

HE_TRAIN = "openai/humaneval:HumanEval-1"
HE_SEALED = "openai/humaneval:HumanEval-0"  # N % 5 == 0: the sealed held-out split
SOLUTION_1 = """def separate_paren_groups(paren_string):
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


def write(path: str, content: str) -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


def ls() -> dict[str, Any]:
    return {"tool": "run_python", "arguments": {"code": "import os; print(sorted(os.listdir()))"}}


@pytest.fixture
async def tenants(manager: EpisodeManager) -> AsyncIterator[Factory]:
    made: list[Tenant] = []

    def make(scopes: list[str], **quota: Any) -> Tenant:
        made.append(tenant(manager, scopes, **quota))
        return made[-1]

    yield make
    for t in made:
        await t.http.aclose()


async def step(t: Tenant, eid: str, action: dict[str, Any], rid: str | None = None) -> Any:
    body: dict[str, Any] = {"action": action}
    if rid is not None:
        body["request_id"] = rid
    reply = await t.http.post(f"/v1/episodes/{eid}/step", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def fork(t: Tenant, eid: str, **body: Any) -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/fork", json=body or None)


async def test_parent_and_fork_diverge_with_the_trajectory_copied(
    tenants: Factory, manager: EpisodeManager
) -> None:
    me = tenants(["train"])
    parent = await me.start(task=HE_TRAIN)
    first = await step(me, parent, write("a.txt", "parent's"), rid="r-1")
    reply = await fork(me, parent)
    assert reply.status_code == 200, reply.text
    child = reply.json()
    kid = child["episode_id"]
    assert kid != parent and child["parent_id"] == parent and child["step_count"] == 1
    assert child["info"]["forked_from"] == parent and child["info"]["task"].endswith(":HumanEval-1")
    assert [t["name"] for t in child["tools"]] == [
        t.name for t in manager.families.get("coding").tools
    ]
    # Each writes a file of its own: the other never sees it.
    await step(me, kid, write("b.txt", "child's"))
    await step(me, parent, write("c.txt", "parent's later"))
    assert "['a.txt', 'b.txt']" in (await step(me, kid, ls()))["observation"]["text"]
    assert "['a.txt', 'c.txt']" in (await step(me, parent, ls()))["observation"]["text"]
    # The fork's trajectory starts with the parent's steps; each goes on on its own.
    kid_state = (await me.http.get(f"/v1/episodes/{kid}")).json()
    parent_state = (await me.http.get(f"/v1/episodes/{parent}")).json()
    assert kid_state["step_count"] == parent_state["step_count"] == 3
    assert kid_state["trajectory"][0] == parent_state["trajectory"][0]
    assert kid_state["trajectory"][1]["action"]["arguments"]["path"] == "b.txt"
    assert parent_state["trajectory"][1]["action"]["arguments"]["path"] == "c.txt"
    # A request id the parent stepped answers its stored reply in the fork: never twice.
    again = await step(me, kid, write("a.txt", "replayed?"), rid="r-1")
    assert again == first
    assert (await me.http.get(f"/v1/episodes/{kid}")).json()["step_count"] == 3


async def test_fork_of_a_fork_each_verified_on_its_own(tenants: Factory) -> None:
    me = tenants(["train"])
    parent = await me.start(task=HE_TRAIN)
    await step(me, parent, write("solution.py", "def separate_paren_groups(s):\n    return []\n"))
    child = (await fork(me, parent)).json()["episode_id"]
    grandchild = (await fork(me, child)).json()["episode_id"]
    await step(me, grandchild, write("solution.py", SOLUTION_1))
    passed = await step(me, grandchild, {"tool": "submit", "arguments": {}})
    assert passed["terminated"] and passed["reward"] == 1.0
    failed = await step(me, child, {"tool": "submit", "arguments": {}})
    assert failed["terminated"] and failed["reward"] == 0.0
    # The parent is still live, its solution its own; a fork of an ended fork is refused.
    assert (await me.http.get(f"/v1/episodes/{parent}")).json()["status"] == "active"
    refused = await fork(me, grandchild)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "episode_ended"


async def test_fork_of_an_ended_or_void_episode_is_409(tenants: Factory) -> None:
    me = tenants(["train"])
    closed = await me.start(task=HE_TRAIN)
    assert (await me.http.delete(f"/v1/episodes/{closed}")).status_code == 204
    reply = await fork(me, closed)
    assert reply.status_code == 409
    error = reply.json()["error"]
    assert error == {"code": "episode_ended", "message": error["message"], "retryable": False}
    assert "closed" in error["message"]
    # A client-chosen fork id is the caller's: used twice, the second is refused.
    live = await me.start(task=HE_TRAIN)
    assert (await fork(me, live, episode_id="branch-a")).status_code == 200
    twice = await fork(me, live, episode_id="branch-a")
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "episode_exists"
    assert (await me.http.get("/v1/episodes/branch-a")).json()["status"] == "active"


async def test_fork_of_a_void_episode_is_409(manager: EpisodeManager) -> None:
    eid = (await manager.reset(ResetRequest(task=HE_TRAIN))).episode_id
    episode, _ = await manager.owned(ADMIN_PRINCIPAL, eid)
    assert episode is not None and episode.ctx.sandboxes.episode is not None
    await episode.ctx.sandboxes.episode.close()  # its sandbox dies under it: void
    gone = await manager.step(eid, StepRequest(action=Action(**ls())))
    assert gone.info["status"] == "void"
    with pytest.raises(ConflictError) as refused:
        await manager.fork(eid)
    assert refused.value.code == "episode_ended" and "void" in refused.value.message


async def test_foreign_and_unknown_episodes_answer_the_same_404(tenants: Factory) -> None:
    owner, stranger = tenants(["train"]), tenants(["train"])
    eid = await owner.start(task=HE_TRAIN)
    foreign = await fork(stranger, eid)
    unknown = await fork(stranger, "0" * 32)
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"] == "not_found"
    blank = foreign.json()["error"]["message"].replace(eid, "<id>")
    assert blank == unknown.json()["error"]["message"].replace("0" * 32, "<id>")


async def test_a_sealed_fork_stays_sealed(tenants: Factory) -> None:
    evaluator = tenants(["eval"])
    parent = await evaluator.start(task=HE_SEALED)
    await step(
        evaluator, parent, write("solution.py", "def has_close_elements(a, b):\n    return 1\n")
    )
    reply = await fork(evaluator, parent)
    assert reply.status_code == 200, reply.text
    child = reply.json()
    assert child["info"]["split"] == "heldout"
    done = await step(evaluator, child["episode_id"], {"tool": "submit", "arguments": {}})
    verdict = done["info"]["verdict"]
    assert done["reward"] == 0.0 and WITHHELD in verdict["feedback"]
    assert "assert" not in verdict["feedback"]  # no test source, no expected values
    # A train token may not fork it (not its episode: the 404 of an unknown id).
    trainer = tenants(["train"])
    assert (await fork(trainer, parent)).status_code == 404


async def test_forks_count_in_the_quota(tenants: Factory) -> None:
    me = tenants(["train"], max_live=2)
    parent = await me.start(task=HE_TRAIN)
    child = (await fork(me, parent)).json()["episode_id"]
    over = await fork(me, parent)
    assert over.status_code == 429 and over.json()["error"]["code"] == "quota_exceeded"
    assert (await me.reset(task=HE_TRAIN)).status_code == 429
    # A fork that fails gives its slot back: the refused one above, and a 404.
    await me.http.delete(f"/v1/episodes/{child}")
    assert (await fork(me, "0" * 32)).status_code == 404
    assert (await fork(me, parent)).status_code == 200


def test_the_http_client_forks(http: HTTPClient) -> None:
    parent = http.reset(HE_TRAIN).episode_id
    http.step(parent, write("a.txt", "x"))
    child = http.fork(parent)
    assert child.parent_id == parent and child.step_count == 1
    named = http.fork(child.episode_id, fork_id=f"{child.episode_id[:8]}-b")
    assert named.episode_id == f"{child.episode_id[:8]}-b" and named.step_count == 1
    assert http.state(named.episode_id).trajectory[0].action.tool == "write_file"
    http.close(parent)
    with pytest.raises(ConflictError):
        http.fork(parent)
    with pytest.raises(NotFoundError):
        http.fork("0" * 32)
    http.close(child.episode_id)
    http.close(named.episode_id)


@pytest.mark.slow
@pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
async def test_a_docker_episode_forks(tmp_path: Path) -> None:
    """On docker the fork's container gets the parent's workdir (the engine's archive of it,
    docs/decisions.md: a commit would capture nothing of the read-only root)."""
    manager = build_manager(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await manager.start()
    try:
        parent = (await manager.reset(ResetRequest(task=HE_TRAIN))).episode_id
        await manager.step(parent, StepRequest(action=Action(**write("a.txt", "p"))))
        child = (await manager.fork(parent)).episode_id
        await manager.step(child, StepRequest(action=Action(**write("b.txt", "c"))))
        seen = await manager.step(child, StepRequest(action=Action(**ls())))
        assert "['a.txt', 'b.txt']" in seen.observation.text
        seen = await manager.step(parent, StepRequest(action=Action(**ls())))
        assert "['a.txt']" in seen.observation.text
    finally:
        await manager.shutdown()
