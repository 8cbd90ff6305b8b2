"""sdk/train/openai_server.py as a real process on loopback, driven by palaestra's own
clients (`eval run --policy openai`, CompletionsBackend) and by raw OpenAI requests.

It serves the tool-calling tiny Qwen2 (tests/peers/tiny_models.py), whose greedy reply is
one hermes tool call, so the tool-calling path runs end to end with a real model.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.sdk.policies.spec import parse_policy
from palaestra.sdk.train.openai_server import parse_tool_calls
from palaestra.sdk.train.remote import CompletionsBackend
from palaestra.sdk.train.types import SamplingParams
from tests.conftest import BIN, cli_env, free_port
from tests.peers.tiny_models import TOOL_CALL, make_models

pytestmark = pytest.mark.slow

KEY = "sk-test-openai-server"
CACHE = Path(os.environ.get("PALAESTRA_CACHE", Path.home() / ".cache" / "palaestra"))
TOOLS = [{"type": "function", "function": {"name": "submit", "parameters": {"type": "object"}}}]


@contextmanager
def model_server(
    args: list[str], port: int, log: Path, env: dict[str, str] | None = None, wait_s: float = 120
) -> Iterator[str]:
    """Run a model server (`args`) on 127.0.0.1:`port` until `/health` is 200; its URL."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            assert proc.poll() is None, f"server exited:\n{log.read_text()[-5000:]}"
            assert time.monotonic() < deadline, f"server not ready:\n{log.read_text()[-5000:]}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = make_models(CACHE / "tiny-models")["tools"]
    port = free_port()
    log = tmp_path_factory.mktemp("hf-server") / "server.log"
    args = [sys.executable, "-m", "palaestra.sdk.train.openai_server", "--model", model,
            "--served-model-name", "tiny", "--port", str(port), "--api-key", KEY]  # fmt: skip
    with model_server(args, port, log) as url:
        yield url


def post(url: str, path: str, body: Any, key: str | None = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


def eval_with_tool_calls(base_url: str, tmp_path: Path, key: str | None = None) -> None:
    """`palaestra eval run --policy openai` on 2 echo tasks against `base_url`: each
    attempt makes the model's one tool call (submit "tiny") and gets its verdict."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [str(BIN / "palaestra"), "eval", "run", "--pack", "palaestra/echo@0.1.0",
         "--split", "train", "--limit", "2", "--policy", "openai",
         "--base-url", f"{base_url}/v1", "--model", "tiny", "--max-call-tokens", "16",
         "--api-key-env", "TINY_KEY", "--run-dir", str(run_dir),
         "--data-dir", str(tmp_path / "d")],
        env=cli_env(TINY_KEY=key or ""), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["policy"]["kind"] == "chat"  # `openai` names the chat kind
    attempts = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 2
    call = json.loads(TOOL_CALL)
    for a in attempts:
        assert a["status"] == "ok" and a["stop"] == "terminated", a
        assert a["reward"] == 0.0 and a["steps"] == 1  # "tiny" is not the reversed word
        action = a["trajectory"][0]["action"]
        assert action["tool"] == call["name"] and action["arguments"] == call["arguments"]


def test_policy_openai_calls_tools_on_the_hf_server(hf_server: str, tmp_path: Path) -> None:
    eval_with_tool_calls(hf_server, tmp_path, key=KEY)


def test_chat_reply_and_stream(hf_server: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    reply = post(hf_server, "/v1/chat/completions", body | {"logprobs": True}).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == json.loads(TOOL_CALL)["arguments"]
    assert len(choice["token_ids"]) == 4 == len(choice["logprobs"]["content"])
    assert reply["usage"]["prompt_tokens"] == len(reply["prompt_token_ids"])

    with httpx.stream(
        "POST", f"{hf_server}/v1/chat/completions", json=body | {"stream": True},
        headers={"authorization": f"Bearer {KEY}"}, timeout=60,
    ) as stream:  # fmt: skip
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    streamed = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert len(streamed) == 1 and streamed[0][0]["function"] == call["function"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    plain = post(hf_server, "/v1/chat/completions", body | {"tools": None}).json()
    assert plain["choices"][0]["message"]["tool_calls"] == []  # no tools offered: text only
    assert TOOL_CALL in plain["choices"][0]["message"]["content"]


def test_completions_backend_gets_token_ids(hf_server: str) -> None:
    prompt = [17, 230, 91, 405, 12, 88]

    async def go() -> tuple[Any, dict[str, Any]]:
        backend = CompletionsBackend(hf_server, "tiny", api_key=KEY)
        try:
            params = SamplingParams(max_tokens=5, temperature=1.0, seed=3)
            gen = await backend.generate(prompt, params)
            body = backend.request_body(prompt, params)
            raw = (await backend.http.post("/v1/completions", json=body)).json()
        finally:
            await backend.aclose()
        return gen, raw

    gen, raw = asyncio.run(go())
    choice = raw["choices"][0]
    assert choice["prompt_token_ids"] == prompt and gen.ids == choice["token_ids"]  # seeded
    assert gen.logprobs == choice["logprobs"]["token_logprobs"] and 0 < len(gen.ids) <= 5

    with httpx.stream(
        "POST", f"{hf_server}/v1/completions",
        json={"prompt": prompt, "max_tokens": 3, "stream": True, "logprobs": 0},
        headers={"authorization": f"Bearer {KEY}"}, timeout=60,
    ) as stream:  # fmt: skip
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert sum(len(c["choices"][0].get("token_ids", [])) for c in chunks) == 3


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
        ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"model": "tiny", "messages": []}, 400, "messages"),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_p": 0.5},
            400,
            None,
        ),
    ],
    ids=["n", "model", "no-messages", "top_p"],
)
def test_bad_requests_get_openai_errors(
    hf_server: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    reply = post(hf_server, "/v1/chat/completions", body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


def test_auth_and_bad_prompt_ids(hf_server: str) -> None:
    body = {"model": "tiny", "prompt": [1, 2]}
    assert post(hf_server, "/v1/completions", body, key=None).status_code == 401
    wrong = post(hf_server, "/v1/completions", body, key="sk-wrong")
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    huge = post(hf_server, "/v1/completions", {"prompt": [1, 10**6]})
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "prompt"
    long = post(hf_server, "/v1/completions", {"prompt": [1, 2], "max_tokens": 10**6})
    assert long.status_code == 400 and "context of 2048 tokens" in long.json()["error"]["message"]
    garbage = httpx.post(
        f"{hf_server}/v1/completions",
        content=b"{not json",
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert garbage.status_code == 400 and "not JSON" in garbage.json()["error"]["message"]


def test_parse_tool_calls() -> None:
    text = 'think <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> then'
    content, calls = parse_tool_calls(text + ' <tool_call>{"name": "b"}</tool_call>')
    assert content == "think  then"
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert json.loads(calls[1]["function"]["arguments"]) == {}
    broken = '<tool_call>{"name": "a", </tool_call>'
    assert parse_tool_calls(broken) == (broken, [])  # not JSON: left as the content
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[1] == []  # no name
    assert parse_tool_calls('<tool_call>{"name": "a", "arguments": [1]}</tool_call>')[1] == []


def test_openai_is_the_chat_policy_kind() -> None:
    spec = parse_policy("openai", base_url="http://127.0.0.1:9/v1", model="m")
    assert spec.kind == "chat" and spec.label == "chat:m@http://127.0.0.1:9/v1"
    assert spec == parse_policy("chat", base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ValueError, match="--policy openai needs the endpoint's base URL"):
        parse_policy("openai", model="m")
