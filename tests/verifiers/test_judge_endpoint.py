"""Judge endpoint operations (verifiers/judge_endpoint.py, server/judges.py): the shared cap,
cool-down, retry budget and deadline against a scripted fake judge on loopback
(tests/judge_endpoint_fakes.py), the verdict cache, the settings, the metrics of a real
server, an episode voided by a judge that is down, and a real model server as the judge."""

from __future__ import annotations

import asyncio
import email.utils
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import free_port, make_settings
from pydantic import ValidationError

from palaestra.envs.base import Assessment, EpisodeContext
from palaestra.envs.echo import EchoFamily
from palaestra.server.app import create_app
from palaestra.server.cluster.worker import settings_for_workers
from palaestra.server.config import REPO_PACKS, Settings, load_settings
from palaestra.server.judges import ServerJudges
from palaestra.server.metrics import Metrics
from palaestra.server.runtime import build_manager
from palaestra.verifiers.judge_endpoint import (
    EndpointConfig,
    JudgeEndpoint,
    MemoryJudgeCache,
    retry_after_s,
)
from palaestra.verifiers.judge_protocol import JudgeSampling, JudgeUnavailable
from tests.judge_endpoint_fakes import Reply, ScriptedJudge, completion
from tests.peers.tiny_models import make_models
from tests.sdk.train.test_openai_server import CACHE, model_server
from tests.server.test_faults import echo_task, write_pack

ASK = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Is it fine?"}]
SAMPLING = JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=64, seed=7)
SCHEMA = {"title": "rubric verdict", "type": "object", "properties": {"v": {"type": "string"}}}
KEY = "sk-judge-secret-0123456789"


def endpoint(url: str, **limits: Any) -> JudgeEndpoint:
    config = {"max_concurrency": 4, "deadline_s": 10.0, "backoff_s": 0.01, **limits}
    return JudgeEndpoint(EndpointConfig(name="j", url=url, model="judge-m", **config))


@pytest.fixture
async def fake() -> AsyncIterator[ScriptedJudge]:
    async with ScriptedJudge() as judge:
        yield judge


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there


# -- the gate ------------------------------------------------------------------------------


async def test_cap_is_never_exceeded(fake: ScriptedJudge) -> None:
    fake.latency_s = 0.03
    judge = endpoint(fake.url, max_concurrency=4)
    texts = await asyncio.gather(*(judge.complete(ASK, SAMPLING) for _ in range(40)))
    await judge.aclose()
    assert texts == ['{"verdict": "fine"}'] * 40
    assert fake.requests == 40
    assert fake.max_in_flight == 4  # the cap was reached, never passed
    assert judge.gate.max_in_flight == 4


async def test_a_429_cools_every_caller_down(fake: ScriptedJudge) -> None:
    """One 429 with Retry-After: no caller of the endpoint sends inside the window (the
    fake counts arrivals inside the window it announced), then all of them get answers."""
    fake.latency_s = 0.02
    fake.script.append(Reply(429, headers={"retry-after": "1"}))
    judge = endpoint(fake.url, max_concurrency=8)
    first = asyncio.create_task(judge.complete(ASK, SAMPLING))
    while fake.requests == 0:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)  # the 429 is back: the cool-down is on
    assert judge.gate.cooling() and judge.gate.limit == 4.0  # and the in-flight limit halved
    sent_429_at = fake.arrivals[0]
    rest = [asyncio.create_task(judge.complete(ASK, SAMPLING)) for _ in range(20)]
    texts = await asyncio.gather(first, *rest)
    await judge.aclose()
    assert len(texts) == 21 and fake.during_window == 0
    assert fake.statuses == {429: 1, 200: 21}
    assert min(fake.arrivals[1:]) - sent_429_at >= 1.0  # everyone waited Retry-After out
    assert judge.gate.limit == 8.0  # grown back to the cap by the answers


async def test_cancelled_callers_leave_no_slot_behind(fake: ScriptedJudge) -> None:
    """An episode closed while its verifier waits: the queue and the count stay right."""
    fake.latency_s = 0.1
    judge = endpoint(fake.url, max_concurrency=1)
    calls = [asyncio.create_task(judge.complete(ASK, SAMPLING)) for _ in range(6)]
    await asyncio.sleep(0.02)
    calls[0].cancel()  # in flight
    calls[2].cancel()  # queued
    calls[3].cancel()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [isinstance(r, asyncio.CancelledError) for r in results] == [
        True, False, True, True, False, False
    ]  # fmt: skip
    assert judge.gate.in_flight == 0 and not judge.gate._queue
    assert await judge.complete(ASK, SAMPLING) == '{"verdict": "fine"}'
    await judge.aclose()


def test_retry_after_forms() -> None:
    assert retry_after_s({"retry-after": "3"}) == 3.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "1"}) == 0.25
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    wait = retry_after_s({"retry-after": when})
    assert wait is not None and 28 <= wait <= 30
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


async def test_the_retry_budget_is_shared_and_runs_out(fake: ScriptedJudge) -> None:
    """No retry storm: the budget (floor 2, ratio 0) is the endpoint's, not the call's."""
    fake.script.extend(Reply(503) for _ in range(10))
    judge = endpoint(fake.url, retry_floor=2, retry_ratio=0.0, max_retries=10)
    with pytest.raises(JudgeUnavailable) as first:
        await judge.complete(ASK, SAMPLING)
    assert first.value.reason == "HTTP 503: retry budget spent" and fake.requests == 3
    with pytest.raises(JudgeUnavailable) as second:
        await judge.complete(ASK, SAMPLING)
    assert second.value.reason == "HTTP 503: retry budget spent" and fake.requests == 4
    await judge.aclose()


async def test_429s_waited_out_spend_no_budget_but_the_calls_retries(fake: ScriptedJudge) -> None:
    """A 429 with Retry-After is waited out by every caller (the shared cool-down): its
    retry sends nothing into the window, so it costs no budget (a rate-limited judge would
    otherwise void episodes for nothing); the call's own max_retries still bounds it."""
    fake.script.extend(Reply(429, headers={"retry-after-ms": "20"}) for _ in range(5))
    judge = endpoint(fake.url, retry_floor=0, retry_ratio=0.0, max_retries=10)
    assert await judge.complete(ASK, SAMPLING) == '{"verdict": "fine"}'
    assert fake.requests == 6 and fake.during_window == 0
    fake.script.extend(Reply(429, headers={"retry-after-ms": "20"}) for _ in range(5))
    capped = endpoint(fake.url, retry_floor=0, retry_ratio=0.0, max_retries=2)
    with pytest.raises(JudgeUnavailable, match="429 after 2 retries"):
        await capped.complete(ASK, SAMPLING)
    await judge.aclose()
    await capped.aclose()


async def test_per_call_retries_are_capped(fake: ScriptedJudge) -> None:
    fake.script.extend([Reply(502), Reply(500), Reply(503)])
    judge = endpoint(fake.url, max_retries=1)
    with pytest.raises(JudgeUnavailable) as failed:
        await judge.complete(ASK, SAMPLING)
    assert failed.value.reason == "HTTP 500 after 1 retries"
    assert failed.value.endpoint == "j"
    assert await judge.complete(ASK, SAMPLING) == '{"verdict": "fine"}'  # 503, then an answer
    await judge.aclose()


async def test_the_deadline_covers_the_whole_call(fake: ScriptedJudge) -> None:
    fake.latency_s = 3.0
    judge = endpoint(fake.url, deadline_s=0.3, timeout_s=5.0)
    started = time.monotonic()
    with pytest.raises(JudgeUnavailable) as failed:
        await judge.complete(ASK, SAMPLING)
    assert failed.value.reason == "deadline 0.3s passed"
    assert time.monotonic() - started < 1.0
    # A cool-down that ends past the deadline gives up at once, without waiting.
    fake.latency_s = 0.0
    fake.script.append(Reply(429, headers={"retry-after": "30"}))
    started = time.monotonic()
    with pytest.raises(JudgeUnavailable, match="429 cool-down outlasts the deadline"):
        await judge.complete(ASK, SAMPLING)
    assert time.monotonic() - started < 0.5
    await judge.aclose()


async def test_a_refused_connection_is_retried_then_gives_up() -> None:
    judge = endpoint(dead_url(), max_retries=2)
    with pytest.raises(JudgeUnavailable) as failed:
        await judge.complete(ASK, SAMPLING)
    assert failed.value.reason == "connection refused after 2 retries"
    await judge.aclose()


async def test_other_4xx_is_misconfiguration_and_never_shows_the_key(fake: ScriptedJudge) -> None:
    fake.script.append(Reply(401, {"error": {"message": f"bad key {KEY}"}}))
    judge = JudgeEndpoint(EndpointConfig(name="j", url=fake.url, model="m", api_key=KEY))
    with pytest.raises(JudgeUnavailable) as failed:
        await judge.complete(ASK, SAMPLING)
    await judge.aclose()
    assert failed.value.reason == "HTTP 401: bad key ***" and fake.requests == 1
    assert fake.authorization == [f"Bearer {KEY}"]
    assert KEY not in repr(judge.config) and KEY not in str(failed.value)


async def test_response_format_refused_once_is_remembered(fake: ScriptedJudge) -> None:
    fake.refuse_schema = True
    judge = endpoint(fake.url)
    assert await judge.complete(ASK, SAMPLING, schema=SCHEMA) == '{"verdict": "fine"}'
    assert fake.statuses == {400: 1, 200: 1}
    sent = fake.bodies[0]
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "rubric_verdict", "schema": SCHEMA, "strict": True},
    }
    assert {k: sent[k] for k in ("model", "temperature", "top_p", "max_tokens", "seed")} == {
        "model": "judge-m",
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 64,
        "seed": 7,
    }
    assert sent["messages"] == ASK and "response_format" not in fake.bodies[1]
    await judge.complete(ASK, SAMPLING, schema=SCHEMA)  # remembered: sent without at once
    assert fake.requests == 3 and "response_format" not in fake.bodies[2]
    await judge.aclose()


async def test_a_reply_without_text_is_retried(fake: ScriptedJudge) -> None:
    fake.script.extend([Reply(200, {"choices": []}), Reply(200, completion("second"))])
    judge = endpoint(fake.url)
    assert await judge.complete(ASK, SAMPLING) == "second"
    await judge.aclose()


# -- cache and settings ---------------------------------------------------------------------


def test_memory_cache_is_lru_and_bounded() -> None:
    cache = MemoryJudgeCache(max_entries=2)
    cache.put("a", {"score": 1.0})
    cache.put("b", {"score": 0.5})
    got = cache.get("a")  # a is now the most recent
    assert got == {"score": 1.0}
    dict(got)["score"] = 0.0  # a copy: the cache is not edited through it
    cache.put("c", {"score": 0.0, "nested": {"x": [1]}})
    assert cache.get("b") is None and cache.get("a") == {"score": 1.0} and len(cache) == 2
    value = cache.get("c")
    assert value is not None
    value["nested"]["x"].append(2)
    assert cache.get("c") == {"score": 0.0, "nested": {"x": [1]}}
    with pytest.raises(ValueError):
        MemoryJudgeCache(0)


def judge(limits: dict[str, Any]) -> Settings:
    return Settings.model_validate(
        {"judges": {"x": {"url": "http://h/v1", "model": "m", **limits}}}
    )


def test_judge_settings_from_toml_and_env_with_clear_errors(tmp_path: Path) -> None:
    config = tmp_path / "palaestra.toml"
    config.write_text(
        '[judges.grader]\nurl = "http://127.0.0.1:9/v1"\nmodel = "qwen"\n'
        f'api_key = "{KEY}"\nmax_concurrency = 8\n'
    )
    settings = load_settings(environ={}, config_file=config)
    grader = settings.judges["grader"]
    assert grader.max_concurrency == 8 and grader.deadline_s == 120.0
    assert KEY not in settings.model_dump_json()  # `palaestra config` never prints it
    assert KEY in settings.model_dump_json(context={"secrets": True})  # a front's workers
    env = {"PALAESTRA_JUDGES": json.dumps({"x": {"url": "https://j.example/v1", "model": "m"}})}
    assert set(load_settings(environ=env, config_file=config).judges) == {"x"}
    with pytest.raises(ValueError, match="PALAESTRA_JUDGES is not JSON"):
        load_settings(environ={"PALAESTRA_JUDGES": "x=1"}, config_file=config)
    with pytest.raises(ValidationError) as bad:
        Settings.model_validate({"judges": {"x": {"url": "localhost:8000", "model": "m"}}})
    assert "judges.x.url" in str(bad.value) and "http(s)://HOST[:PORT]/v1" in str(bad.value)
    with pytest.raises(ValidationError, match="timeout_s"):
        judge({"timeout_s": 9, "deadline_s": 1})
    with pytest.raises(ValidationError, match="judge name"):
        Settings.model_validate({"judges": {"a b": {"url": "http://h/v1", "model": "m"}}})
    with pytest.raises(ValidationError, match="max_concurrency"):
        judge({"max_concurrency": 0})


def test_the_operations_page_example_is_valid(tmp_path: Path) -> None:
    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    block = page.split("# palaestra.toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "palaestra.toml").write_text(block)
    grader = load_settings(environ={}, config_file=tmp_path / "palaestra.toml").judges["grader"]
    assert grader.max_concurrency == 16 and grader.api_key is not None


def test_a_cluster_front_hands_its_workers_the_judge_keys(tmp_path: Path) -> None:
    settings = make_settings(
        data_dir=tmp_path, judges={"x": {"url": "http://h/v1", "model": "m", "api_key": KEY}}
    )
    worker = Settings.model_validate_json(settings_for_workers(settings))
    key = worker.judges["x"].api_key
    assert key is not None and key.get_secret_value() == KEY


async def test_server_judges_get_and_metrics(fake: ScriptedJudge) -> None:
    metrics = Metrics()
    settings = Settings.model_validate({"judges": {"x": {"url": fake.url, "model": "m"}}})
    judges = ServerJudges.from_settings(settings, metrics.judges)
    assert await judges.get("x").complete(ASK, SAMPLING) == '{"verdict": "fine"}'
    with pytest.raises(JudgeUnavailable, match="no judge endpoint of that name"):
        judges.get("nope")
    assert judges.cache is not None
    await judges.aclose()
    text = metrics.render().decode()
    assert 'palaestra_judge_calls_total{endpoint="x",outcome="ok"} 1.0' in text
    assert 'palaestra_judge_latency_seconds_count{endpoint="x"} 1.0' in text


# -- a real server: a judged family, the judge down, /metrics ----------------------------------


class JudgedEcho(EchoFamily):
    """Echo whose verifier asks judge `x` (down) or `y` (the fake) whether the answer is
    right: the judge's reply "1" is a pass."""

    name = "test-judged-echo"
    description = "echo judged by a judge endpoint"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        judge = ctx.judges.get("x" if ctx.task.id == "down" else "y")
        ask = [{"role": "user", "content": f"answer: {ctx.state.answer}"}]
        text = await judge.complete(ask, JudgeSampling(max_tokens=4))
        good = text.strip() == "1"
        return Assessment(reward=float(good), passed=good, components={"judge": float(good)})


async def test_a_judge_that_is_down_voids_the_episode_on_a_real_server(
    fake: ScriptedJudge, tmp_path: Path
) -> None:
    fake.answer = lambda body: "1" if "birch" in body["messages"][0]["content"] else "0"
    packs = tmp_path / "packs"
    tasks = [echo_task("down", JudgedEcho.name), echo_task("up", JudgedEcho.name)]
    write_pack(packs / "judged", "test/judged", JudgedEcho.name, tasks)
    judges = {
        "x": {"url": dead_url(), "model": "m", "max_retries": 1, "timeout_s": 5, "deadline_s": 5},
        "y": {"url": fake.url, "model": "m", "api_key": KEY},
    }
    settings = make_settings(
        data_dir=tmp_path / "data", packs_dirs=[REPO_PACKS], auth="off", judges=judges
    )
    manager = build_manager(settings)
    manager.families.add(JudgedEcho())
    manager.packs.load_dirs([packs], [f.name for f in manager.families.all()])
    assert isinstance(manager.judges, ServerJudges) and manager.judges.names == ["x", "y"]
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, manager), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:

            async def play(task: str, answer: str) -> dict[str, Any]:
                reset = await http.post("/v1/episodes", json={"task": f"test/judged:{task}"})
                assert reset.status_code == 200, reset.text
                step = await http.post(
                    f"/v1/episodes/{reset.json()['episode_id']}/step",
                    json={"action": {"tool": "submit", "arguments": {"answer": answer}}},
                )
                assert step.status_code == 200, step.text
                return dict(step.json())

            down = await play("down", "birch")
            assert down["info"]["status"] == "void"
            verdict = down["info"]["verdict"]
            assert verdict["status"] == "void"
            assert "judge unavailable (x: connection refused after 1 retries)" in json.dumps(down)
            up = await play("up", "birch")
            assert up["reward"] == 1.0 and up["info"]["verdict"]["status"] == "ok"
            wrong = await play("up", "oak")
            assert wrong["reward"] == 0.0 and wrong["info"]["verdict"]["status"] == "ok"
            text = (await http.get("/metrics")).text
        assert fake.authorization == [f"Bearer {KEY}"] * 2
        assert 'palaestra_judge_failures_total{endpoint="x",reason="connection"} 1.0' in text
        assert 'palaestra_judge_calls_total{endpoint="x",outcome="connection"} 2.0' in text
        assert 'palaestra_judge_retries_total{endpoint="x"} 1.0' in text
        assert 'palaestra_judge_calls_total{endpoint="y",outcome="ok"} 2.0' in text
        assert 'palaestra_judge_latency_seconds_count{endpoint="y"} 2.0' in text
        assert 'palaestra_judge_in_flight{endpoint="y"} 0.0' in text
        assert KEY not in text
    finally:
        server.should_exit = True
        await serving


# -- a real OpenAI-compatible model server as the judge ----------------------------------------


@pytest.mark.slow
def test_a_real_model_server_answers_the_endpoint(tmp_path: Path) -> None:
    """Plumbing: palaestra.sdk.train.openai_server (a tiny HF model) is a judge endpoint."""
    model = make_models(CACHE / "tiny-models")["random"]
    port = free_port()
    args = [sys.executable, "-m", "palaestra.sdk.train.openai_server", "--model", model,
            "--served-model-name", "tiny", "--port", str(port), "--api-key", KEY]  # fmt: skip

    async def ask(url: str) -> str:
        config = EndpointConfig(name="tiny", url=f"{url}/v1", model="tiny", api_key=KEY)
        judge = JudgeEndpoint(config)
        try:
            return await judge.complete(ASK, JudgeSampling(max_tokens=8), schema=SCHEMA)
        finally:
            await judge.aclose()

    with model_server(args, port, tmp_path / "server.log") as url:
        text = asyncio.run(ask(url))
    assert isinstance(text, str) and text
