"""Checkpoint and resume (`POST /v1/episodes/{id}/checkpoint`, `.../resume`,
server/checkpoint.py): a checkpointed episode outlives its server and goes on from its
checkpoint, under the same id, its workspace and trajectory as they were then.

Real bwrap sandboxes (and docker where the engine is up), the real app over real managers
(ASGI) restarted on one data dir; the SIGKILL of a real `palaestra serve` is in
tests/server/test_checkpoint_kill.py."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import docker_skip_reason, make_settings

from palaestra.sandbox.docker import BASE_IMAGE
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests.redteam.tenants import ECHO, SAY, Tenant, client, tenant

DOCKER_SKIP = docker_skip_reason(BASE_IMAGE)
HE = "openai/humaneval:HumanEval-1"
TERMINAL = "palaestra/terminal-core:c-build-link-math"
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


def write(path: str, content: str) -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


LS = {"tool": "run_python", "arguments": {"code": "import os; print(sorted(os.listdir()))"}}


async def step(t: Tenant, eid: str, action: dict[str, Any], rid: str | None = None) -> Any:
    body: dict[str, Any] = {"action": action, **({"request_id": rid} if rid else {})}
    reply = await t.http.post(f"/v1/episodes/{eid}/step", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def post(t: Tenant, eid: str, what: str) -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/{what}")


class Servers:
    """Managers one after another on one data dir (a restart); tenants follow them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.manager: EpisodeManager | None = None
        self.tenants: list[Tenant] = []

    async def start(self) -> EpisodeManager:
        self.manager = build_manager(self.settings)
        await self.manager.start()
        for t in self.tenants:
            await t.http.aclose()
            t.http = client(self.manager, t.token)
        return self.manager

    def tenant(self, scopes: list[str], **quota: Any) -> Tenant:
        assert self.manager is not None
        self.tenants.append(tenant(self.manager, scopes, **quota))
        return self.tenants[-1]

    async def stop(self) -> None:
        if self.manager is not None:
            await self.manager.shutdown()
            self.manager = None


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    made = Servers(make_settings(data_dir=tmp_path / "data"))
    await made.start()
    yield made
    await made.stop()
    for t in made.tenants:
        await t.http.aclose()


async def checkpointed(servers: Servers, me: Tenant) -> str:
    """An episode checkpointed after one step, one more step after it, then a restart."""
    eid = await me.start(task=HE)
    await step(me, eid, write("solution.py", SOLUTION), rid="r-0")
    reply = await post(me, eid, "checkpoint")
    assert reply.status_code == 200, reply.text
    await step(me, eid, write("later.txt", "lost"), rid="r-1")
    await servers.stop()
    await servers.start()
    return eid


async def test_checkpoint_keeps_the_episode_going(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eid = await me.start(task=HE)
    await step(me, eid, write("a.txt", "one"))
    reply = await post(me, eid, "checkpoint")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["episode_id"] == eid and body["step_count"] == 1
    assert body["workspace_bytes"] > 0 and len(body["checkpoint_id"]) == 32
    assert set(body) == {
        "episode_id",
        "checkpoint_id",
        "step_count",
        "created_at",
        "workspace_bytes",
    }
    # The episode goes on; a second checkpoint replaces the first.
    await step(me, eid, write("b.txt", "two"))
    again = (await post(me, eid, "checkpoint")).json()
    assert again["step_count"] == 2 and again["checkpoint_id"] != body["checkpoint_id"]
    assert servers.manager is not None
    rows = servers.manager.store.db.all("SELECT episode_id, step_count FROM checkpoints")
    assert [tuple(r) for r in rows] == [(eid, 2)]


async def test_a_restart_leaves_it_resumable_and_resume_goes_on_from_the_checkpoint(
    servers: Servers,
) -> None:
    me = servers.tenant(["train"])
    eid = await checkpointed(servers, me)
    assert (await me.http.get(f"/v1/episodes/{eid}")).json()["status"] == "resumable"
    reply = await post(me, eid, "resume")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["episode_id"] == eid and body["resumed_at_step"] == 1 and body["lost_steps"] == 1
    assert [t["name"] for t in body["tools"]][:2] == ["write_file", "run_python"]
    state = (await me.http.get(f"/v1/episodes/{eid}")).json()
    assert state["status"] == "active" and state["step_count"] == 1
    assert [r["action"]["arguments"].get("path") for r in state["trajectory"]] == ["solution.py"]
    # The workspace is the checkpoint's: the step after it is gone.
    assert "['solution.py']" in (await step(me, eid, LS))["observation"]["text"]
    # A request id stepped before the checkpoint replays; one after it steps anew.
    replay = await step(me, eid, write("x.txt", "never"), rid="r-0")
    assert replay["observation"] == state["trajectory"][0]["observation"]
    done = await step(me, eid, {"tool": "submit", "arguments": {}})
    assert done["terminated"] and done["reward"] == 1.0
    final = (await me.http.get(f"/v1/episodes/{eid}")).json()
    assert final["status"] == "done" and final["step_count"] == 3
    again = await post(me, eid, "resume")  # ended: never resumed twice
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_resumable"


async def test_resume_and_checkpoint_refusals(servers: Servers) -> None:
    me, other = servers.tenant(["train"]), servers.tenant(["train"])
    live = await me.start(task=HE)
    refused = await post(me, live, "resume")  # live: nothing to resume
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_resumable"
    for what in ("checkpoint", "resume"):  # another token's, and nobody's: the same 404
        for eid in (live, "no-such-episode"):
            reply = await post(other, eid, what)
            assert reply.status_code == 404, (what, eid, reply.text)
            assert reply.json()["error"]["code"] == "not_found"
    assert (await me.http.delete(f"/v1/episodes/{live}")).status_code == 204
    ended = await post(me, live, "checkpoint")
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "episode_ended"
    closed = await post(me, live, "resume")
    assert closed.status_code == 409 and closed.json()["error"]["code"] == "not_resumable"


async def test_episodes_without_a_checkpoint_are_void_at_restart(servers: Servers) -> None:
    me = servers.tenant(["train"])
    kept = await me.start(task=HE)
    assert (await post(me, kept, "checkpoint")).status_code == 200
    plain = await me.start(task=HE)
    await servers.stop()
    # as a crash leaves them (the SIGKILL itself: tests/server/test_checkpoint_kill.py)
    tamper(servers.settings.data_dir, "UPDATE episodes SET status='active', ended_at=NULL")
    await servers.start()
    voided = (await me.http.get(f"/v1/episodes/{plain}")).json()
    assert voided["status"] == "void" and voided["failure"]["kind"] == "server_shutdown"
    assert (await me.http.get(f"/v1/episodes/{kept}")).json()["status"] == "resumable"
    void = await post(me, plain, "resume")
    assert void.status_code == 409 and void.json()["error"]["code"] == "not_resumable"


def tamper(data: Path, sql: str, *params: Any) -> None:
    with sqlite3.connect(data / "palaestra.sqlite3") as db:
        db.execute(sql, params)


@pytest.mark.parametrize("how", ["pack_changed", "snapshot_gone", "image_missing"])
async def test_an_unrestorable_checkpoint_ends_the_episode_void_naming_why(
    servers: Servers, how: str
) -> None:
    me = servers.tenant(["train"])
    eid = await checkpointed(servers, me)
    await servers.stop()
    data = servers.settings.data_dir
    if how == "pack_changed":  # the task its pack version served then is not served now
        record = "json_set(record, '$.task_digest', 'sha256:' || hex(zeroblob(32)))"
        tamper(data, f"UPDATE checkpoints SET record={record}")
    elif how == "snapshot_gone":
        for snapshot in (data / "snapshots" / "sha256").rglob("*"):
            if snapshot.is_file():
                snapshot.unlink()
    else:
        tamper(data, "UPDATE checkpoints SET record=json_set(record, '$.image', 'gone/img:0')")
    await servers.start()
    reply = await post(me, eid, "resume")
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert error["code"] == "resume_failed"
    why = {"pack_changed": "changed", "snapshot_gone": "snapshot", "image_missing": "gone/img"}
    assert why[how] in error["message"]
    state = (await me.http.get(f"/v1/episodes/{eid}")).json()
    assert state["status"] == "void"
    assert state["failure"]["kind"] == "resume_failed"
    assert state["failure"]["boundary"] == "server"
    assert why[how] in state["failure"]["reason"]
    assert state["verdict"]["status"] == "void"
    assert state["verdict"]["failure_kind"] == "resume_failed"
    assert (await post(me, eid, "resume")).status_code == 409  # void stays void


@pytest.mark.slow
@pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
async def test_a_docker_episode_resumes(tmp_path: Path) -> None:
    """On docker the resumed container gets the checkpoint's workdir as it was."""
    made = Servers(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await made.start()
    try:
        me = made.tenant(["train"])
        eid = await me.start(task=HE)
        await step(me, eid, write("solution.py", SOLUTION))
        link = "import os; os.symlink('/work/solution.py', 'abs'); print('ok')"
        await step(me, eid, {"tool": "run_python", "arguments": {"code": link}})
        assert (await post(me, eid, "checkpoint")).status_code == 200
        await step(me, eid, write("later.txt", "lost"))
        await made.stop()
        await made.start()
        reply = await post(me, eid, "resume")
        assert reply.status_code == 200, reply.text
        assert reply.json()["resumed_at_step"] == 2 and reply.json()["lost_steps"] == 1
        code = "import os; print(sorted(os.listdir()), os.readlink('abs'))"
        seen = await step(me, eid, {"tool": "run_python", "arguments": {"code": code}})
        assert "['abs', 'solution.py'] /work/solution.py" in seen["observation"]["text"]
        done = await step(me, eid, {"tool": "submit", "arguments": {}})
        assert done["terminated"] and done["reward"] == 1.0
    finally:
        await made.stop()
        for t in made.tenants:
            await t.http.aclose()


async def test_a_sandboxless_episode_resumes_on_each_store_engine(
    tmp_path: Path, store_url: str
) -> None:
    """An echo episode (no sandbox: the family's state is all there is), on SQLite and on
    PostgreSQL (the checkpoint's table, its writes and the trajectory's cut)."""
    made = Servers(make_settings(data_dir=tmp_path / "data", store=store_url))
    await made.start()
    try:
        me = made.tenant(["train"])
        eid = await me.start(task=ECHO)
        await step(me, eid, SAY, rid="e-0")
        body = (await post(me, eid, "checkpoint")).json()
        assert body["workspace_bytes"] == 0
        await step(me, eid, SAY, rid="e-1")
        await step(me, eid, SAY, rid="e-2")
        await made.stop()
        await made.start()
        back = (await post(me, eid, "resume")).json()
        assert back["resumed_at_step"] == 1 and back["lost_steps"] == 2
        state = (await me.http.get(f"/v1/episodes/{eid}")).json()
        assert [r["request_id"] for r in state["trajectory"]] == ["e-0"]
        done = await step(me, eid, {"tool": "submit", "arguments": {"answer": "hcrib"}})
        assert done["terminated"] and done["reward"] == 1.0
    finally:
        await made.stop()
        for t in made.tenants:
            await t.http.aclose()


async def test_a_terminal_episode_resumes_without_its_shell(servers: Servers) -> None:
    """The terminal family's state leaves its shell out (a live process): the resumed
    episode's first `bash` starts a fresh one in the restored workdir."""
    me = servers.tenant(["train"])
    eid = await me.start(task=TERMINAL)
    made = await step(me, eid, {"tool": "bash", "arguments": {"command": "echo kept > k.txt"}})
    assert not made["terminated"], made
    assert (await post(me, eid, "checkpoint")).status_code == 200
    await servers.stop()
    await servers.start()
    assert (await post(me, eid, "resume")).status_code == 200
    seen = await step(me, eid, {"tool": "bash", "arguments": {"command": "cat k.txt"}})
    assert "kept" in seen["observation"]["text"], seen
