"""Attacks on the session proxy's Open Responses door (server/harness/responses.py): a
hostile harness posts Responses requests the proxy cannot translate (unknown or stateful
items, hosted tools, bad tool schemas, structured output, wrong JSON types everywhere, huge
or deep bodies), and a hostile tenant reaches for another's `/llm/v1/responses`.

Each must be a 4xx to the harness in the Responses error shape (checked with the spec's
own `openresponses_types.Error`), never a 5xx; the upstream (a FAKE, tests/harness_fakes.py)
is never asked; the session takes no fault (a fault voids the episode, and the policy caused
these): at most it stops at a limit, truncated. A valid call after all of them still works.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openresponses_types as spec
import pytest

from palaestra.sdk.harness import LlmCall
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from palaestra.server.manager import EpisodeManager
from tests.conftest import make_settings
from tests.harness_fakes import FakeUpstream, gateway_on_loopback, options
from tests.peers.fake_model import FakeModel
from tests.redteam.tenants import tenant

RESPONSES = "/v1/responses"
VALID: dict[str, Any] = {
    "model": "m",
    "instructions": "be brief",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ],
    "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "max_output_tokens": 32,
    "temperature": 0.5,
}
# Requests the proxy cannot translate, and the param its refusal names.
UNTRANSLATABLE: list[tuple[str, dict[str, Any], str]] = [
    ("item_reference", {"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ("a bare reference", {"input": [{"id": "msg_1"}]}, "input"),
    ("unknown item", {"input": [{"type": "computer_call", "call_id": "x"}]}, "input"),
    ("compaction", {"input": [{"type": "compaction", "encrypted_content": "x"}]}, "input"),
    ("role", {"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input"),
    ("image by URL", {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "http://169.254.169.254/latest"}]}]}, "input"),
    ("file", {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_file", "file_url": "https://x/y.pdf"}]}]}, "input"),
    ("output image", {"input": [{"type": "function_call_output", "call_id": "c",
                                 "output": [{"type": "input_image", "image_url": "data:x"}]}]},
     "input"),
    ("no input", {"input": None}, "input"),
    ("empty input", {"input": [], "instructions": None}, "input"),
    ("instructions", {"instructions": ["be", "brief"]}, "instructions"),
    ("stateful", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("conversation", {"conversation": "conv_1"}, "conversation"),
    ("background", {"background": True}, "background"),
    ("hosted tool", {"tools": [{"type": "web_search"}]}, "tools"),
    ("mcp tool", {"tools": [{"type": "mcp", "server_url": "http://x"}]}, "tools"),
    ("tool name", {"tools": [{"type": "function", "name": "../etc"}]}, "tools"),
    ("long tool name", {"tools": [{"type": "function", "name": "a" * 65}]}, "tools"),
    ("schema not object", {"tools": [{"type": "function", "name": "f", "parameters": "x"}]},
     "tools"),
    ("schema of a string", {"tools": [{"type": "function", "name": "f",
                                       "parameters": {"type": "string"}}]}, "tools"),
    ("tools not list", {"tools": {"type": "function"}}, "tools"),
    ("tool_choice", {"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
    ("json schema", {"text": {"format": {"type": "json_schema", "schema": {}}}}, "text"),
    ("include", {"include": ["file_search_call.results"]}, "include"),
    ("top_logprobs", {"top_logprobs": 20}, "top_logprobs"),
    ("max_output_tokens", {"max_output_tokens": -1}, "max_output_tokens"),
    ("temperature", {"temperature": 9}, "temperature"),
    ("seed-like junk", {"top_p": "high"}, "top_p"),
]  # fmt: skip
HOSTILE = [None, True, -1, 1e308, "", "x" * 70, [], [[]], {}, {"type": None}, {"type": []}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@asynccontextmanager
async def door(
    endpoint: str, max_calls: int = 10_000, **settings: Any
) -> AsyncIterator[tuple[LlmSession, httpx.AsyncClient, list[LlmCall]]]:
    proxy = SessionProxy(make_settings(**settings))
    calls: list[LlmCall] = []
    session = proxy.open("ep", options(endpoint), owner="tok", max_calls=max_calls,
                         max_tokens=10**6, on_call=calls.append)  # fmt: skip
    try:
        async with (
            gateway_on_loopback(proxy, "ep") as url,
            httpx.AsyncClient(base_url=url, timeout=30) as http,
        ):
            yield session, http, calls
    finally:
        await proxy.aclose()


def refused_shape(reply: httpx.Response) -> spec.Error:
    """The Responses error shape (the spec's model takes it)."""
    assert reply.headers["content-type"] == "application/json"
    return spec.Error.model_validate(reply.json()["error"])


def refused(reply: httpx.Response) -> spec.Error:
    """A 4xx in the Responses error shape."""
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text[:300])
    return refused_shape(reply)


def mutations(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into `value` (keys and indexes), the root's children first."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*path, key)
            yield from mutations(inner, (*path, key))
    elif isinstance(value, list):
        for k, inner in enumerate(value):
            yield (*path, k)
            yield from mutations(inner, (*path, k))


def replaced(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    at: Any = out
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value
    return out


async def test_untranslatable_requests_are_the_harness_4xx(upstream: FakeUpstream) -> None:
    before = len(upstream.hits)
    async with door(f"{upstream.url}/ok") as (session, http, calls):
        for name, change, param in UNTRANSLATABLE:
            reply = await http.post(RESPONSES, json=VALID | change)
            error = refused(reply)
            assert reply.status_code == 400, name
            assert error.param == param, (name, error)
            assert error.code in ("invalid_request", "invalid_value", "invalid_type"), name
        assert len(upstream.hits) == before and session.calls == 0
        assert session.fault is None and session.limit is None and not session.stopped.is_set()
        assert len(calls) == len(UNTRANSLATABLE)  # each a refused record, no ids
        assert all(c.error and c.api == "openresponses" and not c.completion_token_ids
                   for c in calls)  # fmt: skip
        ok = await http.post(RESPONSES, json=VALID)
        assert ok.status_code == 200, ok.text
        spec.ResponseResource.model_validate(ok.json())
        assert upstream.hits[-1].body["messages"][0] == {"role": "system", "content": "be brief"}


async def test_hostile_json_at_every_field_is_never_a_5xx(
    upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Each field and item of a valid request, in turn, replaced by each HOSTILE value: a
    200 or the harness's 4xx naming what to fix, never a 5xx, never a fault, and never the
    proxy's catch-all (a translation that raised where it should have refused)."""
    log = logging.getLogger("palaestra.harness")  # "palaestra" may not propagate to root
    log.addHandler(caplog.handler)
    async with door(f"{upstream.url}/ok") as (session, http, _):
        statuses: set[int] = set()
        for path in mutations(VALID):
            for value in HOSTILE:
                reply = await http.post(RESPONSES, json=replaced(VALID, path, value))
                statuses.add(reply.status_code)
                if reply.status_code != 200:
                    refused(reply)
        assert statuses <= {200, 400} and 400 in statuses
        log.removeHandler(caplog.handler)
        assert "not translated" not in caplog.text
        assert session.fault is None and not session.stopped.is_set()


async def test_huge_and_deep_bodies(upstream: FakeUpstream) -> None:
    before = len(upstream.hits)
    async with door(f"{upstream.url}/ok", llm_max_request_kb=64) as (session, http, calls):
        huge = VALID | {"input": "x" * (65 * 1024)}
        assert refused(await http.post(RESPONSES, json=huge)).code == "413"  # the gateway's
        many = VALID | {"input": [{"type": "item_reference", "id": "r"}] * 1000}
        refused(await http.post(RESPONSES, json=many))
        deep = "[" * 5000 + '"x"' + "]" * 5000
        body = json.dumps(VALID).replace('"ok"', deep)
        refused(await http.post(RESPONSES, content=body))
        assert refused(await http.post(RESPONSES, content=b"\xff{")).code == "invalid_json"
        # The /llm/ route's way in (no gateway): the proxy's own cap, the same shape.
        direct = await session.handle("POST", RESPONSES, b" " * (65 * 1024))
        assert direct.status == 413
        spec.Error.model_validate(json.loads(direct.body)["error"])
        assert session.fault is None and len(upstream.hits) == before
        assert all(c.error for c in calls)


async def test_upstream_refusal_is_the_responses_shape(upstream: FakeUpstream) -> None:
    """The model server's 400 (a context too long: the agent's doing) reaches the harness in
    the Responses shape, with a string code where vLLM's is a number; no fault."""
    async with door(f"{upstream.url}/e400") as (session, http, calls):
        reply = await http.post(RESPONSES, json=VALID | {"stream": True})
        error = refused(reply)
        assert reply.status_code == 400 and "maximum context length" in error.message
        assert error.code == "upstream_error"
        assert session.fault is None and calls[0].error and session.calls == 1


async def test_the_route_answers_only_the_owner(
    manager: EpisodeManager, upstream: FakeUpstream
) -> None:
    proxy = SessionProxy(manager.settings)
    manager.services.sessions = proxy
    owner, other = tenant(manager, ["train"]), tenant(manager, ["train"])
    calls: list[LlmCall] = []
    proxy.open(f"{owner.token_id}:mine", options(f"{upstream.url}/ok"), owner=owner.token_id,
               max_calls=9, max_tokens=99, on_call=calls.append)  # fmt: skip
    before = len(upstream.hits)
    path = "/v1/episodes/mine/llm/v1/responses"
    try:
        ok = await owner.http.post(path, json={"model": "m", "input": "hi"})
        assert ok.status_code == 200, ok.text
        assert spec.ResponseResource.model_validate(ok.json()).output[0].type == "message"
        stream = await owner.http.post(path, json={"model": "m", "input": "hi", "stream": True})
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert "event: response.completed" in stream.text
        foreign = await other.http.post(path, json={"model": "m", "input": "hi"})
        assert foreign.status_code == 404  # the one 404 of an unknown episode (DESIGN §3)
        bad = await owner.http.post(path, json={"input": [{"type": "item_reference", "id": "x"}]})
        assert refused(bad).param == "input"
        assert len(calls) == 3 and len(upstream.hits) == before + 2
    finally:
        for c in (owner.http, other.http):
            await c.aclose()
        manager.services.sessions = None
        await proxy.aclose()


class OddModel(FakeModel):
    """A FAKE model server whose chat completions carry odd values where the proxy's checks
    do not look (created, reasoning, logprob entries): read into a Response, each must be
    dropped or replaced, never a 500."""

    def completion(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        reply = super().completion(body, message)
        choice = reply["choices"][0]
        reply["created"] = "yesterday"
        choice["message"]["reasoning_content"] = {"not": "text"}
        choice["logprobs"]["content"] = [
            {"token": 7, "logprob": -0.5, "bytes": ["x"]},
            {"token": "b", "logprob": -0.5, "bytes": [98]},
            {"token": "é", "logprob": -0.5},
        ]
        if body["messages"][-1]["content"] == "surrogate":
            choice["message"]["content"] = "\ud800"
        return reply


async def test_an_odd_upstream_reply_is_no_500() -> None:
    odd = OddModel([{"content": "hello"}])
    with odd.serve() as endpoint:
        async with door(endpoint) as (session, http, calls):
            body = VALID | {"include": ["message.output_text.logprobs"]}
            for stream in (False, True):
                reply = await http.post(RESPONSES, json=body | {"stream": stream})
                assert reply.status_code == 200, reply.text
            whole = spec.ResponseResource.model_validate(calls[0].response)
            assert whole.output[0].type == "message" and whole.created_at > 1_700_000_000
            text = whole.output[0].content[0]
            assert text.type == "output_text" and text.logprobs is not None
            assert [lp.bytes for lp in text.logprobs] == [[], [98], [195, 169]]
            assert session.fault is None
            # A reply no record can store (a lone surrogate escape): the model server's
            # fault (void), answered 502 in the harness's dialect, never a 500.
            bad = await http.post(RESPONSES, json={"model": "m", "input": "surrogate"})
            assert bad.status_code == 502 and refused_shape(bad).code == "upstream_failed"
            assert session.fault is not None and "cannot be recorded" in session.fault
