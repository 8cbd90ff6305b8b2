"""Tinker-style trainers: tinker-cookbook 0.6.1's own rollout loop, tool-use env, renderer
and training-data path drive palaestra episodes through sdk/integrations/tinker.py, in a
venv of its own (tests/peers/tinker_rollouts.py), against a real `palaestra serve`.

No Tinker service is reachable: the policy is the program's `ScriptedPolicy`, a local
`TokenCompleter` stand-in for the cookbook's `TinkerTokenCompleter` (scripted tool calls,
encoded with the tiny ChatML tokenizer of tests/peers/tiny_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ServerProcess
from tests.peers import peer_python, run_peer
from tests.peers.our_side import sdk_env, train_token
from tests.peers.tiny_models import make_models
from tests.sdk.train.test_openai_server import CACHE

pytestmark = pytest.mark.slow

# tinker-cookbook itself goes in by tests/peers/tinker.post (--no-deps: see there why).
TINKER = (
    "torch==2.13.0",
    "tinker==0.38.0",
    "transformers==5.24.0",
    *("aiohttp", "anyio", "blobfile", "chz", "cloudpickle", "datasets", "huggingface-hub"),
    *("numpy", "pillow", "pyrage", "rich", "safetensors", "termcolor", "tiktoken", "tqdm"),
    "httpx==0.28.1",
    "pydantic==2.14.4",
)


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def test_tinker_cookbook_rollouts_drive_palaestra_episodes(
    server: ServerProcess, tmp_path: Path
) -> None:
    python = peer_python("tinker", *TINKER)
    tokenizer = make_models(CACHE / "tiny-models")["random"]
    token = train_token(server, "tinker")
    out = run_peer(
        python, "tinker_rollouts.py", server.url, token, str(tokenizer), env=sdk_env(tmp_path)
    )

    # Four turns: echo, a call the server refuses, a tool the env lacks, the answer.
    multi = out["multi"]
    assert multi["total_rewards"] == [1.0, 1.0]
    for trajectory in multi["trajectories"]:
        assert trajectory["rewards"] == [0.0, 0.0, 0.0, 1.0]
        assert trajectory["done"] == [False, False, False, True]
        assert trajectory["stop_reason"] == "tool_stopped"
        assert trajectory["metrics"]["palaestra/passed"] == 1.0
        assert trajectory["metrics"]["palaestra/steps"] == 2  # echo and submit; no others
        said = [log.get("tool_result_0", "") for log in trajectory["logs"]]
        assert said[0] == "hello"
        assert said[1].startswith("error: ") and "txt" in said[1]  # the server's reason
        assert "teleport" in said[2] and "not found" in said[2]  # the cookbook's own answer
    first = out["first_prompt"]
    assert "'birch'" in first and '"name": "submit"' in first  # observation and tool specs
    assert "<tool_response>\nhello\n</tool_response>" in out["last_prompt"]

    # GRPO over a group with one right and one wrong answer, then the cookbook's datums.
    assert sorted(out["mixed"]["total_rewards"]) == [0.0, 1.0]
    assert sorted(out["advantages"]) == [-0.5, 0.5]
    for datum in out["datums"]:
        mask, logprobs = datum["mask"], datum["logprobs"]
        sampled = [lp for m, lp in zip(mask, logprobs, strict=True) if m == 1.0]
        assert sampled and all(lp == -0.25 for lp in sampled)  # the policy's own tokens
        assert mask.count(0.0) > mask.count(1.0)  # the prompt's tokens: never trained on
        assert {abs(a) for a, m in zip(datum["advantages"], mask, strict=True) if m} == {0.5}

    silent = out["silent"]["trajectories"][0]
    assert silent["stop_reason"] == "completed" and silent["rewards"] == [0.0]

    dataset = out["dataset"]
    assert dataset["len"] == 3 and [len(b) for b in dataset["batches"]] == [3, 3, 2]
    assert dataset["batches"][0][0].endswith(":say-birch")
    assert "batch 3 of 3" in out["past_the_end"]
    built = out["dataset_builder"]  # PalaestraDatasetBuilder, the cookbook's RLDatasetBuilder
    assert [len(b) for b in built["train"]] == [4, 4] and built["group_size"] == 4
    assert [[t.rsplit(":", 1)[1] for t in b] for b in built["test"]] == [["say-apple", "say-fjord"]]
    assert out["sealed"].startswith("PermissionDeniedError") and "sealed" in out["sealed"]
    assert "elppa" not in out["sealed"]
