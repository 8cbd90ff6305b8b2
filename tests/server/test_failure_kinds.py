"""Typed failures (sdk/failures.py) through a real server on loopback: a void episode and an
agent's 0 each carry their kind, boundary and facts in the step reply, the verdict, the
state, the OpenEnv and MCP doors, and the store after a restart, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import make_settings

from palaestra.envs.base import Assessment, EpisodeContext, StepOutcome, Tool, ToolArgs
from palaestra.envs.echo import EchoFamily
from palaestra.sandbox import AgentFault
from palaestra.sdk.failures import Boundary, FailureKind
from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy
from palaestra.sdk.models import EpisodeStatus
from palaestra.server.app import create_app
from palaestra.server.config import REPO_PACKS
from palaestra.server.db import Database
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.server.schema import MIGRATIONS
from palaestra.server.store import Store
from tests.server.test_faults import echo_task, write_pack


class StepCrash(EchoFamily):
    name = "test-fk-step-crash"
    description = "echo whose step crashes on `echo`"

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if tool.name == "echo":
            raise ValueError("the environment fell over")
        return await super().step(ctx, tool, args)


class VerifyCrash(EchoFamily):
    name = "test-fk-verify-crash"
    description = "echo whose verifier crashes"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        raise RuntimeError("the verifier fell over")


class NoAnswer(EchoFamily):
    name = "test-fk-no-answer"
    description = "echo whose verifier finds no answer file (the agent's fault)"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        raise AgentFault("answer.txt does not exist", "missing_file")


FAMILIES = {"scrash": StepCrash, "vcrash": VerifyCrash, "noanswer": NoAnswer}


def write_packs(root: Path) -> Path:
    for short, family in FAMILIES.items():
        write_pack(root / short, f"test/{short}", family.name, [echo_task("t1", family.name)])
    return root


class Served:
    """A manager served by uvicorn on a loopback socket, with the admin token."""

    def __init__(self, manager: EpisodeManager, url: str) -> None:
        self.manager, self.url = manager, url
        token = (manager.settings.data_dir / "admin.token").read_text().strip()
        self.headers = {"authorization": f"Bearer {token}"}
        self.token = token

    def client(self) -> AsyncHTTPClient:
        return AsyncHTTPClient(self.url, token=self.token, retry=RetryPolicy(attempts=1))

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=30.0)


@asynccontextmanager
async def served(data: Path, packs: Path, store: str | None = None) -> AsyncIterator[Served]:
    extra: dict[str, Any] = {} if store is None else {"store": store}
    manager = build_manager(make_settings(data_dir=data, packs_dirs=[REPO_PACKS / "echo"], **extra))
    for family in FAMILIES.values():
        manager.families.add(family())
    manager.packs.load_dirs([packs], [f.name for f in manager.families.all()])
    assert not manager.packs.errors, manager.packs.errors
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(manager.settings, manager=manager), log_config=None)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        yield Served(manager, f"http://127.0.0.1:{sock.getsockname()[1]}")
    finally:
        server.should_exit = True
        await task  # the lifespan shuts the manager down: live episodes end void
        sock.close()


@pytest.fixture
def packs(tmp_path: Path) -> Path:
    return write_packs(tmp_path / "packs")


def kind_of(failure: dict[str, Any] | None) -> tuple[str, str] | None:
    return None if failure is None else (failure["kind"], failure["boundary"])


async def test_every_ending_carries_its_kind_on_v1_the_doors_and_after_restart(
    tmp_path: Path, packs: Path, store_url: str
) -> None:
    data = tmp_path / "data"
    async with served(data, packs, store_url) as srv:
        client = srv.client()
        # An environment crash: void, boundary server, on the step reply and the verdict.
        crash = await client.reset("test/scrash:t1")
        reply = await client.step(crash.episode_id, {"tool": "echo", "arguments": {"text": "x"}})
        assert reply.terminated and reply.reward == 0.0 and reply.info["status"] == "void"
        assert kind_of(reply.info["failure"]) == ("env_crashed", "server")
        assert "environment crashed" in reply.info["failure"]["reason"]
        assert reply.info["verdict"]["failure_kind"] == "env_crashed"
        state = await client.state(crash.episode_id)
        assert state.status is EpisodeStatus.VOID and state.failure is not None
        assert state.failure.kind is FailureKind.ENV_CRASHED
        assert state.failure.boundary is Boundary.SERVER and state.failure.infrastructure
        assert state.void_reason == state.failure.reason  # the old field stays
        # A verifier crash through POST /verify: void, boundary verifier.
        vcrash = await client.reset("test/vcrash:t1")
        verdict = await client.verify(vcrash.episode_id)
        assert verdict.status == "void" and verdict.failure_kind is FailureKind.VERIFIER_CRASHED
        vstate = await client.state(vcrash.episode_id)
        assert vstate.failure is not None and vstate.failure.boundary is Boundary.VERIFIER
        # The agent's fault: `ok`, reward 0, an agent kind, never void.
        none = await client.reset("test/noanswer:t1")
        zero = await client.step(none.episode_id, {"tool": "submit", "arguments": {"answer": "x"}})
        assert zero.info["status"] == "done" and zero.reward == 0.0
        assert kind_of(zero.info["failure"]) == ("no_answer", "agent")
        assert zero.info["failure"]["failure_class"] == "missing_file"
        assert zero.info["verdict"]["failure"] == "missing_file"
        assert zero.info["verdict"]["failure_kind"] == "no_answer"
        # A clean end: no failure.
        fine = await client.reset("palaestra/echo:say-birch")
        won = await client.step(
            fine.episode_id, {"tool": "submit", "arguments": {"answer": "hcrib"}}
        )
        assert won.reward == 1.0 and won.info["failure"] is None
        assert (await client.state(fine.episode_id)).failure is None
        # The OpenEnv door: the step's metadata and the state say the kind.
        async with srv.http() as http:
            door = "/openenv/test/scrash"
            reset = await http.post(f"{door}/reset", json={"task": "t1"})
            assert reset.status_code == 200, reset.text
            eid = reset.json()["metadata"]["episode_id"]
            step = await http.post(
                f"{door}/step", json={"episode_id": eid, "action": {"tool": "echo"}}
            )
            assert step.status_code == 200, step.text
            assert step.json()["done"] is True
            assert kind_of(step.json()["metadata"]["failure"]) == ("env_crashed", "server")
            door_state = await http.get(f"{door}/state", params={"episode_id": eid})
            assert kind_of(door_state.json()["failure"]) == ("env_crashed", "server")
            # MCP through the same door: the last tools/call's structuredContent.
            again = await http.post(f"{door}/reset", json={"task": "t1"})
            mcp_id = again.json()["metadata"]["episode_id"]
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "x"}},
            }
            called = await http.post(f"{door}/mcp", params={"episode_id": mcp_id}, json=call)
            assert called.status_code == 200, called.text
            content = called.json()["result"]["structuredContent"]
            assert content["terminated"] and content["verdict"]["status"] == "void"
            assert kind_of(content["failure"]) == ("env_crashed", "server")
            # The ORS door: the ending call's output metadata.
            sid = {"x-session-id": uuid.uuid4().hex}
            made = await http.post(
                "/create", json={"task_spec": {"id": "test/scrash:t1"}}, headers=sid
            )
            assert made.status_code == 200, made.text
            ors_call = {"name": "echo", "input": {"text": "x"}}
            streamed = await http.post("/test/scrash/call", json=ors_call, headers=sid)
            assert streamed.status_code == 200, streamed.text
            end = json.loads(streamed.text.rstrip().rsplit("data: ", 1)[1])
            assert end["ok"] and end["output"]["finished"], end
            assert kind_of(end["output"]["metadata"]["failure"]) == ("env_crashed", "server")
            # /metrics counts them by kind and boundary (the first crash and three doors').
            text = (await http.get("/metrics")).text
            crashed = 'palaestra_episode_failures_total{boundary="server",kind="env_crashed"} 4.0'
            assert crashed in text, text
            assert 'palaestra_episode_failures_total{boundary="agent",kind="no_answer"} 1.0' in text
        # Left active when the server stops: void for a server reason.
        left = await client.reset("palaestra/echo:say-birch")
        await client.aclose()
    async with served(data, packs, store_url) as srv:
        client = srv.client()
        expected = {
            crash.episode_id: ("env_crashed", "server"),
            vcrash.episode_id: ("verifier_crashed", "verifier"),
            none.episode_id: ("no_answer", "agent"),
            left.episode_id: ("server_shutdown", "server"),
        }
        for eid, kind in expected.items():
            state = await client.state(eid)  # from the store: a new server
            assert state.failure is not None, eid
            assert (state.failure.kind.value, state.failure.boundary.value) == kind
        assert (await client.state(fine.episode_id)).failure is None
        stored = await client.state(left.episode_id)
        assert stored.status is EpisodeStatus.VOID and stored.void_reason == "server shut down"
        crashed = await client.state(crash.episode_id)
        assert kind_of(crashed.trajectory[-1].info["failure"]) == ("env_crashed", "server")
        await client.aclose()


async def test_episodes_a_dead_server_left_active_are_void_for_a_server_reason(
    tmp_path: Path, packs: Path
) -> None:
    """An episode the store still holds `active` (its server died) is void on the next
    start, typed `server_shutdown`."""
    data = tmp_path / "data"
    async with served(data, packs) as srv:
        client = srv.client()
        live = await client.reset("palaestra/echo:say-birch")
        await client.aclose()
        settings = srv.manager.settings
    # What a SIGKILL leaves: the row still active (the graceful stop voided it).
    db = settings.database()
    db.run(
        "UPDATE episodes SET status='active', failure=NULL, void_reason=NULL WHERE id=?",
        (live.episode_id,),
    )
    db.close()
    async with served(data, packs) as srv:
        client = srv.client()
        state = await client.state(live.episode_id)
        await client.aclose()
    assert state.status is EpisodeStatus.VOID and state.void_reason == "server restarted"
    assert state.failure is not None and state.failure.kind is FailureKind.SERVER_SHUTDOWN


def test_a_store_made_before_migration_8_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = Database.open(f"sqlite://{path}")
    assert MIGRATIONS[-1].version >= 8
    db.run("ALTER TABLE episodes DROP COLUMN failure")
    db.run("DELETE FROM schema_migrations WHERE version >= 8")
    db.run(
        "INSERT INTO episodes (id, task, task_digest, family, domain, split, sealed, status,"
        " created_at, updated_at) VALUES ('old', 't', 'd', 'echo', '', '', 0, 'void', 1, 1)"
    )
    db.close()
    store = Store(Database.open(f"sqlite://{path}"))
    try:
        old = store.reads.load_episode("old", with_trajectory=False)
        assert old is not None and old.failure is None
    finally:
        store.close()
