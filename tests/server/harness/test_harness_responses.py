"""The session proxy's Open Responses door (server/harness/responses.py): a harness that
speaks `POST /v1/responses` through the sandbox gateway on loopback, driven by the `openai`
package's own client (`responses.create`, streamed and not) and checked against the spec's
own models (`openresponses-types`, the pydantic models of the Open Responses spec): the
Response resource, every stream event by its type, the error body. The upstream is
FakeModel (tests/peers/fake_model.py, a FAKE chat server that scripts tool calls and makes
up token ids); the real model's ids are checked in tests/server/harness/test_harness_proxy.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import openresponses_types as spec
import pytest

from palaestra.sdk.harness import LlmCall
from palaestra.sdk.train.harness import trajectories_from_calls
from palaestra.server.harness import responses
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from palaestra.server.harness.replay import Replay, reply_of
from tests.conftest import make_settings
from tests.harness_fakes import fake_reply, gateway_on_loopback, options
from tests.peers.fake_model import FakeModel, bash_call, submit_call

RESPONSES = "/v1/responses"
AGENT = Path(__file__).resolve().parents[3] / "server" / "harness" / "programs" / "bash_agent.py"
TOOLS: Any = [
    {"type": "function", "name": "bash", "description": "run a command",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
    {"type": "function", "name": "submit", "parameters": {"type": "object", "properties": {}}},
]  # fmt: skip
EVENTS: dict[str, type[Any]] = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.function_call_arguments.delta": spec.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
}


def stream_events(text: str) -> list[dict[str, Any]]:
    """The SSE body's events, each checked: `event:` names its `type`, the spec's model of
    that type takes it, sequence numbers count from 0."""
    events = []
    for block in text.strip().split("\n\n"):
        head, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        EVENTS[event["type"]].model_validate(event)
        assert event["sequence_number"] == len(events)
        events.append(event)
    return events


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    """Answers bash, then text, then submit, forever submit."""
    yield FakeModel([bash_call("ls", "call_1"), {"content": "thinking it over"}, submit_call()])


class Door:
    def __init__(self, session: LlmSession, url: str, calls: list[LlmCall]) -> None:
        self.session, self.url, self.calls = session, url, calls

    async def post(self, body: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            return await client.post(RESPONSES, json=body)


@asynccontextmanager
async def door(fake: FakeModel) -> AsyncIterator[Door]:
    fake.requests.clear()
    proxy = SessionProxy(make_settings(llm_call_timeout_s=5.0))
    calls: list[LlmCall] = []
    with fake.serve() as endpoint:
        session = proxy.open("ep", options(endpoint), owner="tok", max_calls=50,
                             max_tokens=10_000, on_call=calls.append)  # fmt: skip
        try:
            async with gateway_on_loopback(proxy, "ep") as url:
                yield Door(session, url, calls)
        finally:
            await proxy.aclose()


async def test_the_openai_client_runs_a_tool_loop(fake: FakeModel) -> None:
    async with door(fake) as d:
        client = openai.AsyncOpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0)
        first = await client.responses.create(
            model="gpt-whatever", instructions="be brief", input="list the files", tools=TOOLS
        )
        [call] = first.output
        assert call.type == "function_call" and call.name == "bash"
        assert json.loads(call.arguments) == {"command": "ls"} and call.call_id == "call_1"
        assert first.status == "completed" and first.usage and first.usage.output_tokens == 3

        history: Any = [{"role": "user", "content": "list the files"}, call.model_dump(),
                        {"type": "function_call_output", "call_id": call.call_id,
                         "output": "a.txt"}]  # fmt: skip
        second = await client.responses.create(model="gpt-whatever", input=history, tools=TOOLS)
        assert second.output_text == "thinking it over"
        # The upstream got the conversation as chat: the call and its output as a tool turn.
        sent = fake.requests[1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
        assert sent[1]["tool_calls"][0]["id"] == "call_1" and sent[2]["content"] == "a.txt"
        assert sent[2]["tool_call_id"] == "call_1"

        async with client.responses.stream(model="m", input=history, tools=TOOLS) as stream:
            final = await stream.get_final_response()
        assert final.output[0].type == "function_call" and final.output[0].name == "submit"

    # Each call is recorded as the other dialects' are: the request as sent, the Response
    # as the harness got it, the upstream's ids and logprobs.
    assert [c.api for c in d.calls] == ["openresponses"] * 3
    assert [c.stream for c in d.calls] == [False, False, True]
    assert d.calls[0].request["instructions"] == "be brief"
    assert d.calls[0].response["output"][0]["call_id"] == "call_1"
    assert d.calls[1].prompt_token_ids == [100, 101, 102]  # FakeModel: one id per message
    assert all(c.completion_token_ids == [1, 2, 3] and c.logprobs == [-0.5] * 3 for c in d.calls)
    assert d.calls[2].finish_reason == "tool_calls" and d.session.fault is None
    # ...and so they train: token-in/token-out samples, the completion ids masked in.
    samples = trajectories_from_calls(d.calls, reward=1.0)
    assert samples and all(t.reward == 1.0 for t in samples)
    assert sum(sum(t.loss_mask) for t in samples) == 9


async def test_wire_shapes_are_the_specs(fake: FakeModel) -> None:
    async with door(fake) as d:
        body = {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}],
                "tools": TOOLS, "include": ["message.output_text.logprobs"],
                "max_output_tokens": 64}  # fmt: skip
        spec.CreateResponseBody.model_validate(body)  # what this test sends is the spec's
        whole = await d.post(body)
        assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
        resource = spec.ResponseResource.model_validate(whole.json())
        assert resource.output[0].type == "function_call"

        streamed = await d.post(body | {"stream": True})  # the text reply, with logprobs
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = stream_events(streamed.text)
        kinds = [e["type"] for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
        [delta] = [e for e in events if e["type"] == "response.output_text.delta"]
        assert delta["delta"] == "thinking it over"
        assert [lp["logprob"] for lp in delta["logprobs"]] == [-0.5] * 3
        done = spec.ResponseResource.model_validate(events[-1]["response"])
        assert done.output[0].type == "message" and done.status == "completed"
        assert d.calls[1].response == events[-1]["response"]  # the record: what it got

        wrong = await d.post(body | {"input": [{"type": "item_reference", "id": "msg_1"}]})
        assert wrong.status_code == 400
        error = spec.Error.model_validate(wrong.json()["error"])
        assert error.param == "input" and "item_reference" in error.message
        missing = await d.post({"model": "m"})
        assert missing.status_code == 400
        spec.Error.model_validate(missing.json()["error"])
        assert len(fake.requests) == 2 and d.session.fault is None


async def test_the_budget_cuts_max_output_tokens_and_a_replay_answers_the_same(
    fake: FakeModel,
) -> None:
    async with door(fake) as d:
        d.session.max_tokens = 2  # the proxy cuts max_tokens to what the episode has left
        body = {"model": "m", "input": "hi", "max_output_tokens": 50, "stream": True}
        reply = await d.post(body)
        assert reply.status_code == 200
        sent = fake.requests[0]
        assert sent["max_tokens"] == 2 and sent["stream"] is False and "input" not in sent
    [call] = d.calls
    # A resumed harness gets the recorded call again (server/harness/replay.py), the same
    # stream; the ids are the record's.
    again = reply_of(call)
    assert again.status == 200 and again.content_type.startswith("text/event-stream")
    assert [e["type"] for e in stream_events(again.body.decode())] == [
        e["type"] for e in stream_events(reply.text)
    ]


def test_a_reply_cut_at_length_is_incomplete() -> None:
    request = {"model": "m", "input": "hi", "max_output_tokens": 2}
    chat = responses.to_chat(request)
    reply = fake_reply(chat)  # 2 of its 3 tokens: finish_reason "length"
    resource = responses.from_chat(reply, request, "m")
    checked = spec.ResponseResource.model_validate(resource)
    assert checked.status == "incomplete" and checked.incomplete_details is not None
    assert checked.incomplete_details.reason == "max_output_tokens"
    events = stream_events(responses.response_sse(resource).decode())
    assert events[-1]["type"] == "response.incomplete"
    first = events[0]["response"]
    assert first["status"] == "in_progress" and first["output"] == []


def test_a_resumed_harness_that_changes_an_item_is_told_which() -> None:
    """A resume (server/harness/replay.py) checks a Responses request against its capture;
    the divergence names the input item that differs."""
    items = [{"type": "message", "role": "user", "content": text} for text in "ab"]
    body = {"model": "m", "input": items}
    call = LlmCall(index=0, api="openresponses", request=body, response={}, prompt_token_ids=[1],
                   completion_token_ids=[2], logprobs=[-0.1], started_at=0.0, upstream_s=0.0,
                   proxy_s=0.0)  # fmt: skip
    replay = Replay([call])
    assert replay.diverges("openresponses", json.dumps(body).encode()) is None
    changed = {**body, "input": [items[0], {**items[1], "content": "c"}]}
    why = replay.diverges("openresponses", json.dumps(changed).encode())
    assert why is not None and "input[1] differs" in why
    assert "recorded call was openresponses" in str(replay.diverges("openai-chat", b"{}"))


async def test_bash_agent_speaks_only_responses(tmp_path: Path) -> None:
    """The built-in agent with `--api responses` (outside a sandbox, against the gateway):
    a text reply is nudged, a function_call runs, its output goes back as a
    function_call_output item, submit ends it; every call is a Responses call."""
    script = FakeModel([{"content": "hmm"}, bash_call("echo hi > out.txt"), submit_call()])
    async with door(script) as d:
        (tmp_path / "task.md").write_text("Write hi into out.txt, then submit.")
        env = {"PATH": "/usr/bin:/bin", "OPENAI_BASE_URL": f"{d.url}/v1", "OPENAI_MODEL": "m"}
        agent = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(AGENT), "--instruction-file", "task.md", "--api",
            "responses", cwd=tmp_path, env=env, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(agent.communicate(), 60)
    assert agent.returncode == 0, err.decode()
    assert (tmp_path / "out.txt").read_text() == "hi\n"
    assert [c.api for c in d.calls] == ["openresponses"] * 3
    first, second, third = (c.request for c in d.calls)
    assert first["instructions"].startswith("You are an agent") and "messages" not in first
    assert [t["name"] for t in first["tools"]] == ["bash", "submit"]
    assert [i["role"] for i in second["input"]] == ["user", "assistant", "user"]  # the nudge
    assert [i["type"] for i in third["input"][-2:]] == ["function_call", "function_call_output"]
    assert third["input"][-1]["output"] == "exit status 0\n"
    for request in (first, second, third):
        spec.CreateResponseBody.model_validate(request)  # the agent speaks the spec
