"""The session model proxy (server/harness/proxy.py) through its gateway on a loopback
listener, against a REAL model server: sdk/train/openai_server.py over HFBackend with the
tool-calling tiny Qwen2 (tests/peers/tiny_models.py), started once for the module. The
recorded ids are the ones that server generated: its own reply to the same greedy request
made directly. `FakeUpstream` (tests/harness_fakes.py, a fake) plays what the real server
will not do on demand: no token ids, 5xx, 429, slow answers; a closed port is real.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from palaestra.sdk.harness import LlmCall
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from tests.conftest import free_port, make_settings
from tests.harness_fakes import CONTEXT_ERROR, FakeUpstream, gateway_on_loopback, options
from tests.peers.tiny_models import TOOL_CALL, make_models
from tests.sdk.train.test_openai_server import CACHE, TOOLS, model_server

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "hi"}]
SYSTEM = {"role": "system", "content": "be brief"}
CALL = json.loads(TOOL_CALL)
CHAT = "/v1/chat/completions"
GREEDY = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real model server's OpenAI base URL (…/v1), serving the model as `tiny`."""
    path = make_models(CACHE / "tiny-models")["tools"]
    port = free_port()
    log = tmp_path_factory.mktemp("proxy-model") / "server.log"
    args = [sys.executable, "-m", "palaestra.sdk.train.openai_server", "--model", path,
            "--served-model-name", "tiny", "--port", str(port)]  # fmt: skip
    with model_server(args, port, log) as url:
        yield f"{url}/v1"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream() as upstream:
        yield upstream


class Harness:
    """A session, its gateway's base URL, and the calls it recorded."""

    def __init__(self, session: LlmSession, url: str, calls: list[LlmCall]) -> None:
        self.session, self.url, self.calls = session, url, calls

    async def chat(
        self, body: dict[str, Any], path: str = "/v1/chat/completions"
    ) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            return await client.post(path, json=body)


@pytest.fixture
async def proxy() -> AsyncIterator[SessionProxy]:
    made = SessionProxy(make_settings(llm_call_timeout_s=5.0))
    yield made
    await made.aclose()


@asynccontextmanager
async def open_harness(
    proxy: SessionProxy, endpoint: str, model: str = "fake", key: str = "ep", **limits: int
) -> AsyncIterator[Harness]:
    """A session of `proxy` on `endpoint` with its gateway on loopback."""
    calls: list[LlmCall] = []
    session = proxy.open(
        key,
        options(endpoint, model, **GREEDY),
        owner="tok",
        max_calls=limits.get("max_calls", 100),
        max_tokens=limits.get("max_tokens", 10_000),
        on_call=calls.append,
    )
    async with gateway_on_loopback(proxy, key) as url:
        yield Harness(session, url, calls)


@pytest.fixture
async def real(proxy: SessionProxy, model: str) -> AsyncIterator[Harness]:
    async with open_harness(proxy, model, "tiny") as h:
        yield h


def direct(model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The model server's own reply to `body` (greedy), ids and logprobs asked for."""
    body = {**body, **GREEDY, "model": "tiny", "return_token_ids": True, "logprobs": True}
    reply = httpx.post(f"{model}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


# ---- the real model server -------------------------------------------------------------------
async def test_records_the_ids_the_server_generated(real: Harness, model: str) -> None:
    reply = await real.chat({"model": "whatever", "messages": USER, "tools": TOOLS})
    assert reply.status_code == 200, reply.text
    got = reply.json()
    choice = got["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [tool_call] = choice["message"]["tool_calls"]
    assert json.loads(tool_call["function"]["arguments"]) == CALL["arguments"]
    # The harness asked for neither ids nor logprobs: they are in the record, not its reply.
    assert "prompt_token_ids" not in got and "token_ids" not in choice
    assert choice["logprobs"] is None

    [call] = real.calls
    want = direct(model, {"messages": USER, "tools": TOOLS})
    assert call.prompt_token_ids == want["prompt_token_ids"]
    assert call.completion_token_ids == want["choices"][0]["token_ids"]
    assert len(call.completion_token_ids) == 4
    assert call.logprobs == [c["logprob"] for c in want["choices"][0]["logprobs"]["content"]]
    assert call.api == "openai-chat" and call.index == 0 and not call.stream
    assert call.request["model"] == "whatever"  # what the harness sent, before the proxy
    assert call.response == got and call.finish_reason == "tool_calls"
    assert call.usage["completion_tokens"] == 4 and call.usage["prompt_tokens"] > 0
    assert 0 < call.upstream_s <= call.proxy_s
    assert real.session.calls == 1 and real.session.completion_tokens == 4
    assert real.session.fault is None and not real.session.stopped.is_set()

    asked = await real.chat({"messages": USER, "return_token_ids": True, "logprobs": True})
    body = asked.json()
    assert body["prompt_token_ids"] == real.calls[1].prompt_token_ids
    assert body["choices"][0]["token_ids"] == real.calls[1].completion_token_ids
    assert TOOL_CALL in body["choices"][0]["message"]["content"]  # no tools: the text


async def test_stream_is_synthesized_from_the_whole_reply(real: Harness, model: str) -> None:
    reply = await real.chat({"messages": USER, "tools": TOOLS, "stream": True})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_data(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    [calls] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert json.loads(calls[0]["function"]["arguments"]) == CALL["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 4

    [call] = real.calls
    assert call.stream and call.request["stream"] is True
    assert call.response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "submit"
    want = direct(model, {"messages": USER, "tools": TOOLS})
    assert call.completion_token_ids == want["choices"][0]["token_ids"]


async def test_anthropic_door_with_the_official_client(real: Harness, model: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=real.url, api_key="unused", max_retries=0)
    tools: Any = [{"name": "submit", "description": "answer", "input_schema": {"type": "object"}}]
    message = await client.messages.create(
        model="claude-whatever", max_tokens=8, system="be brief", messages=USER, tools=tools
    )
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert block.type == "tool_use" and block.name == "submit"
    assert block.input == CALL["arguments"]
    assert message.usage.output_tokens == 4

    async with client.messages.stream(
        model="claude-whatever", max_tokens=8, messages=USER, tools=tools
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.content[0].input == CALL["arguments"]

    # A follow-up turn with the tool's result goes through as an OpenAI `tool` message.
    result = {"type": "tool_result", "tool_use_id": block.id, "content": "correct"}
    follow = await client.messages.create(
        model="claude-whatever",
        max_tokens=8,
        messages=[
            *USER,
            {"role": "assistant", "content": [block.model_dump()]},
            {"role": "user", "content": [result]},
        ],
        tools=tools,
    )
    assert follow.stop_reason in ("tool_use", "end_turn", "max_tokens")
    first, streamed, third = real.calls
    assert first.api == "anthropic-messages" and streamed.stream and not first.stream
    assert first.request["system"] == "be brief" and first.response["stop_reason"] == "tool_use"
    want = direct(
        model,
        {
            "messages": [{"role": "system", "content": "be brief"}, *USER],
            "tools": openai_tools(tools),
        },
    )
    assert first.prompt_token_ids == want["prompt_token_ids"]
    assert first.completion_token_ids == want["choices"][0]["token_ids"]
    assert len(third.prompt_token_ids) > len(first.prompt_token_ids)  # the history grew

    bad = await real.chat({"model": "x", "messages": USER}, "/v1/messages")  # no max_tokens
    assert bad.status_code == 400
    assert bad.json()["type"] == "error" and "max_tokens" in bad.json()["error"]["message"]
    assert len(real.calls) == 4  # refused before the upstream: recorded as refused, no ids
    assert real.calls[3].error and "max_tokens" in real.calls[3].error
    assert real.calls[3].completion_token_ids == [] and real.session.calls == 3


async def test_responses_door_with_the_openai_client(real: Harness, model: str) -> None:
    """The `openai` client's `responses.create` through the gateway: the real model's tool
    call as a function_call item, streamed and not; the ids recorded are the server's own
    reply to the same chat request."""
    client = openai.AsyncOpenAI(base_url=f"{real.url}/v1", api_key="unused", max_retries=0)
    tools: Any = [{"type": "function", "name": "submit", "description": "answer",
                   "parameters": {"type": "object"}}]  # fmt: skip
    whole = await client.responses.create(
        model="gpt-whatever", instructions="be brief", input="hi", tools=tools
    )
    [item] = whole.output
    assert item.type == "function_call" and item.name == "submit"
    assert json.loads(item.arguments) == CALL["arguments"]
    assert whole.usage is not None and whole.usage.output_tokens == 4
    async with client.responses.stream(
        model="gpt-whatever", instructions="be brief", input="hi", tools=tools
    ) as stream:
        final = await stream.get_final_response()
    assert final.output[0].type == "function_call" and final.output[0].arguments == item.arguments
    first, streamed = real.calls
    assert first.api == streamed.api == "openresponses" and streamed.stream
    submit = {"name": "submit", "description": "answer", "input_schema": {"type": "object"}}
    want = direct(model, {"messages": [SYSTEM, *USER], "tools": openai_tools([submit])})
    for call in (first, streamed):
        assert call.prompt_token_ids == want["prompt_token_ids"]
        assert call.completion_token_ids == want["choices"][0]["token_ids"]
        assert call.logprobs == [c["logprob"] for c in want["choices"][0]["logprobs"]["content"]]


def openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": t["name"], "description": t["description"], "parameters": t["input_schema"]
        }}
        for t in tools
    ]  # fmt: skip


async def test_upstream_4xx_reaches_the_harness_unchanged(real: Harness) -> None:
    # More than the model's context (2048): the agent's doing, answered by the real server.
    reply = await real.chat({"messages": [{"role": "user", "content": "hello world " * 2000}]})
    assert reply.status_code == 400
    assert "context" in reply.json()["error"]["message"]
    [call] = real.calls
    assert call.response == reply.json() and call.completion_token_ids == []
    assert real.session.fault is None and not real.session.stopped.is_set()


async def test_limits_stop_the_session(proxy: SessionProxy, model: str) -> None:
    async with open_harness(proxy, model, "tiny", key="calls", max_calls=2) as h:
        for _ in range(2):
            assert (await h.chat({"messages": USER})).status_code == 200
        over = await h.chat({"messages": USER})
        assert over.status_code == 400
        error = over.json()["error"]
        assert "max_calls" in error["message"] and error["code"] == "limit_reached"
        assert h.session.limit is not None and "max_calls" in h.session.limit
        assert h.session.stopped.is_set() and h.session.fault is None and len(h.calls) == 2
    async with open_harness(proxy, model, "tiny", key="tokens", max_tokens=3) as h:
        first = await h.chat({"messages": USER, "max_tokens": 100})
        assert first.status_code == 200
        assert first.json()["choices"][0]["finish_reason"] == "length"  # clamped to 3
        assert h.calls[0].completion_token_ids and len(h.calls[0].completion_token_ids) == 3
        over = await h.chat({"messages": USER})
        assert over.status_code == 400 and "max_tokens" in over.json()["error"]["message"]
        assert h.session.limit is not None and h.session.stopped.is_set()


# ---- the scripted upstream (a fake) and the proxy's own refusals ---------------------------
async def test_closed_session_refuses(proxy: SessionProxy, fake: FakeUpstream) -> None:
    async with open_harness(proxy, f"{fake.url}/ok") as h:
        assert (await h.chat({"messages": USER})).status_code == 200
        await proxy.close("ep")
        await proxy.close("ep")  # idempotent
        assert proxy.get("ep") is None
        direct_reply = await h.session.handle("POST", "/v1/chat/completions", b"{}")
        via_gateway = await h.chat({"messages": USER})
        for status, body in ((direct_reply.status, json.loads(direct_reply.body)),
                             (via_gateway.status_code, via_gateway.json())):  # fmt: skip
            assert status == 409 and body["error"]["code"] == "session_closed"
            assert set(body["error"]) == {"message", "type", "param", "code"}
        assert len(h.calls) == 1


async def test_bad_requests(proxy: SessionProxy, fake: FakeUpstream) -> None:
    before = len(fake.hits)
    async with open_harness(proxy, f"{fake.url}/ok") as h:
        async with httpx.AsyncClient(base_url=h.url) as client:
            bad = await client.post("/v1/chat/completions", content=b"{nope")
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
            arr = await client.post("/v1/chat/completions", json=[1])
            assert arr.status_code == 400
            models = await client.get("/v1/models")
            assert models.json()["data"][0]["id"] == "fake"
            wrong = await client.get("/v1/chat/completions")
            assert wrong.status_code == 405
        n2 = await h.chat({"messages": USER, "n": 2})
        assert n2.status_code == 400 and n2.json()["error"]["param"] == "n"
        assert h.session.calls == 0 and len(fake.hits) == before
        # Each refused request is a record saying so (nothing dropped unsaid), no ids.
        assert [c.request for c in h.calls] == [{"head": "{nope"}, {"head": "[1]"},
                                                {"messages": USER, "n": 2}]  # fmt: skip
        assert all(c.error and "refused by the proxy" in c.error for c in h.calls)


async def test_sampling_model_and_ids_are_forced(proxy: SessionProxy, fake: FakeUpstream) -> None:
    async with open_harness(proxy, f"{fake.url}/ok", max_tokens=2) as h:
        body = {"model": "gpt-9", "messages": USER, "temperature": 1.7, "stream": True,
                "stream_options": {"include_usage": True}, "max_completion_tokens": 50}  # fmt: skip
        reply = await h.chat(body)
        assert reply.status_code == 200 and sse_data(reply.text)[-1] == "[DONE]"
        sent = fake.hits[-1].body
        assert sent["model"] == "fake" and sent["temperature"] == 0.0  # the reset's sampling
        assert sent["stream"] is False and "stream_options" not in sent
        assert sent["return_token_ids"] is True and sent["logprobs"] is True
        assert sent["max_tokens"] == 2 and "max_completion_tokens" not in sent
        assert h.calls[0].request == body
    bare = proxy.open("bare", options(f"{fake.url}/ok"), owner="o", max_calls=5, max_tokens=2,
                      on_call=lambda call: None)  # fmt: skip
    reply = await bare.handle("POST", "/chat/completions", json.dumps({"messages": USER}).encode())
    assert reply.status == 200
    assert "max_tokens" not in fake.hits[-1].body  # unknown context: not invented
    assert bare.completion_tokens == 3  # over the budget of 2 by this one call...
    over = await bare.handle("POST", "/chat/completions", json.dumps({"messages": USER}).encode())
    assert over.status == 400 and bare.limit is not None  # ...and the next is refused


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("noids", "returned no token ids; serve with vLLM ≥ 0.10.2"),
        ("e500", "failed: HTTP 500: upstream exploded"),
        ("notjson", "no chat completion"),
    ],
)
async def test_upstream_faults_void(
    proxy: SessionProxy, fake: FakeUpstream, mode: str, reason: str
) -> None:
    async with open_harness(proxy, f"{fake.url}/{mode}") as h:
        reply = await h.chat({"messages": USER})
        assert reply.status_code == 502
        assert reason in reply.json()["error"]["message"]
        assert h.session.fault is not None and reason in h.session.fault
        assert f"{fake.url}/{mode}" in h.session.fault  # names the endpoint
        assert h.session.stopped.is_set() and h.calls == []
        again = await h.chat({"messages": USER})
        assert again.status_code == 502  # a faulted session stays so


async def test_connect_refused_is_a_fault(proxy: SessionProxy) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    async with open_harness(proxy, closed) as h:
        reply = await h.chat({"messages": USER})
        assert reply.status_code == 502
        assert h.session.fault is not None and "cannot be reached" in h.session.fault
        assert closed in h.session.fault


async def test_slow_upstream_and_the_timeout(fake: FakeUpstream) -> None:
    proxy = SessionProxy(make_settings(llm_call_timeout_s=0.5))
    try:
        async with open_harness(proxy, f"{fake.url}/slow") as h:
            ok = await h.chat({"messages": [{"role": "user", "content": "0.1"}]})
            assert ok.status_code == 200 and h.session.fault is None
            late = await h.chat({"messages": [{"role": "user", "content": "2.0"}]})
            assert late.status_code == 502
            assert h.session.fault is not None
            assert "did not answer within 0.5 s (llm_call_timeout_s)" in h.session.fault
    finally:
        await proxy.aclose()


async def test_429_and_4xx_pass_through(proxy: SessionProxy, fake: FakeUpstream) -> None:
    async with open_harness(proxy, f"{fake.url}/e429", key="busy") as h:
        reply = await h.chat({"messages": USER})
        assert reply.status_code == 429 and reply.headers["retry-after"] == "3"
        assert h.session.fault is None and h.session.calls == 0 and h.calls == []
    async with open_harness(proxy, f"{fake.url}/e400", key="long") as h:
        reply = await h.chat({"messages": USER})
        assert reply.status_code == 400 and reply.json() == CONTEXT_ERROR
        assert h.session.fault is None and h.session.calls == 1
        assert h.calls[0].response == CONTEXT_ERROR
        translated = await h.chat({"max_tokens": 5, "messages": USER}, "/v1/messages")
        assert translated.status_code == 400
        assert translated.json()["error"] == {
            "type": "invalid_request_error",
            "message": CONTEXT_ERROR["error"]["message"],
        }


def test_open_refuses_bad_endpoints() -> None:
    proxy = SessionProxy(make_settings())
    for endpoint in ("ftp://x/v1", "not a url", "http://h/v1?x=1", "http://u:p@h/v1"):
        with pytest.raises(ValueError, match="model_endpoint"):
            proxy.open("k", options(endpoint), owner="o", max_calls=1, max_tokens=1,
                       on_call=lambda c: None)  # fmt: skip
    proxy.open("k", options("http://h/v1"), owner="o", max_calls=1, max_tokens=1,
               on_call=lambda c: None)  # fmt: skip
    with pytest.raises(ValueError, match="already has"):
        proxy.open("k", options("http://h/v1"), owner="o", max_calls=1, max_tokens=1,
                   on_call=lambda c: None)  # fmt: skip


def test_settings_are_validated(tmp_path: Path) -> None:
    from pydantic import ValidationError

    for bad in ({"llm_call_timeout_s": 0}, {"llm_max_request_kb": 0}, {"llm_max_response_kb": -1}):
        with pytest.raises(ValidationError):
            make_settings(data_dir=tmp_path, **bad)


async def test_upstream_pool_reuses_retries_stale_and_reads_chunked() -> None:
    """sdk/http11.py against a raw loopback server that answers chunked, keeps
    the connection, and closes it without a word at the next request (as a server whose
    keep-alive ran out): the request goes out again on a fresh connection, once."""
    import asyncio

    from palaestra.sdk.http11 import Target, TooLarge, UpstreamPool

    seen: list[bytes] = []

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        seen.append(await r.readexactly(length))
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")  # fmt: skip
        await w.drain()
        with contextlib.suppress(asyncio.IncompleteReadError):
            await r.readuntil(b"\r\n\r\n")  # the next request: never answered
        w.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool(connect_timeout_s=5)
    target = Target.parse(f"http://127.0.0.1:{port}/v1/chat/completions")
    try:
        for k in range(3):
            got = await pool.post(target, b'{"k": %d}' % k, 1000)
            assert got.status == 200 and got.body == b"hello world"
        assert seen == [b'{"k": 0}', b'{"k": 1}', b'{"k": 2}']  # each sent once
        with pytest.raises(TooLarge):
            await pool.post(target, b"{}", 8)
    finally:
        await pool.aclose()
        server.close()
        await server.wait_closed()
    with pytest.raises(OSError):  # nothing listens there now
        await UpstreamPool(connect_timeout_s=5).post(target, b"{}", 1000)
