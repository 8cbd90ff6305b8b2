"""`palaestra run --harness …` (cli/harness_run.py): bad options are told before any
episode starts; the report prints the verdict and one row per recorded model call. The
run against a real server and model is in tests/sdk/train/test_harness_training.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from palaestra.cli.console import console
from palaestra.cli.harness_run import report
from palaestra.sdk.harness import LLM_CALL_TOOL, LlmCall
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    Observation,
    StepRecord,
    Verdict,
    VerifierInfo,
)
from tests.conftest import BIN, cli_env, free_port


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "palaestra"), "run", "palaestra/echo@0.1.0:reverse-0", "--harness",
            "bash-agent", *args, "--data-dir", str(tmp_path / "d")]  # fmt: skip
    return subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=120)


def test_bad_harness_options_are_told(tmp_path: Path) -> None:
    missing = run(tmp_path=tmp_path)
    assert missing.returncode == 2 and "--harness needs --model-endpoint" in missing.stderr
    down = f"http://127.0.0.1:{free_port()}/v1"
    bad = run("--model-endpoint", down, "--model", "m", "--sampling", "{x", tmp_path=tmp_path)
    assert bad.returncode == 2 and "--sampling is not JSON" in bad.stderr
    listed = run("--model-endpoint", down, "--sampling", "[1]", tmp_path=tmp_path)
    assert listed.returncode == 2 and "pass --model NAME" in listed.stderr
    assert "Traceback" not in missing.stderr + bad.stderr + listed.stderr


def test_report_prints_the_verdict_and_the_calls() -> None:
    def call(index: int, prompt: list[int], completion: list[int]) -> StepRecord:
        c = LlmCall(index=index, api="openai-chat", request={}, response={},
                    prompt_token_ids=prompt, completion_token_ids=completion,
                    logprobs=[-1.0] * len(completion), finish_reason="tool_calls",
                    started_at=0.0, upstream_s=0.25, proxy_s=0.2625)  # fmt: skip
        info = {"llm_call": c.model_dump(mode="json")}
        return StepRecord(
            index=index, action=Action(tool=LLM_CALL_TOOL), observation=Observation(), info=info
        )

    end = StepRecord(
        index=2, action=Action(tool="harness_end"), observation=Observation(text="exited 0")
    )
    verdict = Verdict(reward=1.0, passed=True, verifier=VerifierInfo(name="unit", version="1"))
    now = time.time()
    records = [call(0, [1, 2], [3, 4, 5]), call(1, [1, 2, 3, 4, 5, 9], [7]), end]
    state = EpisodeState(episode_id="e", task="t", family="coding", status="done",
                         step_count=3, created_at=now, updated_at=now, verdict=verdict,
                         trajectory=records)  # fmt: skip
    with console.capture() as captured:
        report(state)
    out = captured.get()
    assert '"reward": 1.0' in out and "2 model calls" in out
    rows = [line for line in out.splitlines() if "openai-chat" in line]
    assert len(rows) == 2 and "0.250" in rows[0] and "12.5" in rows[0]  # proxy +12.5 ms
    assert "harness_end: exited 0" in out
    assert "1 training sample(s), 4 sampled tokens" in out
