"""Cluster mode: a killed node's checkpointed episodes are resumed on another worker
(server/cluster/resume.py) instead of voided; its other episodes end void `worker_lost` as
before. A real local 3-node Ray cluster behind a real `palaestra serve --ray` front, as in
test_cluster.py (its fixture), echo episodes (no sandbox: nothing but the shared store)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.pg import PostgresServer
from tests.server.cluster.test_cluster import Ctx, authenticated_cluster
from tests.servers import scaled

pytestmark = pytest.mark.slow

pytest.importorskip("ray", reason="cluster mode needs ray (the bootstrap installs it)")

SAY = {"tool": "echo", "arguments": {"text": "z"}}


@pytest.fixture(scope="module")
def ctx(pg_server: PostgresServer) -> Iterator[Ctx]:
    from palaestra.server.cluster import rayauth

    with pytest.MonkeyPatch.context() as patch:
        yield from authenticated_cluster(pg_server, patch)
    rayauth.reload_ray_config()


def test_a_fork_runs_on_its_parents_worker_through_either_front(ctx: Ctx) -> None:
    """A front forks on the parent's worker (it copies the sandbox there), and stores the
    fork's placement first: the other front routes it too. Before: 503 `unsupported`."""
    parent = ctx.reset(task="palaestra/echo:say-birch")
    assert parent.status_code == 200, parent.text
    parent_id, worker = parent.json()["episode_id"], parent.json()["info"]["worker"]
    assert ctx.step(0, parent_id, SAY).status_code == 200
    forked = ctx.call(0, "POST", f"/v1/episodes/{parent_id}/fork", json={})
    assert forked.status_code == 200, forked.text
    child = forked.json()
    assert child["info"]["worker"] == worker and child["step_count"] == 1
    said = {"tool": "echo", "arguments": {"text": "fork"}}
    stepped = ctx.step(1, child["episode_id"], said)  # through the other front
    assert stepped.status_code == 200, stepped.text
    assert stepped.json()["observation"]["text"] == "fork"
    state = ctx.call(1, "GET", f"/v1/episodes/{child['episode_id']}").json()
    assert [s["observation"]["text"] for s in state["trajectory"]] == ["z", "fork"]
    kept = ctx.call(0, "GET", f"/v1/episodes/{parent_id}").json()
    assert len(kept["trajectory"]) == 1  # the parent goes on unchanged
    ctx.close(0, parent_id)
    ended = ctx.call(1, "POST", f"/v1/episodes/{parent_id}/fork", json={})
    assert ended.status_code == 409, ended.text
    ctx.close(1, child["episode_id"])


def test_a_regrade_runs_on_the_worker_that_kept_the_final_state(ctx: Ctx) -> None:
    """Each node keeps its episodes' final states in its own data dir: a front sends the
    regrade there (server/cluster/regrades.py), through either front. Before: 503."""
    started = ctx.reset(task="palaestra/echo:say-birch")
    assert started.status_code == 200, started.text
    episode = started.json()["episode_id"]
    done = ctx.step(0, episode, {"tool": "submit", "arguments": {"answer": "hcrib"}})
    assert done.status_code == 200 and done.json()["reward"] == 1.0, done.text
    for front in (0, 1):
        regraded = ctx.call(front, "POST", f"/v1/episodes/{episode}/regrade",
                            json={"pack": "palaestra/echo"})  # fmt: skip
        assert regraded.status_code == 200, regraded.text
        assert regraded.json()["reward"] == 1.0 and regraded.json()["passed"]
    made = ctx.call(0, "POST", "/v1/tokens", json={"scopes": ["train"], "name": "regrader"})
    stranger = made.json()["token"]
    for target in (episode, "nobody-has-it"):  # another token's episode is an unknown id
        refused = ctx.call(1, "POST", f"/v1/episodes/{target}/regrade", token=stranger,
                           json={"pack": "palaestra/echo"})  # fmt: skip
        assert refused.status_code == 404, refused.text


def test_a_killed_nodes_checkpointed_episodes_resume_on_another(ctx: Ctx) -> None:
    replies = [ctx.reset(task="palaestra/echo:say-birch") for _ in range(9)]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    lost_worker = "palaestra-worker-" + ctx.nodes["plain"].node_id[:16]
    on_lost = [r.json()["episode_id"] for r in replies if r.json()["info"]["worker"] == lost_worker]
    assert len(on_lost) >= 2, [r.json()["info"]["worker"] for r in replies]
    kept, plain = on_lost[: len(on_lost) // 2], on_lost[len(on_lost) // 2 :]
    for episode in on_lost:
        assert ctx.step(0, episode, SAY).status_code == 200
    for episode in kept:
        made = ctx.call(0, "POST", f"/v1/episodes/{episode}/checkpoint")
        assert made.status_code == 200, made.text
        assert made.json()["step_count"] == 1
        assert ctx.step(0, episode, SAY).status_code == 200  # lost with the node
    # The step after the checkpoint is on disk before the node dies (a read waits for the
    # store writer), so "one step" below means rolled back to the checkpoint, not a step the
    # writer's linger never wrote.
    for episode in kept:
        assert len(ctx.call(0, "GET", f"/v1/episodes/{episode}").json()["trajectory"]) == 2
    ctx.cluster.remove_node(ctx.nodes["plain"])
    deadline = time.monotonic() + scaled(60)

    def settled() -> bool:
        states = {e: ctx.call(1, "GET", f"/v1/episodes/{e}").json() for e in on_lost}
        resumed = all(
            states[e]["status"] == "active" and len(states[e]["trajectory"]) == 1 for e in kept
        )
        return resumed and all(states[e]["status"] == "void" for e in plain)

    while not settled() and time.monotonic() < deadline:
        time.sleep(0.5)
    for episode in kept:
        state = ctx.call(1, "GET", f"/v1/episodes/{episode}").json()
        assert state["status"] == "active", state
        assert state["step_count"] == 1 and len(state["trajectory"]) == 1, state
        done = ctx.step(1, episode, {"tool": "submit", "arguments": {"answer": "hcrib"}})
        assert done.status_code == 200, done.text
        assert done.json()["terminated"] and done.json()["reward"] == 1.0
    for episode in plain:
        state = ctx.call(1, "GET", f"/v1/episodes/{episode}").json()
        assert state["status"] == "void" and state["failure"]["kind"] == "worker_lost", state
