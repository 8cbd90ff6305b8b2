"""FakeModel: an agent's replies scripted on the fake model server (a fake, named so).

The real model server (sdk/train/openai_server.py over a tiny model) only produces
garbage or one fixed call; a harness test that needs a *sensible* agent (run `bash`, then
`submit`) scripts the replies here. Each reply is a chat message dict (`content`,
`tool_calls`), an int (answer that HTTP status) or a (status, message) pair (that status
with OpenAI's error body, e.g. `CONTEXT_TOO_LONG`). It records every request body. The
server is tests/peers/fake_model_server.py.
Token ids are made up per call (prompt: one id per message; completion: 1, 2, …) so a
proxy that asks for them gets some; they are not a tokenizer's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.peers.fake_model_server import FakeModelServer, Hit, error_reply
from tests.peers.fake_model_server import Reply as HttpReply
from tests.peers.fake_model_server import completion as openai_completion

Reply = dict[str, Any] | int | tuple[int, str]
# vLLM's answer to a prompt past --max-model-len (its message, word for word).
CONTEXT_TOO_LONG = (
    400,
    "This model's maximum context length is 2048 tokens. However, you requested 2310 "
    "tokens (2262 in the messages, 48 in the completion). Please reduce the length of the "
    "messages or completion.",
)


def bash_call(command: str, call_id: str = "call_bash") -> dict[str, Any]:
    """An assistant message calling `bash` with `command`."""
    arguments = json.dumps({"command": command})
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
    return {"content": None, "tool_calls": [call]}


def submit_call() -> dict[str, Any]:
    call = {
        "id": "call_submit",
        "type": "function",
        "function": {"name": "submit", "arguments": "{}"},
    }
    return {"content": None, "tool_calls": [call]}


class FakeModel:
    """Answers `replies` in order (the last one again once they run out)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def next_reply(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.append(body)
            return self.replies[min(len(self.requests), len(self.replies)) - 1]

    def completion(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        ids = list(range(1, 4))
        calls = message.get("tool_calls") or []
        prompt = list(range(100, 100 + len(body.get("messages", []))))
        reply = openai_completion(
            message.get("content"),
            body.get("model", "fake"),
            id=f"chatcmpl-fake-{len(self.requests)}",
            prompt_token_ids=prompt,
            usage={"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
        )
        choice = reply["choices"][0]
        choice["message"]["tool_calls"] = calls
        choice["finish_reason"] = "tool_calls" if calls else "stop"
        choice["token_ids"] = ids
        choice["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": -0.5} for i in ids]}
        return reply

    def answer(self, hit: Hit) -> HttpReply:
        if hit.method == "GET":  # /models
            return HttpReply(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        body = hit.body if isinstance(hit.body, dict) else {}
        reply = self.next_reply(body)
        if isinstance(reply, int):
            return error_reply(reply, "scripted failure")
        if isinstance(reply, tuple):
            return error_reply(*reply)
        return HttpReply(200, self.completion(body, reply))

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1 (a free port) while the block runs; yields the `/v1` base URL."""
        with FakeModelServer(self.answer) as server:
            yield server.url
