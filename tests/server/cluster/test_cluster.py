"""Cluster mode on a real local 3-node Ray cluster, behind real `palaestra serve --ray` fronts.

One cluster for the module (`ray.cluster_utils.Cluster`, every node on 127.0.0.1): the head
and node 3 plain, node 2 labelled `bpy`, each with 4 episode slots. Two fronts share one data
dir and a real PostgreSQL database (the shared store). The tests run in order on that cluster:
placement, the full cluster, two fronts, quotas across fronts, a front killed and
restarted, and last a node killed mid-run. The cluster runs with Ray's token authentication
(server/cluster/rayauth.py), as every cluster a front joins must: the token is in a 0600 file
the fronts name with PALAESTRA_RAY_TOKEN_FILE (attacks on it: tests/redteam/test_ray_auth.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.server.cluster import rayauth
from palaestra.server.cluster.connect import pin_loopback
from tests.conftest import BIN, ServerProcess, cli_env
from tests.pg import PostgresServer
from tests.servers import scaled

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SLOTS = 4
PACKS = ["--packs", str(REPO / "packs" / "echo"), "--packs", str(REPO / "packs" / "cad")]

pytest.importorskip("ray", reason="cluster mode needs ray (the bootstrap installs it)")


class Ctx:
    def __init__(self, cluster: Any, nodes: dict[str, Any], fronts: list[ServerProcess]) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.fronts = fronts

    def call(
        self, front: int, method: str, path: str, token: str | None = None, **kw: Any
    ) -> httpx.Response:
        server = self.fronts[front]
        headers = {"authorization": f"Bearer {token or server.token}"}
        return httpx.request(method, server.url + path, headers=headers, timeout=60, **kw)

    def reset(self, front: int = 0, token: str | None = None, **body: Any) -> httpx.Response:
        body.setdefault("pack", "palaestra/echo")
        body.setdefault("split", "train")
        body.setdefault("options", {"max_steps": 1000})
        return self.call(front, "POST", "/v1/episodes", token, json=body)

    def step(
        self, front: int, episode: str, action: dict[str, Any], **extra: Any
    ) -> httpx.Response:
        return self.call(
            front, "POST", f"/v1/episodes/{episode}/step", json={"action": action, **extra}
        )

    def close(self, front: int, episode: str) -> None:
        assert self.call(front, "DELETE", f"/v1/episodes/{episode}").status_code == 204


@pytest.fixture(scope="module")
def ctx(pg_server: PostgresServer) -> Iterator[Ctx]:
    with pytest.MonkeyPatch.context() as patch:
        yield from authenticated_cluster(pg_server, patch)
    rayauth.reload_ray_config()  # this process leaves token mode with the cluster


def authenticated_cluster(pg_server: PostgresServer, patch: pytest.MonkeyPatch) -> Iterator[Ctx]:
    pin_loopback()
    temp = Path(tempfile.mkdtemp(prefix="pc-", dir="/tmp"))
    token = temp / "ray" / "auth_token"
    rayauth.ensure_token(token, own_folder=True)
    patch.setenv("RAY_AUTH_MODE", "token")  # the nodes this process starts inherit both
    patch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    patch.delenv("RAY_AUTH_TOKEN", raising=False)
    rayauth.reload_ray_config()
    from ray.cluster_utils import Cluster

    node = {
        "num_cpus": 1,
        "node_ip_address": "127.0.0.1",
        "resources": {"palaestra_episodes": SLOTS},
    }
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={**node, "include_dashboard": False, "temp_dir": str(temp)},
    )
    nodes = {"head": cluster.head_node}
    nodes["bpy"] = cluster.add_node(**node, labels={"bpy": "1"})
    nodes["plain"] = cluster.add_node(**node)
    cluster.wait_for_nodes()
    env = cli_env(
        PALAESTRA_RAY_POLL_S="0.3", PALAESTRA_IDLE_TTL_S="600", PALAESTRA_RAY_TOKEN_FILE=str(token)
    )
    store = pg_server.create_database()  # the shared store of a real deployment
    args = ["--ray", str(cluster.address), "--store", store, *PACKS]
    data = temp / "data"
    fronts = [ServerProcess(data, env, [*args, "--log-level", "info"]) for _ in range(2)]
    try:
        for front in fronts:
            front.start()
        yield Ctx(cluster, nodes, fronts)
    finally:
        for front in fronts:
            front.stop()
        cluster.shutdown()
        pg_server.drop_database(store)
        shutil.rmtree(temp, ignore_errors=True)


def workers_of(replies: list[httpx.Response]) -> Counter[str]:
    return Counter(r.json()["info"]["worker"] for r in replies)


def test_episodes_spread_by_resources_and_labels(ctx: Ctx) -> None:
    echo = [ctx.reset() for _ in range(6)]
    assert all(r.status_code == 200 for r in echo), [r.text for r in echo]
    assert len(workers_of(echo)) == 3  # the freest worker first: all three take some
    cad = [ctx.reset(pack="palaestra/cad") for _ in range(2)]
    assert all(r.status_code == 200 for r in cad), [r.text for r in cad]
    bpy_worker = set(workers_of(cad))
    assert len(bpy_worker) == 1  # only node 2 has `bpy`
    # fill the cluster: 12 slots; 8 are taken
    more = [ctx.reset() for _ in range(4)]
    assert all(r.status_code == 200 for r in more), [r.text for r in more]
    full = ctx.reset()
    assert full.status_code == 429, full.text
    assert "every worker" in full.json()["error"]["message"]
    assert full.headers.get("retry-after")
    for reply in [*echo, *cad, *more]:
        ctx.close(0, reply.json()["episode_id"])
    again = ctx.reset()
    assert again.status_code == 200
    ctx.close(0, again.json()["episode_id"])


def test_two_fronts_serve_the_same_episodes(ctx: Ctx) -> None:
    reply = ctx.reset(front=0).json()
    episode = reply["episode_id"]
    first = ctx.step(0, episode, {"tool": "echo", "arguments": {"text": "a"}})
    second = ctx.step(1, episode, {"tool": "echo", "arguments": {"text": "b"}})
    assert first.status_code == second.status_code == 200, second.text
    assert second.json()["observation"]["text"] == "b"
    answer = {"tool": "submit", "arguments": {"answer": "wrong"}}
    done = ctx.step(1, episode, answer).json()
    assert done["terminated"] and done["info"]["status"] == "done"
    state = ctx.call(0, "GET", f"/v1/episodes/{episode}").json()
    assert [s["action"]["arguments"].get("text") for s in state["trajectory"][:2]] == ["a", "b"]
    assert state["verdict"]["reward"] == 0.0
    # The front that saw the episode end records it for its sampler, as an embedded server does.
    report = ctx.call(1, "GET", "/v1/sampler").json()
    counted = {t["task"]: t["episodes"] for t in report["tasks"]}
    assert counted.get(reply["info"]["task"], 0) >= 1, report["tasks"]


def test_a_front_serves_its_workers_metrics(ctx: Ctx) -> None:
    reply = ctx.reset(front=1).json()
    worker = reply["info"]["worker"]
    text = ctx.call(1, "GET", "/metrics").text
    assert f'palaestra_worker_up{{worker="{worker}"}} 1.0' in text
    assert f'palaestra_episodes_started_total{{family="echo",worker="{worker}"}}' in text
    assert 'palaestra_sandboxes_live{worker="front"}' in text
    ctx.close(1, reply["episode_id"])


def test_quotas_hold_across_fronts(ctx: Ctx) -> None:
    made = ctx.call(
        0, "POST", "/v1/tokens", json={"scopes": ["train"], "name": "q2", "max_live": 2}
    )
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    a = ctx.reset(0, token)
    b = ctx.reset(1, token)
    assert a.status_code == b.status_code == 200, b.text
    over = ctx.reset(1, token)
    assert over.status_code == 429 and over.json()["error"]["code"] == "quota_exceeded", over.text
    assert ctx.reset(0, token).status_code == 429
    closed = ctx.call(1, "DELETE", f"/v1/episodes/{a.json()['episode_id']}", token)
    assert closed.status_code == 204
    c = ctx.reset(0, token)  # the end went through front 1; front 0 admits at once
    assert c.status_code == 200, c.text
    for reply in (b, c):
        ctx.call(0, "DELETE", f"/v1/episodes/{reply.json()['episode_id']}", token)


def test_another_tokens_episode_answers_404_through_any_front(ctx: Ctx) -> None:
    """Routing by the shared placement map never skips the worker's ownership check."""
    tokens = []
    for name in ("owner-a", "intruder-b"):
        made = ctx.call(0, "POST", "/v1/tokens", json={"scopes": ["train"], "name": name})
        assert made.status_code == 201, made.text
        tokens.append(made.json()["token"])
    episode = ctx.reset(0, tokens[0]).json()["episode_id"]
    step = {"action": {"tool": "submit", "arguments": {"answer": "x"}}}
    for front in (0, 1):
        path = f"/v1/episodes/{episode}"
        assert ctx.call(front, "POST", path + "/step", tokens[1], json=step).status_code == 404
        assert ctx.call(front, "GET", path, tokens[1]).status_code == 404
        assert ctx.call(front, "DELETE", path, tokens[1]).status_code == 404
        assert ctx.call(front, "POST", path + "/verify", tokens[1]).status_code == 404
    mine = ctx.call(1, "GET", f"/v1/episodes/{episode}", tokens[0]).json()
    assert mine["status"] == "active" and mine["step_count"] == 0  # untouched by the intruder
    ctx.call(0, "DELETE", f"/v1/episodes/{episode}", tokens[0])


def ledger_pids() -> list[int]:
    """The ledger actor's process (Ray titles it `ray::Ledger…`)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::Ledger"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_a_killed_ledger_is_made_again_and_quotas_hold(ctx: Ctx) -> None:
    made = ctx.call(
        0, "POST", "/v1/tokens", json={"scopes": ["train"], "name": "q1", "max_live": 1}
    )
    token = made.json()["token"]
    first = ctx.reset(0, token)
    assert first.status_code == 200, first.text
    ctx.call(0, "DELETE", f"/v1/episodes/{first.json()['episode_id']}", token)
    pids = ledger_pids()
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + scaled(30)
    while pids[0] in ledger_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    again = ctx.reset(1, token)  # the front's ledger channel broke: the ledger is remade
    assert again.status_code == 200, again.text
    assert ledger_pids() not in ([], pids)
    over = ctx.reset(0, token)  # the other front finds the new ledger too, and it counts
    assert over.status_code == 429 and over.json()["error"]["code"] == "quota_exceeded", over.text
    ctx.call(1, "DELETE", f"/v1/episodes/{again.json()['episode_id']}", token)
    last = ctx.reset(0, token)
    assert last.status_code == 200, last.text
    ctx.call(0, "DELETE", f"/v1/episodes/{last.json()['episode_id']}", token)


def test_a_restarted_front_keeps_routing(ctx: Ctx) -> None:
    started = [ctx.reset(front=0) for _ in range(3)]
    assert all(r.status_code == 200 for r in started), [r.text for r in started]
    episodes = [r.json()["episode_id"] for r in started]
    for episode in episodes:
        reply = ctx.step(0, episode, {"tool": "echo", "arguments": {"text": "x"}}, request_id="r1")
        assert reply.status_code == 200
    front = ctx.fronts[0]
    front.stop(signal.SIGKILL)  # mid-run: nothing in flight is lost
    front.start()
    for episode in episodes:
        replay = ctx.step(
            0, episode, {"tool": "echo", "arguments": {"text": "other"}}, request_id="r1"
        )
        assert replay.status_code == 200 and replay.json()["observation"]["text"] == "x"
        after = ctx.step(0, episode, {"tool": "echo", "arguments": {"text": "y"}})
        assert after.json()["observation"]["text"] == "y"
        ctx.close(0, episode)


def test_a_killed_node_voids_exactly_its_episodes(ctx: Ctx) -> None:
    replies = [ctx.reset() for _ in range(6)]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    by_worker: dict[str, list[str]] = {}
    for reply in replies:
        by_worker.setdefault(reply.json()["info"]["worker"], []).append(reply.json()["episode_id"])
    plain_node = ctx.nodes["plain"].node_id
    lost_worker = "palaestra-worker-" + plain_node[:16]
    assert lost_worker in by_worker
    ctx.cluster.remove_node(ctx.nodes["plain"])
    deadline = time.monotonic() + scaled(30)
    lost = by_worker[lost_worker]
    while time.monotonic() < deadline:
        states = [ctx.call(1, "GET", f"/v1/episodes/{e}").json() for e in lost]
        if all(s["status"] == "void" for s in states):
            break
        time.sleep(0.3)
    for episode in lost:
        state = ctx.call(1, "GET", f"/v1/episodes/{episode}").json()
        assert state["status"] == "void" and state["void_reason"] == "worker_lost", state
        assert state["verdict"]["status"] == "void"
        assert state["failure"]["kind"] == "worker_lost", state["failure"]
        assert state["failure"]["boundary"] == "server"
        step = ctx.step(0, episode, {"tool": "echo", "arguments": {"text": "z"}})
        assert step.status_code == 200 and step.json()["info"]["void_reason"] == "worker_lost"
        assert step.json()["info"]["failure"]["kind"] == "worker_lost"
    survivors = [e for w, es in by_worker.items() if w != lost_worker for e in es]
    for episode in survivors:  # the others finish, verified as usual
        oracle = ctx.call(0, "GET", f"/v1/episodes/{episode}").json()
        assert oracle["status"] == "active"
        done = ctx.step(0, episode, {"tool": "submit", "arguments": {"answer": "nope"}})
        assert done.status_code == 200, done.text
        assert done.json()["info"]["status"] == "done"
    report = ctx.call(0, "GET", "/v1/sampler").json()
    assert report["quarantined"] == []  # worker_lost voids never count against a task
    fresh = [ctx.reset() for _ in range(4)]
    assert all(r.status_code == 200 for r in fresh)
    assert lost_worker not in workers_of(fresh)
    # cad needs `bpy`: only node 2 has it; with node 2 gone, a clear 503, not a hang
    ctx.cluster.remove_node(ctx.nodes["bpy"])
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline:
        cad = ctx.reset(pack="palaestra/cad")
        if cad.status_code == 503 and cad.json()["error"]["code"] == "no_capable_node":
            break
        if cad.status_code == 200:
            ctx.close(0, cad.json()["episode_id"])
        time.sleep(0.3)
    assert cad.status_code == 503, cad.text
    assert cad.json()["error"]["code"] == "no_capable_node"
    assert "bpy" in cad.json()["error"]["message"]


def test_an_unreachable_ray_address_fails_at_start(tmp_path: Path) -> None:
    run = subprocess.run(
        [str(BIN / "palaestra"), "serve", "--ray", "127.0.0.1:1", "--data-dir", str(tmp_path)],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "no Ray cluster answers at 127.0.0.1:1" in run.stderr
    assert "Traceback" not in run.stderr
