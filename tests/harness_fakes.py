"""`FakeUpstream`: a FAKE model server for the session proxy's tests
(tests/server/harness/test_harness_proxy.py,
tests/redteam/test_harness_proxy.py), for what a real one will not do on demand: answer
without token ids, fail with 5xx, 4xx or 429, answer slowly, redirect. It is a real HTTP
server on loopback (uvicorn in a thread) that records every request it gets, so a test
can also prove a request never reached it. The mode is the first path segment of the
endpoint: `model_endpoint = f"{fake.url}/ok"` is served by POST /ok/chat/completions.

Plus `gateway_on_loopback`: the proxy's gateway serving a loopback listener, as a
backend serves one inside a sandbox's network namespace.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from palaestra.sdk.harness import HarnessOptions
from palaestra.server.harness.proxy import SessionProxy
from tests.conftest import free_port

CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 16 tokens",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: Any


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
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
        async def anything(path: str, request: Request) -> Response:
            raw = await request.body()
            try:
                body = await request.json() if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            self.hits.append(Hit("/" + path, dict(request.headers), body))
            mode, _, rest = path.partition("/")
            if rest != "chat/completions" or not isinstance(body, dict):
                return JSONResponse({"error": {"message": "no such route"}}, 404)
            if mode == "ok":
                return JSONResponse(fake_reply(body))
            if mode == "noids":
                return JSONResponse(fake_reply(body, ids=False))
            if mode == "e500":
                return Response("upstream exploded", 500)
            if mode == "e400":
                return JSONResponse(CONTEXT_ERROR, 400)
            if mode == "e429":
                return JSONResponse({"error": {"message": "busy"}}, 429, {"retry-after": "3"})
            if mode == "slow":
                await asyncio.sleep(sleep_s(body))
                return JSONResponse(fake_reply(body))
            if mode == "redirect":
                return Response(status_code=307, headers={"location": self.redirect_to})
            if mode == "notjson":
                return Response("<html>hello</html>", 200, media_type="text/html")
            return JSONResponse({"error": {"message": f"unknown mode {mode}"}}, 404)

        return app

    def __enter__(self) -> FakeUpstream:
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            assert time.monotonic() < deadline, "the fake upstream did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


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
