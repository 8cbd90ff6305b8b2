"""Bad input for `palaestra eval`: a server restarted mid-run, an unreachable model endpoint,
a model endpoint that answers garbage, limits hit; plus a local transformers model.

Real parts: `palaestra serve` on loopback (ServerProcess), a small HTTP server standing in
for a model endpoint, a tiny random GPT-2 built on disk here (no hub download)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess, cli_env, free_port

from palaestra.sdk.evaluation.attempt import AttemptLimits
from palaestra.sdk.evaluation.rundir import RunDir
from palaestra.sdk.evaluation.runner import run_eval
from palaestra.sdk.evaluation.suite import run_suite
from palaestra.sdk.http import AsyncHTTPClient
from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.policies.base import Session
from palaestra.sdk.policies.hf import HFPolicy
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from tests.hosts import local_host

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).parent / "palaestra")
WORD = re.compile(r"Submit the word '(\w+)'")


class EchoThenSubmit:
    """Echoes, waits, then submits the right answer: episodes stay open long enough to be
    cut by a server restart."""

    name = "echo-then-submit"

    def __init__(self, pause_s: float = 0.3) -> None:
        self.pause_s = pause_s

    def reset_options(self) -> dict[str, Any]:
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        match = WORD.search(reset.observation.text)
        assert match is not None
        return _EchoSession(match.group(1), self.pause_s)


class _EchoSession:
    def __init__(self, word: str, pause_s: float) -> None:
        self.word, self.pause_s, self.turn = word, pause_s, 0

    async def act(self, last: StepResponse | None) -> Action:
        self.turn += 1
        if self.turn == 1:
            return Action(tool="echo", arguments={"text": self.word})
        await asyncio.sleep(self.pause_s)
        return Action(tool="submit", arguments={"answer": self.word[::-1]})

    async def aclose(self) -> None:
        return None


async def test_server_restart_mid_run_then_resume(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "server-data").start()
    try:
        async with AsyncHTTPClient(server.url, token=server.token) as client:
            tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks
            run = RunDir.create(tmp_path / "run", {"k": 3})
            policy = EchoThenSubmit()
            finished: list[str] = []
            restart: list[asyncio.Task[None]] = []

            def bounce() -> None:
                server.stop()  # in-flight episodes are cut off mid-step
                server.start()  # same port, same data dir

            def tick(a: Any) -> None:
                finished.append(a.status)
                if len(finished) == 5 and not restart:
                    restart.append(asyncio.create_task(asyncio.to_thread(bounce)))

            first = await run_suite(client, policy, run, tasks, k=3, concurrency=4, on_attempt=tick)
            await restart[0]
            latest = run.latest()
            assert len(latest) == 24 and len(first) == 24  # every attempt has a line
            voids = [a for a in latest.values() if a.status == "void"]
            assert voids, "no attempt was in flight when the server went down"
            for a in voids:
                assert a.error_class in ("env_error", "server_unreachable"), a
                assert a.error and a.reward == 0.0
            oks = [a for a in latest.values() if a.status == "ok"]
            assert all(a.reward == 1.0 for a in oks)

            # Resume: only the void attempts run again; the others are not recomputed.
            lines_before = run.attempts_path.read_text()
            again = await run_suite(client, policy, run, tasks, k=3, concurrency=4)
            assert sorted(a.key for a in again) == sorted(a.key for a in voids)
            assert run.attempts_path.read_text().startswith(lines_before)
            final = run.latest()
            assert all(a.status == "ok" and a.reward == 1.0 for a in final.values())
            assert len(run.records()) == 24 + len(voids)  # the void lines stay, superseded
    finally:
        server.stop()


async def test_server_gone_stops_the_run_resumably(tmp_path: Path) -> None:
    """Nothing listens: no attempt is recorded as run, and the runner says so."""
    from palaestra.sdk.evaluation.suite import ServerGone
    from palaestra.sdk.models import TaskInfo

    url = f"http://127.0.0.1:{free_port()}"
    tasks = [TaskInfo(id="palaestra/echo@0.1.0:say-birch", family="echo", domain="d", split="t")]
    run = RunDir.create(tmp_path / "run", {"k": 1})
    async with AsyncHTTPClient(url) as client:
        with pytest.raises(ServerGone, match="unreachable for 1 s"):
            await run_suite(client, EchoThenSubmit(), run, tasks, k=1, server_patience_s=1)
    assert run.records() == []


# -- a model endpoint that is unreachable, or answers garbage -------------------------------------


class GarbageModel:
    """A local HTTP server on loopback that answers every chat completion with junk."""

    REPLIES = (
        (200, b"<html>502 bad gateway</html>", "text/html"),
        (200, b'{"choices": []}', "application/json"),
        (200, b'{"choices": [{"message": {"tool_calls": "nope"}}]}', "application/json"),
        (
            200,
            b'{"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}',
            "application/json",
        ),
    )

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                with model.lock:
                    status, body, kind = model.REPLIES[model.count % len(model.REPLIES)]
                    model.count += 1
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def garbage_model() -> Iterator[GarbageModel]:
    model = GarbageModel()
    try:
        yield model
    finally:
        model.close()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=120
    )


def test_chat_endpoint_unreachable_and_garbage_over_a_real_server(
    tmp_path: Path, server: ServerProcess, garbage_model: GarbageModel
) -> None:
    common = ("eval", "run", "--pack", "palaestra/echo", "--split", "train", "--limit", "4",
              "--url", server.url, "--data-dir", str(server.data_dir), "--model", "m")  # fmt: skip
    dead = f"http://127.0.0.1:{free_port()}/v1"
    result = _cli(*common, "--policy", "chat", "--base-url", dead, "--run-dir",
                  str(tmp_path / "dead"), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    stored = [
        json.loads(x) for x in (tmp_path / "dead" / "attempts.jsonl").read_text().splitlines()
    ]
    assert len(stored) == 4
    for a in stored:
        assert a["status"] == "error" and a["error_class"] == "endpoint_unreachable"
        assert dead in a["error"] and "--base-url" in a["error"]
    assert "endpoint_unreachable 4" in result.stdout

    result = _cli(*common, "--policy", garbage_model.url, "--run-dir", str(tmp_path / "junk"),
                  cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "junk" / "report.json").read_text())
    assert report["summary"]["attempts"] == 4 and report["summary"]["errors"] == 4
    assert report["process"]["failure_classes"] == {"bad_model_output": 4}
    assert report["header"]["policy"] == f"chat:m@{garbage_model.url}"
    assert report["header"]["server_version"] != "unknown"
    assert garbage_model.count == 4
    # the server is fine and every episode was closed
    with server.client() as http:
        assert http.tasks(pack="palaestra/echo").total == 10

    # A token without the eval scope on a sealed split: the run stops at once, clearly,
    # with nothing recorded as if the policy had failed; resuming with a good token works.
    made = httpx.post(f"{server.url}/v1/tokens", json={"scopes": ["train"]}, headers=server.headers)
    assert made.status_code in (200, 201), made.text
    sealed = ("eval", "run", "--pack", "palaestra/echo", "--split", "heldout", "--url",
              server.url, "--run-dir", str(tmp_path / "sealed"))  # fmt: skip
    result = _cli(*sealed, "--token", made.json()["token"], cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "eval" in result.stderr and "scope" in result.stderr, result.stderr
    assert (tmp_path / "sealed" / "attempts.jsonl").read_text() == ""
    result = _cli("eval", "resume", str(tmp_path / "sealed"), "--token", str(server.token),
                  cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "sealed" / "report.json").read_text())
    assert report["summary"]["attempts"] == 2 and report["summary"]["mean_reward"] == 1.0


# -- limits ------------------------------------------------------------------------------------


class Chatty:
    """Spends 40 tokens a turn and never submits; or hangs on its second turn."""

    def __init__(self, hang: bool = False) -> None:
        self.name = "chatty"
        self.hang = hang

    def reset_options(self) -> dict[str, Any]:
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        return _Chatty(self.hang)


class _Chatty:
    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    async def act(self, last: StepResponse | None) -> Action:
        if self.hang and last is not None:
            await asyncio.sleep(60)
        self.usage["prompt_tokens"] += 30
        self.usage["completion_tokens"] += 10
        return Action(tool="echo", arguments={"text": "hm"})

    async def aclose(self) -> None:
        return None


async def test_step_token_and_wall_limits(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks[:2]

    steps = await run_eval(client, Chatty(), tasks, limits=AttemptLimits(max_steps=3))
    for a in steps:
        assert a.status == "ok" and a.stop == "truncated" and a.steps == 3, a
        assert a.reward == 0.0 and a.tokens == 120

    tokens = await run_eval(client, Chatty(), tasks, limits=AttemptLimits(max_tokens=100))
    for a in tokens:
        assert a.stop == "token_limit" and a.error_class == "token_limit", a
        assert a.steps == 2 and a.tokens == 120 and a.status == "ok"
        assert "not sent" in a.trajectory[-1]["error"]

    wall = AttemptLimits(max_wall_s=0.2)
    timed = await run_eval(client, Chatty(hang=True), tasks, limits=wall)
    for a in timed:
        assert a.stop == "timeout" and a.error_class == "timeout", a
        assert a.status == "ok" and a.steps == 1 and "wall-time limit" in a.error
    assert not local_host(manager)._live


# -- a local transformers model -------------------------------------------------------------------


def _tiny_model(path: Path) -> None:
    """A random 2-layer GPT-2 and a word-level tokenizer, built and saved here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = 'submit echo the word in reverse order of its letters answer tool call { } : , "'
    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", *dict.fromkeys(words.split())])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="[EOS]", pad_token="[EOS]"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    tokenizer.save_pretrained(path)
    import torch

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(vocab), n_positions=4096, n_embd=32, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(path)


async def test_local_hf_model_policy(manager: EpisodeManager, tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the train extra (transformers) is not installed")
    _tiny_model(tmp_path / "tiny")
    client = AsyncInProcessClient(manager)
    tasks = (await client.tasks(pack="palaestra/echo", split="train")).tasks[:2]
    policy = HFPolicy(path=str(tmp_path / "tiny"), max_new_tokens=8, temperature=1.0)
    first = await run_eval(client, policy, tasks, k=2, limits=AttemptLimits(max_steps=2))
    for a in first:
        assert a.status == "ok", a  # random text is no tool call: it is submitted as the answer
        assert a.reward == 0.0 and a.tokens_completion > 0 and a.tokens_prompt > 0
        assert a.trajectory[0]["action"]["tool"] == "submit"
    again = await run_eval(client, policy, tasks, k=2, limits=AttemptLimits(max_steps=2))
    # fixed seeds: each attempt samples the same text again
    assert [a.trajectory[0]["action"] for a in again] == [a.trajectory[0]["action"] for a in first]
