"""Attacks on what the session model proxy stores (issue 34, invariant 2: bounded bytes,
stored and held). The model inside a harness sandbox owns every byte the harness sends,
and every call became a record stored whole and served back by GET /v1/episodes/{id}:
max-size requests in a loop, requests the upstream refuses, malformed ones, made an
episode store hundreds of megabytes. Now an episode records at most `llm_max_recorded_mb`
(and one call), a token's live episodes `token_max_llm_recorded_mb`; past either the call
is refused in the harness's dialect and the episode ends truncated (a limit the policy
caused, never void); refused calls are records saying so, bounded with a marker.

The upstreams are FAKES on loopback: tests/harness_fakes.py's `FakeUpstream`,
`huge_refusals` here (a model server whose 4xx bodies are a megabyte each), and for the
whole episode over a real `palaestra serve`, tests/peers/fake_model.py's `FakeModel`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.base import ExecResult
from palaestra.sdk.harness import HarnessOptions, LlmCall
from palaestra.sdk.models import Action, Limits, StepResponse, step_record_json
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from palaestra.server.harness.records import REFUSED_KEEP
from palaestra.server.harness.registry import Bound, HarnessRegistry
from palaestra.server.harness.runner import Ending, HarnessRun, HarnessRunner, Plan
from tests.conftest import ServerProcess, make_settings
from tests.harness_fakes import FakeUpstream, options
from tests.harness_peers import SOLVE_2, TRAIN_TASK, ending, finished, harness, started
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.peers.fake_model_server import FakeModelServer, Hit, Reply
from tests.redteam.test_harness_proxy import sandbox_gateway
from tests.server.test_sealed import make_token
from tests.servers import server_fixture

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
REQUEST_KB = 64  # llm_max_request_kb in these tests: each call's request at most
CAP_MB = 1  # llm_max_recorded_mb in these tests
MIB = 1 << 20
ONE_CALL = REQUEST_KB * 1024 + 16 * 1024  # a request and the fake's small reply, ids, times
# A refused call's record: its request's and reply's heads, the error, times.
REFUSED_RECORD = 2 * REFUSED_KEEP + 4096


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def huge_refusals() -> Iterator[str]:
    """A FAKE model server that refuses every call (400) with a 1 MiB error body; its
    endpoint."""

    def answer(hit: Hit) -> Reply:
        return Reply(400, {"error": {"message": "no: " + "x" * MIB, "type": "BadRequest"}})

    with FakeModelServer(answer, suffix="") as server:
        yield server.base


def big(api: str, kb: int = REQUEST_KB) -> bytes:
    """A valid request in `api`'s dialect just under `kb` KiB: the most a call may send."""
    text = "a" * (kb * 1024 - 200)
    body: dict[str, Any] = {"model": "fake", "messages": [{"role": "user", "content": text}]}
    if api == MESSAGES:
        body["max_tokens"] = 8
    return json.dumps(body).encode()


def stored(calls: list[LlmCall]) -> int:
    """The bytes the calls' records take in the trajectory (as GET serves them back)."""
    return sum(len(call.model_dump_json()) for call in calls)


def refusal(api: str, reply: httpx.Response) -> tuple[str, str | None]:
    """(message, code) of an error answer, checked to be in `api`'s own error shape."""
    error = reply.json()["error"]
    if api == MESSAGES:
        assert reply.json()["type"] == "error" and set(error) == {"type", "message"}, error
        return error["message"], None
    assert set(error) == {"message", "type", "param", "code"}, error
    return error["message"], error["code"]


async def flood(url: str, path: str, body: bytes, times: int) -> list[httpx.Response]:
    """`times` calls of `body` through the sandbox's gateway, until the first refusal."""
    replies = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(times):
            reply = await http.post(path, content=body)
            replies.append(reply)
            if reply.status_code != 200:
                break
    return replies


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
async def test_max_size_calls_in_a_loop_store_at_most_the_cap(
    upstream: FakeUpstream, path: str
) -> None:
    """60 calls of 64 KiB each (~4 MiB) against a 1 MiB cap: the trajectory keeps at most the
    cap and one call; the call past it is refused (400 limit_reached, in the harness's own
    dialect) and the session stops as a limit, never a fault."""
    settings = {"llm_max_request_kb": REQUEST_KB, "llm_max_recorded_mb": CAP_MB}
    async with sandbox_gateway(f"{upstream.url}/ok", **settings) as (session, url, calls):
        session.max_calls = 1000
        replies = await flood(url, path, big(path), 60)
        assert [r.status_code for r in replies[:-1]] == [200] * (len(replies) - 1)
        last = replies[-1]
        assert last.status_code == 400, last.text
        message, code = refusal(path, last)
        assert "llm_max_recorded_mb" in message and code in ("limit_reached", None)
        assert stored(calls) <= CAP_MB * MIB + ONE_CALL, stored(calls)
        assert stored(calls) >= CAP_MB * MIB - ONE_CALL  # whole calls up to the cap
        assert all(c.error is None and c.completion_token_ids for c in calls)  # kept whole
        assert session.limit is not None and "llm_max_recorded_mb" in session.limit
        assert session.fault is None and session.stopped.is_set()
        assert session.calls == len(calls)  # the refused call reached no upstream
        again = await flood(url, path, big(path, 1), 1)  # stopped: refused, even small
        assert again[0].status_code == 400


async def test_requests_the_upstream_refuses_are_recorded_bounded(
    upstream: FakeUpstream, huge_refusals: str
) -> None:
    """An upstream's 4xx (a context too long: the agent's doing) was recorded with the whole
    request, and the whole refusal: 60 refused 64 KiB requests stored ~4 MiB, a refusal
    body of 1 MiB stored 1 MiB. Each is counted and recorded as refused, its request and
    reply kept to their heads with a marker saying how much is not kept."""
    settings = {"llm_max_request_kb": REQUEST_KB, "llm_max_recorded_mb": CAP_MB}
    async with sandbox_gateway(f"{upstream.url}/e400", **settings) as (session, url, calls):
        session.max_calls = 1000
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for _ in range(60):
                reply = await http.post(CHAT, content=big(CHAT))
                assert reply.status_code == 400 and "context" in reply.text
        assert session.calls == 60 and len(calls) == 60  # each counted, each visible
        for call in calls:
            assert call.error is not None and call.error.startswith("HTTP 400")
            assert call.completion_token_ids == []
            assert call.request["truncated"].startswith("[truncated: ")
            assert len(call.request["head"]) <= REFUSED_KEEP
            assert len(call.model_dump_json()) <= REFUSED_RECORD
        assert stored(calls) <= 60 * REFUSED_RECORD < CAP_MB * MIB
        assert session.fault is None

    async with sandbox_gateway(huge_refusals, **settings) as (session, url, calls):
        session.max_calls = 1000
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for _ in range(8):
                reply = await http.post(CHAT, content=big(CHAT, 1))
                assert reply.status_code == 400  # passed on to the harness, as it was
        assert len(calls) == 8 and all(c.error for c in calls)
        for call in calls:
            assert "truncated" in call.response and len(call.response["head"]) <= REFUSED_KEEP
        assert stored(calls) <= 8 * REFUSED_RECORD
        assert session.fault is None


async def test_malformed_requests_are_recorded_bounded(upstream: FakeUpstream) -> None:
    """A 64 KiB body with a bad last byte, over and over: each is refused (400), counted
    toward max_calls, and visible in the trajectory as refused, its head kept with a
    marker; never the whole body, never dropped unsaid."""
    bad = big(CHAT)[:-1]  # no closing brace
    async with sandbox_gateway(
        f"{upstream.url}/ok", llm_max_request_kb=REQUEST_KB, llm_max_recorded_mb=CAP_MB
    ) as (session, url, calls):
        session.max_calls = 10
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            replies = [await http.post(CHAT, content=bad) for _ in range(12)]
        codes = [reply.json()["error"]["code"] for reply in replies]
        assert codes[:10] == ["invalid_json"] * 10 and set(codes[10:]) == {"limit_reached"}
        assert len(calls) == 10 and session.malformed == 10  # read ones are all recorded
        for call in calls:
            assert call.error is not None and "invalid_json" in call.error
            assert call.request["head"] == bad[:REFUSED_KEEP].decode()
            over = len(bad) - REFUSED_KEEP
            assert call.request["truncated"] == (
                f"[truncated: {over} bytes over the {REFUSED_KEEP} a refused call keeps]"
            )
        assert stored(calls) <= 10 * REFUSED_RECORD
        assert session.limit is not None and session.fault is None


async def test_a_tokens_live_episodes_are_capped_and_the_quiet_token_is_not(
    upstream: FakeUpstream,
) -> None:
    """A hostile token spreads its flood over many episodes, each under its own cap: its
    live episodes together record at most token_max_llm_recorded_mb (and one call); the
    quiet token's episode on the same server goes on whole. A closed episode's bytes no
    longer count."""
    caps = {"llm_max_request_kb": REQUEST_KB, "llm_max_recorded_mb": 1}
    proxy = SessionProxy(make_settings(**caps, token_max_llm_recorded_mb=2))
    recorded: dict[str, list[LlmCall]] = {}

    def session(key: str, owner: str) -> LlmSession:
        recorded[key] = []
        return proxy.open(key, options(f"{upstream.url}/ok"), owner=owner, max_calls=1000,
                          max_tokens=10**6, on_call=recorded[key].append)  # fmt: skip

    try:
        hostile = [session(f"h{i}", "hostile") for i in range(4)]
        quiet = session("q", "quiet")
        body = big(CHAT)
        for one in hostile:
            for _ in range(40):
                reply = await one.handle("POST", CHAT, body)
                if reply.status != 200:
                    assert reply.status == 400 and b"limit_reached" in reply.body
                    break
        everything = [c for i in range(4) for c in recorded[f"h{i}"]]
        assert stored(everything) <= 2 * MIB + ONE_CALL, stored(everything)
        assert proxy.recorded("hostile") <= 2 * MIB + ONE_CALL
        assert hostile[2].limit is not None and "token_max_llm_recorded_mb" in hostile[2].limit
        assert hostile[3].calls == 0 and hostile[3].fault is None  # refused from its first
        for _ in range(5):
            reply = await quiet.handle("POST", CHAT, body)
            assert reply.status == 200, reply.body[:300]
        assert quiet.limit is None and len(recorded["q"]) == 5
        assert all(json.dumps(c.request).encode() == body for c in recorded["q"])  # whole
        for i in range(4):
            await proxy.close(f"h{i}")
        assert proxy.recorded("hostile") == 0
        fresh = session("h5", "hostile")
        assert (await fresh.handle("POST", CHAT, body)).status == 200
    finally:
        await proxy.aclose()


class FloodBox:
    """An episode sandbox whose harness is the attacker: it posts max-size requests to its
    model session until one is refused, then exits 2 as bash-agent does."""

    spec = SandboxSpec(workdir="/work")

    def __init__(self, proxy: SessionProxy, key: str) -> None:
        self.proxy, self.key = proxy, key
        self.answers: list[int] = []

    async def write_file(self, path: str, data: str | bytes) -> None:
        return None

    async def exec(self, argv: list[str], **_: Any) -> ExecResult:
        session = self.proxy.get(self.key)
        assert session is not None
        while True:
            reply = await session.handle("POST", CHAT, big(CHAT))
            self.answers.append(reply.status)
            if reply.status != 200:
                return ExecResult(exit_code=2, stdout="", stderr=reply.body.decode()[:200])
            await asyncio.sleep(0)


class Handle:
    """An episode as a host holds it: `records` are the step records it would store."""

    def __init__(self, box: FloodBox) -> None:
        self.records: list[str] = []
        self.endings: list[Ending] = []
        self.key, self.limits, self.started = "ep-1", Limits(), time.monotonic()
        self.sandbox = box
        self.active = True

    def record(self, action: Action, reply: StepResponse, duration_s: float) -> None:
        record = step_record_json(
            index=len(self.records), request_id=None, action=action,
            observation=reply.observation, reward=reply.reward, terminated=reply.terminated,
            truncated=reply.truncated, info=reply.info, duration_s=duration_s, at=time.time(),
        )  # fmt: skip
        self.records.append(record)

    async def finish(self, ending: Ending) -> None:
        self.active = False
        self.endings.append(ending)

    async def keep_start(self) -> None:
        """Nothing is checkpointed here: no start to keep."""


async def test_a_flooding_harness_ends_its_episode_truncated_with_bounded_records(
    upstream: FakeUpstream,
) -> None:
    """The whole run: the harness floods, the call past the cap is refused, the runner
    ends the episode truncated (verified: the policy's doing, never void), and the step
    records the host stores hold at most the cap and one call."""
    settings = make_settings(llm_max_request_kb=REQUEST_KB, llm_max_recorded_mb=CAP_MB)
    proxy = SessionProxy(settings)
    runner = HarnessRunner(settings, proxy)
    harness = HarnessRegistry().get("bash-agent")
    opts = HarnessOptions(name="bash-agent", model_endpoint=f"{upstream.url}/ok", model="fake")
    plan = Plan(harness, opts, harness.config({}), Bound(), max_calls=1000, max_tokens=10**6)
    run = HarnessRun(plan=plan, key="ep-1")
    box = FloodBox(proxy, "ep-1")
    handle = Handle(box)
    run.session = proxy.open(
        "ep-1", opts, owner="t", max_calls=1000, max_tokens=10**6,
        on_call=lambda call: HarnessRunner._record_call(run, call),
    )  # fmt: skip
    try:
        await asyncio.wait_for(runner.launch(run, handle, "do the task"), 60)
        [ending] = handle.endings
        assert ending.truncated and ending.void is None, ending
        assert "llm_max_recorded_mb" in ending.reason
        assert box.answers[-1] == 400 and set(box.answers[:-1]) == {200}
        assert sum(len(r) for r in handle.records) <= CAP_MB * MIB + ONE_CALL
        assert proxy.get("ep-1") is None and proxy.recorded("t") == 0
    finally:
        await runner.aclose()


# ---- the whole episode over a real server: what GET /v1/episodes/{id} serves back ---------
capped = server_fixture(
    "module",
    packs=["humaneval"],
    settings={"llm_max_recorded_mb": CAP_MB, "llm_max_request_kb": REQUEST_KB},
)
# The policy's own bash command: 60 calls of ~60 KiB each to the sandbox's gateway.
FLOOD = """python3 - <<'EOF'
import json, urllib.request as u
body = json.dumps({"messages": [{"role": "user", "content": "a" * 60000}]}).encode()
for i in range(60):
    try:
        u.urlopen(u.Request("http://127.0.0.1:4000/v1/chat/completions", body,
                            {"content-type": "application/json"}))
    except Exception as e:
        print(i, e)
        break
EOF"""


def test_a_flooding_policy_cannot_make_its_episode_store_past_the_cap(
    capped: ServerProcess,
) -> None:
    """The model floods its own model proxy from its bash tool; the episode ends truncated
    on llm_max_recorded_mb (scored, not void), and GET /v1/episodes/{id} serves at most
    the cap and one call. Another token's episode on the same server, alongside, is whole
    and solved."""
    hostile, quiet = (make_token(capped, "train", "harness") for _ in range(2))
    flood = FakeModel([bash_call(FLOOD)])  # forever
    solver = FakeModel([bash_call(SOLVE_2), submit_call()])
    with flood.serve() as flood_url, solver.serve() as solver_url:
        option = harness(flood_url, max_calls=500, config={"max_turns": 500})
        loud = started(capped, hostile, TRAIN_TASK, option, max_wall_s=120)
        calm = started(capped, quiet, TRAIN_TASK, harness(solver_url), max_wall_s=120)
        state = finished(capped, hostile, loud)
        other = finished(capped, quiet, calm)
    assert state["status"] == "done", state["void_reason"]
    last = ending(state)
    assert last["truncated"] and "llm_max_recorded_mb" in last["info"]["harness"]["reason"]
    served = len(json.dumps(state["trajectory"]).encode())
    assert served <= CAP_MB * MIB + 2 * ONE_CALL, served
    assert len(flood.requests) > 5  # it did flood: whole calls up to the cap
    assert other["status"] == "done" and other["verdict"]["reward"] == 1.0
    assert not ending(other)["truncated"]
