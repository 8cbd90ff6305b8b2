"""The harness runner reaches its episode only through an `EpisodeHandle`
(server/harness/runner.py): these drive it with a handle of the test's own, no host."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from palaestra.sandbox import SandboxError, SandboxSpec
from palaestra.sdk.harness import HarnessOptions, LlmCall
from palaestra.sdk.models import Action, Limits, StepResponse
from palaestra.server.config import Settings
from palaestra.server.harness.proxy import SessionProxy
from palaestra.server.harness.registry import Bound, HarnessRegistry
from palaestra.server.harness.runner import Ending, HarnessRun, HarnessRunner, Plan


class BrokenBox:
    """An episode sandbox whose every write fails, as when its backend died."""

    spec = SandboxSpec(workdir="/work")

    async def write_file(self, path: str, data: str | bytes) -> None:
        raise SandboxError("the sandbox is gone")


class Handle:
    def __init__(self) -> None:
        self.records: list[tuple[Action, StepResponse]] = []
        self.endings: list[Ending] = []
        self.key, self.limits, self.started = "ep-1", Limits(), time.monotonic()
        self.sandbox = BrokenBox()
        self.active = True

    def record(self, action: Action, reply: StepResponse, duration_s: float) -> None:
        self.records.append((action, reply))

    async def finish(self, ending: Ending) -> None:
        self.active = False
        self.endings.append(ending)

    async def keep_start(self) -> None:
        """Nothing is checkpointed here: no start to keep."""


def run_of(proxy: SessionProxy, runner: HarnessRunner) -> HarnessRun:
    harness = HarnessRegistry().get("bash-agent")
    options = HarnessOptions(
        name="bash-agent", model_endpoint="http://127.0.0.1:9/v1", model="policy"
    )
    plan = Plan(harness, options, harness.config({}), Bound(), max_calls=5, max_tokens=100)
    run = HarnessRun(plan=plan, key="ep-1")
    run.session = proxy.open(
        "ep-1", options, owner="t", max_calls=5, max_tokens=100,
        on_call=lambda call: HarnessRunner._record_call(run, call),
    )  # fmt: skip
    return run


async def test_a_harness_that_cannot_be_staged_voids_its_episode(tmp_path: Path) -> None:
    """Writing the harness's files is the server's work: when the sandbox fails there,
    the episode ends void (an infrastructure fault), never a 0, and the session closes."""
    settings = Settings(data_dir=tmp_path)
    proxy = SessionProxy(settings)
    runner = HarnessRunner(settings, proxy)
    handle = Handle()
    run = run_of(proxy, runner)
    try:
        await asyncio.wait_for(runner.launch(run, handle, "do the task"), 10)
        assert len(handle.endings) == 1
        ending = handle.endings[0]
        assert ending.void is not None and "staging" in ending.void
        assert run.snapshot().state == "failed" and not run.running
        assert proxy.get("ep-1") is None  # its model session is closed
    finally:
        await runner.aclose()


async def test_model_calls_are_recorded_through_the_handle(tmp_path: Path) -> None:
    """Each model call becomes a step record through `handle.record`; none once the
    episode is no longer active."""
    settings = Settings(data_dir=tmp_path)
    proxy = SessionProxy(settings)
    runner = HarnessRunner(settings, proxy)
    handle = Handle()
    run = run_of(proxy, runner)
    run.handle = handle
    call = LlmCall(
        index=0,
        api="openai-chat",
        request={},
        response={},
        prompt_token_ids=[1],
        completion_token_ids=[2, 3],
        logprobs=[-0.1, -0.2],
        finish_reason="stop",
        usage={"completion_tokens": 2},
        started_at=time.time(),
        upstream_s=0.01,
        proxy_s=0.01,
    )
    try:
        HarnessRunner._record_call(run, call)
        assert [a.tool for a, _ in handle.records] == ["llm_call"]
        assert "2 completion tokens" in handle.records[0][1].observation.text
        assert handle.records[0][1].info["llm_call"]["completion_token_ids"] == [2, 3]
        handle.active = False
        HarnessRunner._record_call(run, call)
        assert len(handle.records) == 1
    finally:
        await runner.aclose()
