"""Quotas per token (DESIGN §5b): live episodes, episode starts per hour, sandbox CPU-seconds
per hour and pending batch work. Going over answers 429 with Retry-After to that token only;
every other token is served meanwhile.

Before: no token had a quota; one tenant could hold every live slot of the server, start
episodes without end, and pile up detached batch steps without bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from palaestra.envs.base import EpisodeContext, StepOutcome, Tool, ToolArgs
from palaestra.envs.echo import EchoArgs, EchoFamily
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests.redteam.tenants import Tenant, tenant

Factory = Callable[..., Tenant]


def over_quota(response: Any, what: str) -> float:
    """Assert a quota 429 naming `what`; returns its Retry-After."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded" and error["retryable"] is True
    assert what in error["message"], error["message"]
    retry_after = float(response.headers["retry-after"])
    assert retry_after >= 1
    return retry_after


@pytest.fixture
async def tenants(manager: EpisodeManager) -> AsyncIterator[Factory]:
    made: list[Tenant] = []

    def make(scopes: list[str], **quota: Any) -> Tenant:
        made.append(tenant(manager, scopes, **quota))
        return made[-1]

    yield make
    for t in made:
        await t.http.aclose()


async def test_live_quota_is_the_flooders_alone(tenants: Factory) -> None:
    flooder, quiet = tenants(["train"], max_live=2), tenants(["train"])
    first = await flooder.start()
    await flooder.start()
    over_quota(await flooder.reset(), "live episodes")
    # A batch of starts cannot slip past it either (starts being made count).
    batch = await flooder.http.post(
        "/v1/batch/reset", json={"items": [{"task": "palaestra/echo:say-birch"}] * 4}
    )
    assert [i["error"]["status"] for i in batch.json()["items"]] == [429] * 4
    assert (await quiet.reset()).status_code == 200  # the other token is served
    assert (await flooder.http.delete(f"/v1/episodes/{first}")).status_code == 204
    assert (await flooder.reset()).status_code == 200  # a slot came back


async def test_episodes_per_hour(tenants: Factory) -> None:
    flooder, quiet = tenants(["train"], max_episodes_per_hour=3), tenants(["eval"])
    for _ in range(3):
        episode = await flooder.start()
        await flooder.http.delete(f"/v1/episodes/{episode}")
    retry_after = over_quota(await flooder.reset(), "episode starts per hour")
    assert 3000 < retry_after <= 3600  # the oldest start leaves the window in about an hour
    assert (await quiet.reset()).status_code == 200


async def test_cpu_seconds_per_hour(tenants: Factory, manager: EpisodeManager) -> None:
    flooder = tenants(["train"], max_cpu_s_per_hour=1e-6)
    quiet = tenants(["train"])
    episode = await flooder.start()
    assert (await flooder.step(episode)).status_code == 200  # this step spends the budget
    assert manager.tenancy.cpu_used(flooder.token_id) > 1e-6
    over_quota(await flooder.step(episode), "CPU-seconds")
    over_quota(await flooder.reset(), "CPU-seconds")
    state = (await flooder.http.get(f"/v1/episodes/{episode}")).json()
    assert state["status"] == "active" and state["step_count"] == 1  # refused, not ended
    other = await quiet.start()
    assert (await quiet.step(other)).status_code == 200


async def test_server_wide_defaults_bind_tokens_without_their_own(tmp_path: Path) -> None:
    manager = build_manager(make_settings(data_dir=tmp_path / "data", token_max_live=1))
    await manager.start()
    try:
        plain = tenant(manager, ["train"])
        own = tenant(manager, ["train"], max_live=3)
        admin = tenant(manager, ["admin"])
        await plain.start()
        over_quota(await plain.reset(), "live episodes")
        for _ in range(3):
            await own.start()
        for _ in range(3):
            await admin.start()  # admin tokens: only a quota set on them binds them
        for t in (plain, own, admin):
            await t.http.aclose()
    finally:
        await manager.shutdown()


class SlowEcho(EchoFamily):
    """Echo whose `echo` of "slow" takes a while, so a batch step is detached."""

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if isinstance(args, EchoArgs) and args.text == "slow":
            await asyncio.sleep(1.0)
        return await super().step(ctx, tool, args)


async def test_pending_batch_work_is_bounded_per_token(tmp_path: Path) -> None:
    manager = build_manager(make_settings(data_dir=tmp_path / "data", token_max_pending=2))
    manager.families.add(SlowEcho())
    await manager.start()
    try:
        flooder, quiet = tenant(manager, ["train"]), tenant(manager, ["train"])
        ids = [await flooder.start(options={"max_steps": 100}) for _ in range(4)]
        slow = {"tool": "echo", "arguments": {"text": "slow"}}
        items = [{"episode_id": e, "action": slow, "request_id": "s"} for e in ids[:2]]
        fast = {"episode_id": ids[2], "action": {"tool": "echo", "arguments": {"text": "f"}}}
        first = await flooder.http.post(
            "/v1/batch/step", json={"items": [*items, fast], "wait_s": 0.05}
        )
        codes = [i["error"]["code"] for i in first.json()["items"] if i["error"]]
        assert codes == ["still_running", "still_running"], first.text
        more = {"episode_id": ids[3], "action": slow, "request_id": "t"}
        refused = await flooder.http.post("/v1/batch/step", json={"items": [more]})
        error = refused.json()["items"][0]["error"]
        assert (error["status"], error["code"]) == (429, "quota_exceeded")
        assert error["retry_after"] >= 1 and "pending batch steps" in error["message"]
        # Another token's batch goes on meanwhile.
        other = await quiet.start()
        quick = {"episode_id": other, "action": {"tool": "echo", "arguments": {"text": "x"}}}
        served = await quiet.http.post("/v1/batch/step", json={"items": [quick]})
        assert served.json()["items"][0]["result"]["observation"]["text"] == "x"
        # Once the detached steps end, the token is served again and collects their replies.
        await asyncio.sleep(1.3)
        again = await flooder.http.post("/v1/batch/step", json={"items": items})
        texts = [i["result"]["observation"]["text"] for i in again.json()["items"]]
        assert texts == ["slow", "slow"]
        for t in (flooder, quiet):
            await t.http.aclose()
    finally:
        await manager.shutdown()


async def test_pending_batch_bytes_are_bounded_per_token(tmp_path: Path) -> None:
    """Detached batch work holds its request while it runs: a token's pending bytes are
    capped (token_max_pending_bytes), whatever the count of its detached steps."""
    settings = make_settings(
        data_dir=tmp_path / "data", token_max_pending=100, token_max_pending_bytes=200
    )
    manager = build_manager(settings)
    manager.families.add(SlowEcho())
    await manager.start()
    try:
        flooder, quiet = tenant(manager, ["train"]), tenant(manager, ["train"])
        ids = [await flooder.start(options={"max_steps": 100}) for _ in range(4)]
        slow = {"tool": "echo", "arguments": {"text": "slow"}}
        items = [{"episode_id": e, "action": slow, "request_id": "s"} for e in ids[:2]]
        fast = {"episode_id": ids[2], "action": {"tool": "echo", "arguments": {"text": "f"}}}
        first = await flooder.http.post(
            "/v1/batch/step", json={"items": [*items, fast], "wait_s": 0.05}
        )
        codes = [i["error"]["code"] for i in first.json()["items"] if i["error"]]
        assert codes == ["still_running", "still_running"], first.text
        assert manager.tenancy._accounts[flooder.token_id].pending_bytes > 200
        more = {"episode_id": ids[3], "action": slow, "request_id": "t"}
        refused = await flooder.http.post("/v1/batch/step", json={"items": [more]})
        error = refused.json()["items"][0]["error"]
        assert (error["status"], error["code"]) == (429, "quota_exceeded"), refused.text
        assert "bytes of pending batch work" in error["message"]
        other = await quiet.start()
        quick = {"episode_id": other, "action": {"tool": "echo", "arguments": {"text": "x"}}}
        served = await quiet.http.post("/v1/batch/step", json={"items": [quick]})
        assert served.json()["items"][0]["result"]["observation"]["text"] == "x"
        await asyncio.sleep(1.3)  # the detached steps end: what they held is released
        assert manager.tenancy._accounts[flooder.token_id].pending_bytes == 0
        again = await flooder.http.post("/v1/batch/step", json={"items": [more]})
        assert again.json()["items"][0]["result"]["observation"]["text"] == "slow"
        for t in (flooder, quiet):
            await t.http.aclose()
    finally:
        await manager.shutdown()


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4:\n    pass\n"


async def test_sandbox_cpu_is_billed_to_the_token(
    tenants: Factory, manager: EpisodeManager
) -> None:
    """A coding episode on bwrap burns 0.4 s of CPU: the token is charged at least that much
    (its cgroup's counter, or the step's wall time where the host has no CPU accounting),
    and its next step is refused once that is over its quota."""
    burner = tenants(["train"], max_cpu_s_per_hour=0.3)
    episode = await burner.start(task="openai/humaneval:HumanEval-1")
    run = {"action": {"tool": "run_python", "arguments": {"code": BURN}}}
    reply = await burner.http.post(f"/v1/episodes/{episode}/step", json=run)
    assert reply.status_code == 200, reply.text
    assert manager.tenancy.cpu_used(burner.token_id) >= 0.35
    over_quota(await burner.http.post(f"/v1/episodes/{episode}/step", json=run), "CPU-seconds")
    await burner.http.delete(f"/v1/episodes/{episode}")
