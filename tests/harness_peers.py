"""Shared pieces of the harness episode tests (tests/server/harness/test_harness_episodes.py and
tests/redteam/test_harness_redteam.py): the real model server that records what it
generated, a scripted upstream without token ids (a fake), and reset/wait helpers."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ServerProcess, free_port
from tests.peers.fake_model import FakeModel
from tests.peers.tiny_models import make_models
from tests.sdk.train.test_openai_server import CACHE, model_server
from tests.servers import scaled

PEER = Path(__file__).resolve().parent / "peers" / "recording_model_server.py"
TRAIN_TASK = "openai/humaneval:HumanEval-2"  # truncate_number: `return number % 1.0`
SEALED_TASK = "openai/humaneval:HumanEval-0"  # has_close_elements, on the sealed split
SOLVE_2 = (
    "printf 'def truncate_number(number: float) -> float:\\n"
    "    return number %% 1.0\\n' > solution.py"
)
SOLVE_0 = (
    "printf 'def has_close_elements(numbers, threshold):\\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
    " for b in numbers[i + 1:])\\n' > solution.py"
)


class RecordingModel:
    """The real model server over HFBackend (a tiny model), with the ids it generated."""

    def __init__(self, url: str, record: Path, name: str) -> None:
        self.url, self.record, self.name = url, record, name

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1"

    def generated(self) -> list[dict[str, list[int]]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]


@contextmanager
def recording_model(tmp: Path, which: str = "tools") -> Iterator[RecordingModel]:
    model = make_models(CACHE / "tiny-models")[which]
    port, record = free_port(), tmp / "generated.jsonl"
    args = [sys.executable, str(PEER), "--model", model, "--served-model-name", "tiny",
            "--port", str(port), "--record", str(record)]  # fmt: skip
    with model_server(args, port, tmp / "model.log") as url:
        yield RecordingModel(url, record, "tiny")


class NoIdsModel(FakeModel):
    """A scripted upstream (a fake) whose replies carry no token ids: what a server that
    cannot give them (a hosted API, vLLM too old) answers."""

    def completion(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        reply = super().completion(body, message)
        reply.pop("prompt_token_ids", None)
        for choice in reply["choices"]:
            choice.pop("token_ids", None)
            choice["logprobs"] = None
        return reply


def harness(endpoint: str, name: str = "bash-agent", **extra: Any) -> dict[str, Any]:
    return {"name": name, "model_endpoint": endpoint, "model": "tiny", **extra}


def reset(
    server: ServerProcess, token: str, task: str, option: Any, **options: Any
) -> httpx.Response:
    body = {"task": task, "options": {"harness": option, **options}}
    return httpx.post(
        f"{server.url}/v1/episodes",
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=120,
    )


def call(server: ServerProcess, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=180, **kw)


def started(server: ServerProcess, token: str, task: str, option: Any, **options: Any) -> str:
    reply = reset(server, token, task, option, **options)
    assert reply.status_code == 200, reply.text
    assert reply.json()["info"]["harness"]["state"] == "running"
    episode: str = reply.json()["episode_id"]
    return episode


def finished(server: ServerProcess, token: str, episode: str) -> dict[str, Any]:
    """Verify (which waits for the harness) and the episode's state with its trajectory."""
    verdict = call(server, token, "POST", f"/v1/episodes/{episode}/verify")
    assert verdict.status_code == 200, verdict.text
    state = call(server, token, "GET", f"/v1/episodes/{episode}")
    assert state.status_code == 200, state.text
    doc: dict[str, Any] = state.json()
    assert doc["verdict"] == verdict.json()
    return doc


def wait_calls(server: ServerProcess, token: str, episode: str, calls: int) -> dict[str, Any]:
    """The episode's state once `calls` model calls are answered and recorded (the proxy
    counts a call when it sends it upstream, and records it when the answer is back)."""
    deadline = time.monotonic() + scaled(60)
    while True:
        doc: dict[str, Any] = call(server, token, "GET", f"/v1/episodes/{episode}").json()
        if doc["harness"] is not None and len(llm_calls(doc)) >= calls:
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(0.1)


def llm_calls(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [s["info"]["llm_call"] for s in state["trajectory"] if s["action"]["tool"] == "llm_call"]


def ending(state: dict[str, Any]) -> dict[str, Any]:
    last: dict[str, Any] = state["trajectory"][-1]
    assert last["action"]["tool"] == "harness_end", last
    return last
