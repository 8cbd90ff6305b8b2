"""ChatPolicy against a real OpenAI-compatible HTTP endpoint written here (loopback)."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from palaestra.sdk.evaluation.runner import run_eval
from palaestra.sdk.policies.chat import ChatPolicy
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from tests.hosts import local_host

WORD = re.compile(r"Submit the word '(\w+)'")


class FakeModel:
    """A scripted 'model': echo the word first, then submit it reversed."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path == "/garbage/chat/completions":
                    return self._send(200, b"this is not json", "text/plain")
                if self.path == "/nochoices/chat/completions":
                    return self._send(200, json.dumps({"id": "x", "object": "nothing"}).encode())
                if self.path != "/v1/chat/completions":
                    return self._send(404, b'{"error": "no such route"}')
                body = json.loads(raw)
                with model.lock:
                    model.requests.append(body)
                self._send(200, json.dumps(model.reply(body)).encode())
                return None

            def _send(self, status: int, data: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    @staticmethod
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        match = WORD.search(user)
        word = match.group(1) if match else ""
        tool_turns = [m for m in messages if m["role"] == "tool"]
        if not tool_turns:
            name, arguments, call_id = "echo", {"text": word}, "call_echo"
        else:
            name, arguments, call_id = "submit", {"answer": word[::-1]}, "call_submit"
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(arguments)},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    def __enter__(self) -> FakeModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    with FakeModel() as model:
        yield model


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_chat_policy_solves_echo_train(
    manager: EpisodeManager, fake_model: FakeModel
) -> None:
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks
    assert len(tasks) == 8
    policy = ChatPolicy(base_url=fake_model.url + "/v1", model="fake-1", api_key_env="NO_SUCH_KEY")
    attempts = await run_eval(client, policy, tasks, concurrency=4)
    assert [a.status for a in attempts] == ["ok"] * 8, [(a.task, a.error) for a in attempts]
    assert all(a.reward == 1.0 and a.passed for a in attempts)
    assert all(a.steps == 2 and a.tool_calls == 2 and a.tool_errors == 0 for a in attempts)
    assert all(a.stop == "terminated" for a in attempts)
    assert not local_host(manager)._live  # every episode was closed

    # Two requests per episode: the first (system + user) and one after the echo's result.
    assert len(fake_model.requests) == 16
    first = [r for r in fake_model.requests if not any(m["role"] == "tool" for m in r["messages"])]
    second = [r for r in fake_model.requests if any(m["role"] == "tool" for m in r["messages"])]
    assert len(first) == len(second) == 8
    for request in fake_model.requests:
        assert request["model"] == "fake-1"
        tools = {t["function"]["name"]: t for t in request["tools"]}
        assert set(tools) == {"echo", "submit"}
        for tool in request["tools"]:
            assert tool["type"] == "function"
            assert set(tool["function"]) == {"name", "description", "parameters"}
            assert tool["function"]["parameters"]["type"] == "object"
        assert "answer" in tools["submit"]["function"]["parameters"]["properties"]
    for request in first:
        roles = [m["role"] for m in request["messages"]]
        assert roles == ["system", "user"]
        assert WORD.search(request["messages"][1]["content"])
    for request in second:
        messages = request["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
        assistant, tool = messages[2], messages[3]
        assert assistant["tool_calls"][0]["id"] == "call_echo"
        assert tool["tool_call_id"] == "call_echo"
        word = WORD.search(messages[1]["content"])
        assert word is not None and tool["content"] == word.group(1)


async def test_unreachable_endpoint_is_an_error_not_a_crash(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks[:3]
    policy = ChatPolicy(base_url=f"http://127.0.0.1:{closed_port()}/v1", model="m", timeout_s=5)
    attempts = await run_eval(client, policy, tasks, k=2, concurrency=3)
    assert len(attempts) == 6
    for a in attempts:
        assert a.status == "error" and a.error_class == "endpoint_unreachable", a
        assert a.stop == "error" and a.reward == 0.0 and not a.passed
    assert not local_host(manager)._live  # the episodes were closed, not leaked
    # The server still serves.
    reset = await client.reset(tasks[0].id)
    reply = await client.step(reset.episode_id, {"tool": "submit", "arguments": {"answer": "x"}})
    assert reply.terminated


@pytest.mark.parametrize("route", ["garbage", "nochoices"])
async def test_garbage_reply_is_bad_model_output(
    manager: EpisodeManager, fake_model: FakeModel, route: str
) -> None:
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks[:2]
    policy = ChatPolicy(base_url=f"{fake_model.url}/{route}", model="m")
    attempts = await run_eval(client, policy, tasks, concurrency=2)
    assert len(attempts) == 2
    for a in attempts:
        assert a.status == "error" and a.error_class == "bad_model_output", a
        assert a.reward == 0.0
    assert not local_host(manager)._live


async def test_http_error_status_is_endpoint_error(
    manager: EpisodeManager, fake_model: FakeModel
) -> None:
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks[:1]
    policy = ChatPolicy(base_url=f"{fake_model.url}/missing", model="m")
    attempts = await run_eval(client, policy, tasks)
    assert attempts[0].status == "error" and attempts[0].error_class == "endpoint_error"
