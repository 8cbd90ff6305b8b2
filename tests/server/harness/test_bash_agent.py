"""The built-in bash agent (server/harness/programs/bash_agent.py) outside a sandbox, in
tmp_path, on a stdlib-only python (`-I -S`): against FakeModel (a scripted OpenAI server,
a fake) for the loop's rules, and against the real OpenAI-compatible server over HFBackend
with the tiny models (tests/peers/tiny_models.py) for garbage and a real tool call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.peers.fake_model import FakeModel, bash_call, submit_call

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "server" / "harness" / "programs" / "bash_agent.py"


def run_agent(
    base_url: str, cwd: Path, *extra: str, model: str = "fake", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    instruction = cwd / "instruction.md"
    instruction.write_text("Write hi into out.txt, then submit.")
    env = {"PATH": "/usr/bin:/bin", "OPENAI_BASE_URL": base_url, "OPENAI_MODEL": model}
    argv = [sys.executable, "-I", "-S", str(AGENT), "--instruction-file", str(instruction)]
    return subprocess.run(
        [*argv, *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def test_bash_then_submit(tmp_path: Path) -> None:
    fake = FakeModel([bash_call("echo hi > out.txt && cat out.txt && pwd"), submit_call()])
    with fake.serve() as url:
        done = run_agent(url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_text() == "hi\n"
    first, second = fake.requests
    assert first["model"] == "fake"
    assert [t["function"]["name"] for t in first["tools"]] == ["bash", "submit"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert "out.txt" in first["messages"][1]["content"]  # the instruction file's text
    assert tool_results(second) == [f"exit status 0\nhi\n{tmp_path}\n"]
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_bash"
    assert second["messages"][3]["tool_call_id"] == "call_bash"


def test_hermes_text_reply_counts_as_a_tool_call(tmp_path: Path) -> None:
    text = '<tool_call>{"name": "bash", "arguments": {"command": "touch made"}}</tool_call>'
    fake = FakeModel([{"content": text}, {"content": '<tool_call>{"name": "submit"}</tool_call>'}])
    with fake.serve() as url:
        done = run_agent(url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "made").exists()
    assert tool_results(fake.requests[1])[0].startswith("exit status 0")


def test_timeout_truncation_and_bad_arguments(tmp_path: Path) -> None:
    garbage = {"id": "g", "type": "function", "function": {"name": "bash", "arguments": "{no"}}
    unknown = {"id": "u", "type": "function", "function": {"name": "rm_rf", "arguments": "{}"}}
    fake = FakeModel(
        [
            bash_call("sleep 30; echo late"),
            bash_call("head -c 5000 /dev/zero | tr '\\0' x; exit 3"),
            {"content": None, "tool_calls": [garbage, unknown]},
            bash_call("yes flood"),  # floods its output until the timeout
            bash_call("sleep 4 & echo started"),  # leaves a process holding the output
            submit_call(),
        ]
    )
    with fake.serve() as url:
        done = run_agent(url, tmp_path, "--command-timeout", "0.5", "--output-limit", "100")
    assert done.returncode == 0, done.stderr
    [slow] = tool_results(fake.requests[1])
    assert slow.startswith("timed out after 0.5 s") and "late" not in slow
    big = tool_results(fake.requests[2])[1]
    assert big.startswith("exit status 3\n" + "x" * 100 + "\n[output truncated: 5000 bytes")
    bad, odd = tool_results(fake.requests[3])[2:]
    assert "not JSON" in bad and "unknown tool 'rm_rf'" in odd
    flood = tool_results(fake.requests[4])[-1]
    assert flood.startswith("timed out after 0.5 s") and "characters shown]" in flood
    assert len(flood) < 300
    assert tool_results(fake.requests[5])[-1] == "exit status 0\nstarted\n"


def test_stops_at_max_turns(tmp_path: Path) -> None:
    fake = FakeModel([bash_call("true")])  # a runaway: bash forever
    with fake.serve() as url:
        done = run_agent(url, tmp_path, "--max-turns", "3")
    assert done.returncode == 1 and "out of turns (3)" in done.stderr
    assert len(fake.requests) == 3


def test_no_tool_call_nudges_once_then_stops(tmp_path: Path) -> None:
    fake = FakeModel([{"content": "I think I am done."}])
    with fake.serve() as url:
        done = run_agent(url, tmp_path)
    assert done.returncode == 1 and "no tool call" in done.stderr
    assert len(fake.requests) == 2
    assert fake.requests[1]["messages"][-1]["content"].startswith("Your reply had no tool call")


def test_endpoint_errors_exit_non_zero_with_the_message(tmp_path: Path) -> None:
    fake = FakeModel([bash_call("true"), 503])
    with fake.serve() as url:
        done = run_agent(url, tmp_path)
    assert done.returncode == 2 and "HTTP 503" in done.stderr and "scripted failure" in done.stderr
    down = run_agent(f"http://127.0.0.1:{free_port()}/v1", tmp_path)
    assert down.returncode == 2 and "could not be reached" in down.stderr
    assert "Traceback" not in done.stderr + down.stderr


@pytest.fixture(scope="module")
def tiny_servers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers", reason="needs the `train` extra")
    from contextlib import ExitStack

    from tests.peers.tiny_models import make_models
    from tests.sdk.train.test_openai_server import CACHE, model_server

    models = make_models(CACHE / "tiny-models")
    log_dir = tmp_path_factory.mktemp("tiny-servers")
    with ExitStack() as stack:
        urls = {}
        for kind in ("random", "tools"):
            port = free_port()
            args = [sys.executable, "-m", "palaestra.sdk.train.openai_server", "--model",
                    models[kind], "--served-model-name", "tiny", "--port", str(port)]  # fmt: skip
            urls[kind] = stack.enter_context(model_server(args, port, log_dir / f"{kind}.log"))
        yield urls


@pytest.mark.slow
def test_real_model_garbage_does_not_crash_the_agent(
    tiny_servers: dict[str, str], tmp_path: Path
) -> None:
    url = tiny_servers["random"] + "/v1"
    done = run_agent(url, tmp_path, "--max-turns", "4", "--max-tokens", "48", model="tiny")
    assert done.returncode == 1, done.stderr  # garbage: no tool call, nudged, stopped
    assert "no tool call" in done.stderr and "Traceback" not in done.stderr
    once = run_agent(url, tmp_path, "--max-turns", "1", "--max-tokens", "8", model="tiny")
    assert once.returncode == 1 and "out of turns (1)" in once.stderr, once.stderr


@pytest.mark.slow
def test_real_model_tool_call_submits(tiny_servers: dict[str, str], tmp_path: Path) -> None:
    # The tool-calling tiny model's greedy reply is one hermes `submit` call.
    done = run_agent(tiny_servers["tools"] + "/v1", tmp_path, model="tiny")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the agent prints nothing on success
