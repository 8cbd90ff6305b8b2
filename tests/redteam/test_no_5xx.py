"""Invariant 6 of issue 34, "no 5xx, nothing silently dropped" (DESIGN §3: a 5xx is a bug).

An attacker's inputs, each answered 4xx in its own door's shape on the real app:
- malformed bodies to the harness model proxy (`/v1/episodes/{id}/llm/…`), Anthropic
  Messages and OpenAI chat alike: a wrong type anywhere, an unknown block, a non-object
  body. Each is the caller's own 400, never a 500, never the session's fault (a void
  episode), never sent on to the upstream, and nothing of it dropped unsaid;
- a model or judge endpoint with whitespace around it: stripped, or refused with a 422;
- control characters (NUL above all) in ids, on SQLite and PostgreSQL alike: PostgreSQL's
  text cannot hold a NUL, so an id that answered 200 on SQLite answered 500 there, and a
  step whose request_id held one was dropped by the store writer after it had happened.
  Text the store can hold as JSON (a sandbox's NUL in an observation) is stored alike.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from pydantic import ValidationError

from palaestra.sdk.harness import LlmCall
from palaestra.sdk.models import Action, EpisodeState, EpisodeStatus, Observation, step_record_json
from palaestra.server.db import Database
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.server.settings.families import JudgeEndpointSettings
from palaestra.server.store import Store, StoreWriteError
from tests.conftest import make_settings
from tests.harness_fakes import FakeUpstream, fake_reply, options
from tests.peers.fake_model_server import FakeModelServer, Hit
from tests.peers.fake_model_server import Reply as FakeReply
from tests.redteam.conftest import app_client
from tests.redteam.tenants import ECHO, Tenant, tenant

USER = [{"role": "user", "content": "hi"}]
LLM = "/v1/episodes/mine/llm"
HUMANEVAL = "openai/humaneval:HumanEval-2"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@asynccontextmanager
async def owned_session(
    manager: EpisodeManager, upstream: FakeUpstream
) -> AsyncIterator[tuple[Tenant, LlmSession, list[LlmCall]]]:
    """A tenant and a model session of its episode "mine" on the manager's own proxy."""
    proxy = manager.services.sessions
    assert isinstance(proxy, SessionProxy)
    owner = tenant(manager, ["train"])
    calls: list[LlmCall] = []
    key = f"{owner.token_id}:mine"
    session = proxy.open(key, options(f"{upstream.url}/ok"), owner=owner.token_id,
                         max_calls=1000, max_tokens=10**6, on_call=calls.append)  # fmt: skip
    try:
        yield owner, session, calls
    finally:
        await proxy.close(key)
        await owner.http.aclose()


def messages(**fields: Any) -> dict[str, Any]:
    """A valid Anthropic Messages body, with `fields` over it."""
    return {"model": "fake", "max_tokens": 8, "messages": USER, **fields}


def turn(role: str, content: Any) -> dict[str, Any]:
    return messages(messages=[{"role": role, "content": content}])


BAD_MESSAGES: list[Any] = [
    [], 1, "text", None,  # not an object
    messages(messages=None), messages(messages={"role": "user"}), messages(messages=[1]),
    messages(messages=[{"role": 1, "content": "x"}]), messages(messages=[]),
    turn("user", 1), turn("user", {"type": "text"}), turn("assistant", 2.5),
    turn("user", [1]), turn("user", [{"type": "image", "source": {}}]),
    turn("user", [{"type": ["text"]}]), turn("user", [{"type": {"t": 1}}]),
    turn("user", [{"type": "text", "text": 5}]), turn("user", [{"type": "text", "text": None}]),
    turn("user", [{"type": "tool_result", "tool_use_id": 7, "content": "x"}]),
    turn("user", [{"type": "tool_result", "tool_use_id": "t", "content": 3}]),
    turn("user", [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]),
    turn("assistant", [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]),
    turn("assistant", [{"type": "tool_use", "id": 1, "name": "f", "input": {}}]),
    turn("assistant", [{"type": "tool_use", "id": "t", "name": None, "input": {}}]),
    turn("assistant", [{"type": "server_tool_use"}]),
    messages(system=1), messages(system={"type": "text"}), messages(system=[{"type": "image"}]),
    messages(system=[{"type": "text", "text": 1}]),
    messages(tools=1), messages(tools="bash"), messages(tools={"name": "f"}), messages(tools=[1]),
    messages(tools=[{"name": 1}]), messages(tools=[{"description": "no name"}]),
    messages(tools=[{"name": "f", "input_schema": "object"}]),
    messages(tools=[{"name": "f", "description": ["x"]}]),
    messages(max_tokens="8"), messages(max_tokens=True), messages(max_tokens=0),
    messages(max_tokens=None), messages(max_tokens=1.5),
    messages(stop_sequences=1), messages(stop_sequences="END"), messages(stop_sequences=[1]),
    messages(tool_choice="auto"), messages(tool_choice={"type": "tool"}),
    messages(tool_choice={"type": ["any"]}),
    messages(temperature="hot"), messages(temperature=[1]), messages(top_p={"p": 1}),
]  # fmt: skip


def chat(**fields: Any) -> dict[str, Any]:
    """A valid OpenAI chat-completions body, with `fields` over it."""
    return {"model": "fake", "messages": USER, **fields}


BAD_CHATS: list[Any] = [
    [], 1, "text", None,
    chat(messages=None), chat(messages=1), chat(messages="hi"), chat(messages={"role": "user"}),
    chat(messages=[1]), chat(messages=[{"content": "no role"}]),
    chat(messages=[{"role": ["user"], "content": "x"}]),
    chat(messages=[{"role": "user", "content": 1}]),
    chat(messages=[{"role": "user", "content": {"type": "text"}}]),
    chat(messages=[{"role": "user", "content": [1]}]),
    chat(messages=[{"role": "user", "content": [{"type": ["text"]}]}]),
    chat(messages=[{"role": "user", "content": [{"type": {"a": 1}}]}]),
    chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
    chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
    chat(messages=[{"role": "assistant", "content": None, "tool_calls": 1}]),
    chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                                                      "arguments": {}}}]}]),
    chat(messages=[{"role": "tool", "tool_call_id": 1, "content": "x"}]),
    chat(tools=1), chat(tools="f"), chat(tools=[1]), chat(tool_choice=1),
    chat(max_tokens="8"), chat(max_tokens=True), chat(max_tokens=0), chat(max_tokens=1.5),
    chat(max_completion_tokens="8"), chat(n="1"), chat(n=2), chat(parallel_tool_calls="yes"),
    chat(stop=1), chat(stop=[1]), chat(temperature="hot"), chat(seed=1.5), chat(top_p=[1]),
]  # fmt: skip


async def test_malformed_messages_bodies_are_anthropic_400s(
    manager: EpisodeManager, upstream: FakeUpstream
) -> None:
    """`tools: 1` or `stop_sequences: 1` answered 500 (a TypeError in the translation);
    `tools: [1]` lost the tool unsaid and `stop_sequences: "END"` became three stops."""
    async with owned_session(manager, upstream) as (owner, session, calls):
        before = len(upstream.hits)
        for body in BAD_MESSAGES:
            reply = await owner.http.post(f"{LLM}/v1/messages", content=json.dumps(body))
            assert reply.status_code == 400, (body, reply.text)
            error = reply.json()
            assert error["type"] == "error", (body, error)
            assert error["error"]["type"] == "invalid_request_error", (body, error)
            assert error["error"]["message"], body
        assert len(upstream.hits) == before and not any(c.completion_token_ids for c in calls)
        assert session.fault is None and session.limit is None  # never void, never stopped
        ok = await owner.http.post(f"{LLM}/v1/messages", json=messages())
        assert ok.status_code == 200 and ok.json()["type"] == "message", ok.text


async def test_malformed_chat_bodies_are_openai_400s(
    manager: EpisodeManager, upstream: FakeUpstream
) -> None:
    """`messages: null` went on to the upstream, whose 500 voided the episode; a part whose
    type is a list answered 500 (unhashable); `max_tokens: "8"` was dropped unsaid."""
    async with owned_session(manager, upstream) as (owner, session, calls):
        before = len(upstream.hits)
        for body in BAD_CHATS:
            reply = await owner.http.post(f"{LLM}/v1/chat/completions", content=json.dumps(body))
            assert reply.status_code == 400, (body, reply.text)
            error = reply.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"], (body, error)
            assert set(error) == {"message", "type", "param", "code"}, (body, error)
        assert len(upstream.hits) == before and not any(c.completion_token_ids for c in calls)
        assert session.fault is None and session.limit is None
        ok = await owner.http.post(f"{LLM}/v1/chat/completions", json=chat(max_tokens=2))
        assert ok.status_code == 200, ok.text
        assert upstream.hits[-1].body["max_tokens"] == 2


def ignore(call: LlmCall) -> None:
    """A session's recorder that keeps nothing."""


def odd_completions() -> list[dict[str, Any]]:
    """Chat completions (token ids and all) with one field in a type OpenAI never gives it."""

    def odd(where: str, value: Any) -> dict[str, Any]:
        reply = fake_reply({"messages": USER, "max_tokens": 3, "model": "fake"})
        node: Any = reply
        *path, last = where.split(".")
        for key in path:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
        return reply

    return [
        odd("choices.0.message", "text"), odd("choices.0.message", None),
        odd("choices.0.message.content", ["a"]), odd("choices.0.message.tool_calls", 1),
        odd("choices.0.message.tool_calls", [{"function": "f"}]),
        odd("choices.0.message.tool_calls", [{"id": "c", "function": {"arguments": {}}}]),
        odd("choices.0.logprobs", [1]), odd("choices.0.finish_reason", ["stop"]),
        odd("usage", [1]), odd("usage.prompt_tokens", 1.5), odd("usage.completion_tokens", "3"),
    ]  # fmt: skip


async def test_odd_upstream_completions_are_faults_not_500s(manager: EpisodeManager) -> None:
    """A model server's 200 whose fields are of the wrong JSON type (a message that is a
    string, logprobs a list, usage a list) answered 500 from inside the proxy's reading of
    it: it is the upstream's fault, the session's 502 in the harness's dialect (void)."""
    odd = odd_completions()

    def answer(hit: Hit) -> FakeReply:
        return FakeReply(200, odd[int(hit.body["messages"][-1]["content"])])

    proxy = manager.services.sessions
    assert isinstance(proxy, SessionProxy)
    owner = tenant(manager, ["train"])
    try:
        with FakeModelServer(answer, suffix="") as upstream:
            for k in range(len(odd)):
                for api, path in (("chat", "v1/chat/completions"), ("msg", "v1/messages"),
                                  ("resp", "v1/responses")):  # fmt: skip
                    key = f"{owner.token_id}:{api}{k}"
                    session = proxy.open(key, options(upstream.base), owner=owner.token_id,
                                         max_calls=9, max_tokens=99, on_call=ignore)  # fmt: skip
                    body = messages(messages=[{"role": "user", "content": str(k)}])
                    if api == "resp":  # Open Responses: the same turn as its input
                        body = {"model": "fake", "input": str(k)}
                    reply = await owner.http.post(f"/v1/episodes/{api}{k}/llm/{path}", json=body)
                    assert reply.status_code == 502, (k, api, reply.text)
                    error = reply.json()
                    shaped = error["error"]["type"] if api == "msg" else error["error"]["code"]
                    assert shaped == ("api_error" if api == "msg" else "upstream_failed"), error
                    assert session.fault is not None and "answered" in session.fault, k
                    await proxy.close(key)
    finally:
        await owner.http.aclose()


# ---- endpoints with whitespace -------------------------------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def harness(endpoint: str) -> dict[str, Any]:
    return {"harness": {"name": "bash-agent", "model_endpoint": endpoint, "model": "fake"}}


async def test_a_model_endpoint_with_whitespace_is_stripped_or_refused(
    api: httpx.AsyncClient, manager: EpisodeManager, upstream: FakeUpstream
) -> None:
    """A pasted endpoint's newline reached httpx as it was (InvalidURL: a 500), a leading
    space made the probe call it an unknown protocol; whitespace around it is stripped now,
    and a space or control character inside is the caller's 422."""
    down = f"http://127.0.0.1:{closed_port()}/v1"
    for endpoint in (f"{down}\n", f"\t{down}", f" {down} "):
        reply = await api.post("/v1/episodes", json={"task": HUMANEVAL,
                                                     "options": harness(endpoint)})  # fmt: skip
        assert reply.status_code == 503, (endpoint, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "endpoint_unavailable", error
        assert f"endpoint {down} does not answer" in error["message"], error
    for endpoint in (f"{down}/a b", f"{down}/\x00", "http://127.0.0.1:9/\x85v1"):
        reply = await api.post("/v1/episodes", json={"task": HUMANEVAL,
                                                     "options": harness(endpoint)})  # fmt: skip
        assert reply.status_code == 422, (endpoint, reply.text)
        assert reply.json()["error"]["code"] == "invalid_harness"
    # The stripped endpoint is the one the session posts to.
    reply = await api.post("/v1/episodes", json={
        "task": HUMANEVAL, "options": harness(f" {upstream.url}/ok\n")})  # fmt: skip
    assert reply.status_code == 200, reply.text
    episode_id = reply.json()["episode_id"]
    try:
        proxy = manager.services.sessions
        assert isinstance(proxy, SessionProxy)
        session = proxy.get(episode_id)
        if session is not None:  # still running
            assert session.options.model_endpoint == f"{upstream.url}/ok"
    finally:
        await api.delete(f"/v1/episodes/{episode_id}")


def test_a_judge_url_with_whitespace_is_stripped_or_refused() -> None:
    judge = JudgeEndpointSettings(url=" http://127.0.0.1:8001/v1\n", model="m")
    assert judge.url == "http://127.0.0.1:8001/v1"
    for url in ("http://127.0.0.1:8001/v 1", "http://127.0.0.1:8001/v1\x00x"):
        with pytest.raises(ValidationError, match="space or a control character"):
            JudgeEndpointSettings(url=url, model="m")


# ---- ids on every engine -------------------------------------------------------------------
@pytest.fixture
async def engine(store_url: str, tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    """A manager on each engine's store (SQLite, PostgreSQL)."""
    built = build_manager(make_settings(data_dir=tmp_path / "data", store=store_url))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


SAY = {"tool": "echo", "arguments": {"text": "hi"}}


def refused(reply: httpx.Response, field: str) -> None:
    """A 422 in palaestra's error shape whose message names `field`."""
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert set(error) == {"code", "message", "retryable"}, error
    assert field in error["message"] and "control character" in error["message"], error


async def test_control_characters_in_ids_are_422_on_every_engine(
    engine: EpisodeManager,
) -> None:
    """On PostgreSQL, a reset naming episode id "a\\x00b", a GET of it and a token named
    with a NUL each answered 500 (SQLite took them: the same id, two answers)."""
    async with app_client(engine) as api:
        for bad in ("a\x00b", "a\x01b", "tab\there", "line\n", "del\x7f", "c1\x9b"):
            refused(await api.post("/v1/episodes", json={"task": ECHO, "episode_id": bad}),
                    "episode_id")  # fmt: skip
            refused(await api.post("/v1/episodes", json={"task": f"{ECHO}{bad}"}), "task")
            refused(await api.post("/v1/episodes", json={"pack": bad}), "pack")
            refused(await api.post("/v1/episodes", json={"task": ECHO, "domain": bad}), "domain")
            refused(await api.post("/v1/tokens", json={"scopes": ["train"], "name": bad}), "name")
            path = "/v1/episodes/" + quote(bad, safe="")
            refused(await api.get(path), "episode_id")
            refused(await api.post(f"{path}/step", json={"action": SAY}), "episode_id")
            refused(await api.post(f"{path}/verify"), "episode_id")
            refused(await api.delete(path), "episode_id")
            items = [{"episode_id": bad, "action": SAY}]
            batch = await api.post("/v1/batch/step", json={"items": items})
            assert batch.status_code == 200, batch.text
            [item] = batch.json()["items"]
            assert item["error"]["status"] == 422 and "episode_id" in item["error"]["message"]
            door = await api.post("/openenv/palaestra/echo/reset", json={"episode_id": bad})
            assert door.status_code in (400, 422) and "episode_id" in door.text, door.text
        # A printable id, spaces and all, is an id on both engines.
        ok = await api.post("/v1/episodes", json={"task": ECHO, "episode_id": " é 日本 "})
        assert ok.status_code == 200, ok.text
        assert (await api.get("/v1/episodes/%20%C3%A9%20日本%20")).status_code == 200
    assert engine.services.store.write_errors == 0


async def test_a_nul_request_id_is_refused_before_the_step(engine: EpisodeManager) -> None:
    """On PostgreSQL a step whose request_id held a NUL answered 200, and its record was
    dropped by the store writer: the trajectory lost a step the episode had taken."""
    async with app_client(engine) as api:
        episode_id = (await api.post("/v1/episodes", json={"task": ECHO})).json()["episode_id"]
        step = f"/v1/episodes/{episode_id}/step"
        refused(await api.post(step, json={"action": SAY, "request_id": "r\x00"}), "request_id")
        refused(await api.post(step, json={"action": SAY, "request_id": "r\x1b[2J"}),
                "request_id")  # fmt: skip
        door = await api.post("/openenv/palaestra/echo/step",
                              json={"episode_id": episode_id, "action": SAY,
                                    "request_id": "r\x00"})  # fmt: skip
        assert door.status_code in (400, 422) and "request_id" in door.text, door.text
        # A sandbox may print a NUL: the step record is JSON (a NUL is `\u0000` there), so
        # both engines store it and give it back as it was.
        text = "before\x00after"
        say = {"tool": "echo", "arguments": {"text": text}}
        ok = await api.post(step, json={"action": say, "request_id": "r1"})
        assert ok.status_code == 200, ok.text
        state = (await api.get(f"/v1/episodes/{episode_id}")).json()
        assert state["step_count"] == 1, state
        await engine.services.store.commit()
        [stored] = await engine.services.store.load_steps(episode_id)
        assert stored.request_id == "r1" and stored.action.arguments["text"] == text
        assert stored.observation.text == ok.json()["observation"]["text"]
    assert engine.services.store.write_errors == 0


async def test_the_store_refuses_a_nul_instead_of_dropping_it(store_url: str) -> None:
    """Past the wire's checks, a text PostgreSQL cannot hold is refused when it is queued,
    on both engines, never dropped by the writer after its caller went on; a void reason
    (free text, quoting a sandbox) is stored with U+FFFD for the NUL, alike."""
    store = Store(Database.open(store_url))
    try:
        state = EpisodeState(episode_id="e1", task="t", family="f", status=EpisodeStatus.ACTIVE,
                             step_count=0, created_at=1.0, updated_at=1.0)  # fmt: skip
        number = store.create_episode(state, "sha256:d", False, owner="tok").number
        record = step_record_json(
            index=0, request_id="r", action=Action(tool="echo"),
            observation=Observation(text="x\x00y"), reward=0.0, terminated=False,
            truncated=False, info={}, duration_s=0.0, at=1.0,
        )  # fmt: skip
        with pytest.raises(StoreWriteError, match="NUL"):
            store.add_step(number, 0, "r\x00", record)
        store.add_step(number, 0, "r", record)
        ended = state.model_copy(update={"status": EpisodeStatus.VOID,
                                         "void_reason": "sandbox said \x00"})  # fmt: skip
        store.update_episode(ended)
        await store.commit()
        assert store.write_errors == 1  # the one refused, said at once; nothing dropped after
        [step] = await store.load_steps("e1")
        assert step.request_id == "r" and step.observation.text == "x\x00y"
        loaded = await store.load_episode("e1")
        assert loaded is not None and loaded.void_reason == "sandbox said \ufffd"
    finally:
        store.close()


async def test_a_lone_surrogate_in_a_door_action_is_refused_before_the_step(
    manager: EpisodeManager,
) -> None:
    """The doors parse with `json.loads`, which takes `"\\ud800"` (and raw bytes that are not
    UTF-8): echo's step ran, then its record could not be encoded (a 500 after the step).
    Every body is checked before any parser sees it: a 422 in the contract's shape."""
    lone = b'{"action": {"tool": "echo", "arguments": {"text": "a\\ud800b"}}}'
    not_utf8 = b'{"action": {"tool": "echo", "arguments": {"text": "a\xed\xa0\x80b"}}}'
    async with app_client(manager) as api:
        started = await api.post("/openenv/palaestra/echo/reset", json={})
        episode = started.json()["metadata"]["episode_id"]
        for body in (lone, not_utf8):
            for path in (
                f"/openenv/palaestra/echo/step?episode_id={episode}",
                f"/v1/episodes/{episode}/step",
            ):
                reply = await api.post(path, content=body)
                assert reply.status_code == 422, reply.text
                assert reply.json()["error"]["code"] == "invalid_request", reply.text
        paired = b'{"action": {"tool": "echo", "arguments": {"text": "\\ud83d\\ude00"}}}'
        ok = await api.post(f"/v1/episodes/{episode}/step", content=paired)
        assert ok.status_code == 200 and ok.json()["observation"]["text"] == "😀", ok.text
        state = (await api.get(f"/v1/episodes/{episode}")).json()
        assert state["step_count"] == 1  # only the paired one ran
