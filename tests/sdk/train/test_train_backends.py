"""Formats, tokenizers, the `palaestra train` command, and the wire shapes of the HTTP
backends (request bodies and replies as vLLM 0.11's OpenAI-compatible server sends them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="needs the `train` extra (torch)")

from palaestra.cli.main import app
from palaestra.sdk.models import Action, Observation, ResetResponse, StepResponse
from palaestra.sdk.train.formats import JSONToolFormat, UnparseableAction
from palaestra.sdk.train.remote import CompletionsBackend
from palaestra.sdk.train.tokenizers import CharTokenizer
from palaestra.sdk.train.types import SamplingParams, Trajectory


def test_char_tokenizer_round_trip_and_refuses_unknown() -> None:
    tok = CharTokenizer("ab+")
    assert tok.encode("ba+") == [2, 1, 3] and tok.decode([0, 2, 1, 3]) == "ba+"
    with pytest.raises(ValueError, match="not in"):
        tok.encode("c")
    with pytest.raises(ValueError, match="repeats"):
        CharTokenizer("aa")


def test_json_tool_format_tokenizes_environment_turns_alone() -> None:
    tok = CharTokenizer("".join(chr(c) for c in range(32, 127)) + "\n")
    fmt = JSONToolFormat(tok)
    reset = ResetResponse(
        episode_id="e", observation=Observation(text="hi"), tools=[], limits={}, info={}
    )
    prompt = fmt.prompt_ids(reset)
    reply = StepResponse(observation=Observation(text="out"))
    env = fmt.observation_ids(reply)
    assert tok.decode(env) == "<obs>out</obs>\n"
    assert tok.decode(prompt).endswith("<obs>hi</obs>\n")
    sampled = tok.encode('sure: {"tool": "submit", "arguments": {"answer": "x"}}\n')
    assert fmt.parse_action(sampled) == Action(tool="submit", arguments={"answer": "x"})
    with pytest.raises(UnparseableAction):
        fmt.parse_action(tok.encode("no json here"))
    # Appending keeps what was sampled and what the environment said apart.
    t = Trajectory(prompt_ids=prompt)
    t.append_sampled(sampled, [-0.5] * len(sampled))
    t.append_environment(env)
    assert t.loss_mask == [1] * len(sampled) + [0] * len(env)
    assert t.completion_ids == sampled + env
    t.reward = 2.0
    with pytest.raises(ValueError, match="reward"):
        t.check()


def test_completions_backend_wire_shapes() -> None:
    backend = CompletionsBackend("http://127.0.0.1:1", "m")
    body = backend.request_body([5, 6], SamplingParams(max_tokens=3, stop_token_ids=(2,), seed=7))
    assert body["prompt"] == [5, 6] and body["logprobs"] == 0
    assert body["return_tokens_as_token_ids"] is True and body["stop_token_ids"] == [2]
    reply = {
        "choices": [
            {
                "text": "ab",
                "finish_reason": "stop",
                "logprobs": {"tokens": ["token_id:9", "token_id:2"], "token_logprobs": [-0.1, -2]},
            }
        ]
    }
    gen = CompletionsBackend.parse(reply, 3)
    assert (gen.ids, gen.logprobs, gen.finish_reason, gen.weight_version) == (
        [9, 2],
        [-0.1, -2.0],
        "stop",
        3,
    )
    reply["choices"][0]["logprobs"]["tokens"] = ["a", "b"]  # type: ignore[index]
    with pytest.raises(ValueError, match="token_id"):
        CompletionsBackend.parse(reply, 3)


def test_palaestra_train_writes_a_reward_curve(tmp_path: Path) -> None:
    out = tmp_path / "curve.png"
    args = ["train", "--steps", "3", "--groups", "4", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["GRPO"]["steps"] == 3 and len(summary["GRPO"]["rewards"]) == 3
