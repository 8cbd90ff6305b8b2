"""`FakeUpstream`: a FAKE model server for the session proxy's tests
(tests/server/harness/test_harness_proxy.py,
tests/redteam/test_harness_proxy.py), for what a real one will not do on demand: answer
without token ids, fail with 5xx, 4xx or 429, answer slowly, redirect. It is a script of
the fake model server (tests/peers/fake_model_server.py, in a thread), which records every
request it gets, so a test can also prove a request never reached it. The mode is the first
path segment of the endpoint: `model_endpoint = f"{fake.url}/ok"` is served by POST
/ok/chat/completions.

Plus `gateway_on_loopback`: the proxy's gateway serving a loopback listener, as a
backend serves one inside a sandbox's network namespace.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from palaestra.sdk.harness import HarnessOptions
from palaestra.server.harness.proxy import SessionProxy
from tests.peers.fake_model_server import FakeModelServer, Hit, Reply

CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 16 tokens",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


def fake_reply(body: dict[str, Any], ids: bool = True) -> dict[str, Any]:
    """A chat completion as vLLM shapes it: 3 completion tokens, prompt ids by message."""
    prompt = [7, len(body.get("messages", [])), 9]
    completion = [11, 12, 13][: int(body.get("max_tokens") or 3)]
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "fake says hi", "tool_calls": []},
        "finish_reason": "stop" if len(completion) == 3 else "length",
        "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.5} for i in completion]},
    }
    reply: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": body.get("model", ""),
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(completion),
            "total_tokens": len(prompt) + len(completion),
        },
    }
    if ids:
        reply["prompt_token_ids"] = prompt
        choice["token_ids"] = completion
    return reply


def sleep_s(body: dict[str, Any]) -> float:
    """How long `slow` waits: the last message's text as seconds (the proxy sends on only
    OpenAI's fields), else 1 s."""
    try:
        return float(body["messages"][-1]["content"])
    except (LookupError, TypeError, ValueError):
        return 1.0


@dataclass
class FakeUpstream:
    """A FAKE OpenAI-compatible upstream (see the module docstring)."""

    redirect_to: str = ""
    hits: list[Hit] = field(default_factory=list)
    server: FakeModelServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None, "the fake upstream is not serving"
        return self.server.base

    def answer(self, hit: Hit) -> Reply:
        self.hits.append(hit)
        mode, _, rest = hit.path.removeprefix("/").partition("/")
        body = hit.body
        if rest != "chat/completions" or not isinstance(body, dict):
            return Reply(404, {"error": {"message": "no such route"}})
        if mode == "ok":
            return Reply(200, fake_reply(body))
        if mode == "noids":
            return Reply(200, fake_reply(body, ids=False))
        if mode == "e500":
            return Reply(500, "upstream exploded")
        if mode == "e400":
            return Reply(400, CONTEXT_ERROR)
        if mode == "e429":
            return Reply(429, {"error": {"message": "busy"}}, {"retry-after": "3"})
        if mode == "slow":
            return Reply(200, fake_reply(body), delay_s=sleep_s(body))
        if mode == "redirect":
            return Reply(307, headers={"location": self.redirect_to})
        if mode == "notjson":
            return Reply(200, "<html>hello</html>", content_type="text/html; charset=utf-8")
        return Reply(404, {"error": {"message": f"unknown mode {mode}"}})

    def __enter__(self) -> FakeUpstream:
        self.server = FakeModelServer(self.answer, suffix="").__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        if self.server is not None:
            self.server.__exit__()


def options(endpoint: str, model: str = "fake", **sampling: Any) -> HarnessOptions:
    return HarnessOptions(
        name="bash-agent", model_endpoint=endpoint, model=model, sampling=sampling
    )


@asynccontextmanager
async def gateway_on_loopback(proxy: SessionProxy, key: str) -> AsyncIterator[str]:
    """The proxy's gateway serving session `key` on a loopback listener: its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = await proxy.gateway.serve(sock, key)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await proxy.gateway.close(server)
