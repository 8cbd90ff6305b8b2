"""Fault isolation: an infrastructure fault voids the episode (never reward 0), the server
keeps serving, and what is stored stays stored. Real bwrap sandboxes, real packs on disk."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess, make_settings

from palaestra.envs.base import Assessment, EpisodeContext, StepOutcome, Tool, ToolArgs
from palaestra.envs.echo import EchoFamily
from palaestra.sandbox import Backend, Sandbox, SandboxCreateError, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sdk.errors import CapacityError, ConflictError
from palaestra.sdk.models import EpisodeState, StepResponse
from palaestra.server.app import create_app
from palaestra.server.config import REPO_PACKS
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.manifest import read_manifest
from palaestra.server.runtime import build_manager
from tests.hosts import local_host

ECHO = "palaestra/echo:say-birch"
HE0 = "openai/humaneval:HumanEval-0"
HE0_SOLUTION = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold\n"
    "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)


class VerifyCrashFamily(EchoFamily):
    name = "test-verify-crash"
    description = "echo whose verifier crashes"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        raise RuntimeError("the verifier fell over")


class StepCrashFamily(EchoFamily):
    name = "test-step-crash"
    description = "echo whose step crashes on `echo`"

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if tool.name == "echo":
            raise ValueError("the environment fell over")
        return await super().step(ctx, tool, args)


def write_pack(root: Path, name: str, family: str, tasks: list[dict[str, object]]) -> Path:
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        f'name = "{name}"\nversion = "0.1.0"\nfamilies = ["{family}"]\n\n'
        "[splits.train]\nsealed = false\n"
    )
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return root


def echo_task(task_id: str, family: str, answer: str = "ok") -> dict[str, object]:
    return {
        "id": task_id,
        "family": family,
        "domain": "test/faults",
        "split": "train",
        "difficulty": "easy",
        "public": {"instruction": f"Submit {answer!r}."},
        "private": {"answer": answer},
    }


@pytest.fixture
async def faulty(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    """A manager with two crashing families registered and a pack of tasks for each."""
    packs = tmp_path / "packs"
    write_pack(
        packs / "vcrash",
        "test/vcrash",
        VerifyCrashFamily.name,
        [echo_task("t1", "test-verify-crash")],
    )
    write_pack(
        packs / "scrash", "test/scrash", StepCrashFamily.name, [echo_task("t1", "test-step-crash")]
    )
    manager = build_manager(make_settings(data_dir=tmp_path / "data", packs_dirs=[REPO_PACKS]))
    manager.families.add(VerifyCrashFamily())
    manager.families.add(StepCrashFamily())
    manager.packs.load_dirs([packs], [f.name for f in manager.families.all()])
    assert not manager.packs.errors, manager.packs.errors
    await manager.start()
    try:
        yield manager
    finally:
        await manager.shutdown()


async def stored(manager: EpisodeManager, episode_id: str) -> EpisodeState:
    state = await manager.store.load_episode(episode_id)  # sees every write before it
    assert state is not None
    return state


def assert_void_reply(reply: StepResponse) -> None:
    assert reply.terminated
    assert reply.reward == 0.0
    assert reply.info["status"] == "void", reply.info
    assert reply.info["verdict"]["status"] == "void"
    assert reply.info["verdict"]["passed"] is False


async def still_serving(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    reset = await client.reset(ECHO)
    reply = await client.step(
        reset.episode_id, {"tool": "submit", "arguments": {"answer": "hcrib"}}
    )
    assert reply.terminated and reply.reward == 1.0
    assert reply.info["status"] == "done"


# -- crashing verifier / family ---------------------------------------------------------------


async def test_verifier_crash_voids_episode(faulty: EpisodeManager) -> None:
    client = AsyncInProcessClient(faulty)
    reset = await client.reset("test/vcrash:t1")
    eid = reset.episode_id
    reply = await client.step(eid, {"tool": "submit", "arguments": {"answer": "ok"}})
    assert_void_reply(reply)
    assert "verifier crashed" in reply.info["verdict"]["feedback"]
    verdict = await client.verify(eid)
    assert verdict.status == "void" and verdict.reward == 0.0 and not verdict.passed
    state = await client.state(eid)
    assert state.status == "void"
    assert state.void_reason and "verifier crashed" in state.void_reason
    saved = await stored(faulty, eid)
    assert saved.status == "void"
    assert saved.void_reason == state.void_reason
    assert saved.verdict is not None and saved.verdict.status == "void"
    assert saved.step_count == 1 and len(saved.trajectory) == 1
    await still_serving(faulty)


async def test_verify_call_on_crashing_verifier_voids(faulty: EpisodeManager) -> None:
    client = AsyncInProcessClient(faulty)
    reset = await client.reset("test/vcrash:t1")
    verdict = await client.verify(reset.episode_id)  # verify without submitting first
    assert verdict.status == "void" and not verdict.passed
    assert (await client.state(reset.episode_id)).status == "void"
    await still_serving(faulty)


async def test_family_step_crash_voids_episode(faulty: EpisodeManager) -> None:
    client = AsyncInProcessClient(faulty)
    reset = await client.reset("test/scrash:t1")
    eid = reset.episode_id
    reply = await client.step(eid, {"tool": "echo", "arguments": {"text": "hi"}})
    assert_void_reply(reply)
    assert "crashed" in reply.info["void_reason"]
    state = await client.state(eid)
    assert state.status == "void" and state.void_reason
    assert (await client.verify(eid)).status == "void"
    with pytest.raises(ConflictError):
        await client.step(eid, {"tool": "submit", "arguments": {"answer": "ok"}})
    saved = await stored(faulty, eid)
    assert saved.status == "void" and saved.verdict is not None
    assert saved.verdict.status == "void"
    await still_serving(faulty)


async def test_family_step_crash_over_http_is_not_a_500(faulty: EpisodeManager) -> None:
    app = create_app(faulty.settings, manager=faulty)
    app.state.manager = faulty  # the lifespan is not run by the ASGI transport
    transport = httpx.ASGITransport(app=app)
    token = (faulty.settings.data_dir / "admin.token").read_text().strip()
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://app", headers=headers
    ) as http:
        reset = await http.post("/v1/episodes", json={"task": "test/scrash:t1"})
        assert reset.status_code == 200, reset.text
        eid = reset.json()["episode_id"]
        step = await http.post(
            f"/v1/episodes/{eid}/step", json={"action": {"tool": "echo", "arguments": {}}}
        )
        assert step.status_code == 200, step.text
        body = step.json()
        assert body["terminated"] is True and body["info"]["status"] == "void"
        verdict = await http.post(f"/v1/episodes/{eid}/verify")
        assert verdict.status_code == 200 and verdict.json()["status"] == "void"
        again = await http.post(
            f"/v1/episodes/{eid}/step", json={"action": {"tool": "submit", "arguments": {}}}
        )
        assert again.status_code == 409, again.text


# -- sandbox faults ---------------------------------------------------------------------------


async def test_sandbox_dies_mid_episode(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    reset = await client.reset(HE0)
    eid = reset.episode_id
    ok = await client.step(eid, {"tool": "run_python", "arguments": {"code": "print(6 * 7)"}})
    assert "42" in ok.observation.text
    sandbox = local_host(manager)._live[eid].ctx.sandboxes.episode
    assert sandbox is not None
    await sandbox.close()  # the sandbox is gone under the episode
    reply = await client.step(eid, {"tool": "run_python", "arguments": {"code": "print(1)"}})
    assert_void_reply(reply)
    assert "sandbox failed" in reply.info["void_reason"]
    assert reply.info["failure"]["kind"] == "sandbox_failed"
    assert reply.info["failure"]["boundary"] == "sandbox"
    state = await client.state(eid)
    assert state.status == "void"
    assert state.failure is not None and state.failure.kind == "sandbox_failed"
    assert (
        local_host(manager).sandboxes.backend is not None
        and local_host(manager).sandboxes.backend.live_count == 0
    )
    saved = await stored(manager, eid)
    assert saved.status == "void" and saved.step_count == 2
    # The server keeps serving new coding episodes.
    fresh = await client.reset(HE0, options={"oracle": True})
    await client.step(fresh.episode_id, {"tool": "oracle"})
    done = await client.step(fresh.episode_id, {"tool": "oracle"})
    assert done.reward == 1.0 and done.info["status"] == "done"


async def test_sandbox_dies_before_verification(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    reset = await client.reset(HE0)
    eid = reset.episode_id
    await client.step(
        eid, {"tool": "write_file", "arguments": {"path": "solution.py", "content": HE0_SOLUTION}}
    )
    sandbox = local_host(manager)._live[eid].ctx.sandboxes.episode
    assert sandbox is not None
    await sandbox.close()
    reply = await client.step(eid, {"tool": "submit"})
    assert_void_reply(reply)
    assert (await client.state(eid)).status == "void"


class FlakyBackend(Backend):
    """The real bwrap backend, except that `create` fails while `broken` is set."""

    name = "flaky-bwrap"

    def __init__(self) -> None:
        self.inner = BwrapBackend()
        self.broken = False
        self.refused = 0

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if self.broken:
            self.refused += 1
            raise SandboxCreateError("no room for another sandbox")
        return await self.inner.create(spec)

    @property
    def live_count(self) -> int:
        return self.inner.live_count

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_verification_sandbox_cannot_be_created(tmp_path: Path) -> None:
    backend = FlakyBackend()
    manager = build_manager(make_settings(data_dir=tmp_path / "data"), backend=backend)
    await manager.start()
    try:
        client = AsyncInProcessClient(manager)
        reset = await client.reset(HE0)
        eid = reset.episode_id
        await client.step(
            eid,
            {"tool": "write_file", "arguments": {"path": "solution.py", "content": HE0_SOLUTION}},
        )
        backend.broken = True  # the fresh verification sandbox cannot be made
        reply = await client.step(eid, {"tool": "submit"})
        assert backend.refused == 1
        assert_void_reply(reply)
        state = await client.state(eid)
        assert state.status == "void" and state.void_reason
        assert "sandbox failed" in state.void_reason
        saved = await stored(manager, eid)
        assert saved.status == "void" and saved.verdict is not None
        assert saved.verdict.status == "void"
        assert backend.live_count == 0
        backend.broken = False
        # The same solution, with sandboxes back, is verified and passes.
        again = await client.reset(HE0)
        await client.step(
            again.episode_id,
            {"tool": "write_file", "arguments": {"path": "solution.py", "content": HE0_SOLUTION}},
        )
        done = await client.step(again.episode_id, {"tool": "submit"})
        assert done.info["status"] == "done" and done.reward == 1.0
    finally:
        await manager.shutdown()


# -- broken packs ---------------------------------------------------------------------------


@pytest.fixture
def broken_packs(tmp_path: Path) -> Iterator[Path]:
    base = tmp_path / "more-packs"
    bad_toml = base / "bad-toml"
    bad_toml.mkdir(parents=True)
    (bad_toml / "pack.toml").write_text('name = "test/bad-toml\nversion = [\n')
    (bad_toml / "tasks.jsonl").write_text(json.dumps(echo_task("t1", "echo")) + "\n")
    bad_json = write_pack(base / "bad-json", "test/bad-json", "echo", [echo_task("t1", "echo")])
    with (bad_json / "tasks.jsonl").open("a") as f:
        f.write("{this is not json\n")
    write_pack(base / "bad-family", "test/bad-family", "nope", [echo_task("t1", "no-such-family")])
    write_pack(base / "good", "test/good", "echo", [echo_task("t1", "echo", answer="yes")])
    yield base


def repo_pack_names() -> set[str]:
    """Every built-in pack: the broken ones beside them must not hide any."""
    return {
        read_manifest(root).name for root in REPO_PACKS.iterdir() if (root / "pack.toml").exists()
    }


async def test_broken_packs_are_recorded_and_good_ones_served(
    tmp_path: Path, broken_packs: Path
) -> None:
    settings = make_settings(data_dir=tmp_path / "data", packs_dirs=[REPO_PACKS, broken_packs])
    manager = build_manager(settings)
    await manager.start()
    try:
        errors = manager.packs.errors
        assert set(errors) == {
            str(broken_packs / "bad-toml"),
            str(broken_packs / "bad-json"),
            str(broken_packs / "bad-family"),
        }
        assert "TOML" in errors[str(broken_packs / "bad-toml")]
        assert "not JSON" in errors[str(broken_packs / "bad-json")]
        assert "no-such-family" in errors[str(broken_packs / "bad-family")]
        names = {p.name for p in manager.catalog.pack_infos()}
        assert names == {*repo_pack_names(), "test/good"}
        client = AsyncInProcessClient(manager)
        reset = await client.reset("test/good:t1")
        reply = await client.step(
            reset.episode_id, {"tool": "submit", "arguments": {"answer": "yes"}}
        )
        assert reply.reward == 1.0
        await still_serving(manager)
    finally:
        await manager.shutdown()


def test_server_with_broken_packs_starts_and_reports(tmp_path: Path, broken_packs: Path) -> None:
    env = {"PALAESTRA_PACKS_DIRS": f"{REPO_PACKS}:{broken_packs}"}
    proc = ServerProcess(tmp_path / "server-data", extra_env=env).start()
    try:
        ready = httpx.get(f"{proc.url}/readyz", timeout=10)
        assert ready.status_code == 200
        problems = ready.json()["pack_errors"]["packs"]
        assert len(problems) == 3
        assert str(broken_packs / "bad-json") in problems
        packs = httpx.get(f"{proc.url}/v1/packs", timeout=10, headers=proc.headers).json()
        listed = packs if isinstance(packs, list) else packs.get("packs", packs)
        assert {p["name"] for p in listed} == {*repo_pack_names(), "test/good"}
        reset = httpx.post(
            f"{proc.url}/v1/episodes",
            json={"task": "test/good:t1"},
            timeout=10,
            headers=proc.headers,
        )
        assert reset.status_code == 200, reset.text
    finally:
        proc.stop()


# -- idle reaper and capacity ---------------------------------------------------------------


async def test_idle_episode_expires_and_frees_its_sandbox(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path / "data", idle_ttl_s=0.2, reaper_interval_s=0.05)
    manager = build_manager(settings)
    await manager.start()
    try:
        client = AsyncInProcessClient(manager)
        reset = await client.reset(HE0)
        eid = reset.episode_id
        sandbox = local_host(manager)._live[eid].ctx.sandboxes.episode
        assert sandbox is not None
        root: Path = sandbox.root  # type: ignore[attr-defined]
        assert root.exists()
        assert (
            local_host(manager).sandboxes.backend is not None
            and local_host(manager).sandboxes.backend.live_count == 1
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if (await client.state(eid)).status == "expired":
                break
            await asyncio.sleep(0.05)
        state = await client.state(eid)
        assert state.status == "expired"
        assert state.failure is not None and state.failure.kind == "expired"
        assert state.failure.infrastructure and state.void_reason is None  # not void, unscored
        # the status flips first, then the sandbox is closed (its folder removed off the loop)
        freed = time.monotonic() + 5
        while (
            local_host(manager).sandboxes.backend.live_count or root.exists()
        ) and time.monotonic() < freed:
            await asyncio.sleep(0.02)
        assert local_host(manager).sandboxes.backend.live_count == 0
        assert not root.exists()
        with pytest.raises(ConflictError):
            await client.step(eid, {"tool": "run_python", "arguments": {"code": "print(1)"}})
        saved = await stored(manager, eid)
        assert saved.status == "expired"
    finally:
        await manager.shutdown()


async def test_reset_at_capacity_is_refused_with_retry_after(tmp_path: Path) -> None:
    manager = build_manager(make_settings(data_dir=tmp_path / "data", max_episodes=1))
    await manager.start()
    try:
        client = AsyncInProcessClient(manager)
        first = await client.reset(ECHO)
        with pytest.raises(CapacityError) as info:
            await client.reset(ECHO)
        assert info.value.retry_after is not None and info.value.retry_after > 0
        assert info.value.retryable
        await client.close(first.episode_id)
        second = await client.reset(ECHO)
        reply = await client.step(
            second.episode_id, {"tool": "submit", "arguments": {"answer": "hcrib"}}
        )
        assert reply.reward == 1.0
    finally:
        await manager.shutdown()
