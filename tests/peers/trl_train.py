"""TRL's side: GRPOTrainer (trl 1.16.0) trains a tiny random Qwen2 for 2 real optimisation
steps on CPU, its rollouts palaestra episodes through sdk/integrations/trl.py.

The model and its byte-level tokenizer are built here (no downloads), the tokenizer with
TRL's own qwen3 chat template. A random model never emits a tool call, so generation is
steered by a logits processor that writes the calls (turn 1: echo `tryN`, turn 2: submit,
right for even N, wrong for odd, so a group's rewards differ; turn 3: end); TRL parses them,
runs the tools, appends the results and trains on the sampled tokens only.
Usage: trl_train.py URL TOKEN TASK. Last stdout line: JSON.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template

from palaestra.sdk.integrations.trl import environment_factory

LONGEST = [0]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.add_tokens(MARKUP)
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = qwen3_chat_template
    return tok


def tiny_model(vocab: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def call(name: str, arguments: dict[str, str]) -> str:
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{payload}\n</tool_call>"


class ScriptedTurns(LogitsProcessor):
    """Force each row's turn text, then EOS; the turn is read from the row's context."""

    def __init__(self, tok: PreTrainedTokenizerFast) -> None:
        self.tok = tok
        self.start = -1
        self.targets: list[list[int]] = []

    def plan(self, context: str, row: int) -> str:
        responses = context.count("<tool_response>")
        if responses == 0:
            return call("echo", {"text": f"try{row}"})
        if responses == 1:
            word = re.search(r"word '(\w+)'", context)
            tried = re.findall(r"try(\d+)", context)
            right = word is not None and tried and int(tried[-1]) % 2 == 0
            return call("submit", {"answer": word.group(1)[::-1] if right and word else "wrong"})
        return ""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> Any:
        if self.start < 0:
            self.start = input_ids.shape[1]
            contexts = self.tok.batch_decode(input_ids)
            eos = self.tok.convert_tokens_to_ids("<|im_end|>")
            self.targets = [
                [*self.tok.encode(self.plan(c, i), add_special_tokens=False), eos]
                for i, c in enumerate(contexts)
            ]
        t = input_ids.shape[1] - self.start
        LONGEST[0] = max(LONGEST[0], t)
        forced = torch.full_like(scores, float("-inf"))
        for row, target in enumerate(self.targets):
            forced[row, target[min(t, len(target) - 1)]] = 0.0
        return forced


class RecordingTrainer(GRPOTrainer):
    """GRPOTrainer, recording what each batch's rollouts were (the env-token mask above all)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[dict[str, Any]] = []

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        out: dict[str, Any] = super()._generate_and_score_completions(inputs)
        sampled = out["completion_mask"]
        tool_mask = out.get("tool_mask")
        env_tokens = 0 if tool_mask is None else int((sampled * (1 - tool_mask)).sum())
        model_tokens = int(sampled.sum()) if tool_mask is None else int((sampled * tool_mask).sum())
        self.batches.append(
            {
                "episodes": [env._episode for env in self.environments],
                "rewards": [env.get_reward() for env in self.environments],
                "env_tokens_masked": env_tokens,
                "model_tokens": model_tokens,
                "advantages": out["advantages"].tolist(),
            }
        )
        return out


def main() -> None:
    url, token, task = sys.argv[1:4]
    torch.set_num_threads(1)  # two threads on a shared 2-core machine mostly spin
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    original = model.generate

    def steered(*args: Any, **kwargs: Any) -> Any:
        return original(*args, logits_processor=LogitsProcessorList([ScriptedTurns(tok)]), **kwargs)

    model.generate = steered  # type: ignore[method-assign]
    row = {"prompt": [{"role": "user", "content": "Play the episode with the tools."}]}
    rows = [{**row, "task": task, "seed": i} for i in range(8)]
    args = GRPOConfig(
        output_dir="/tmp/trl-palaestra",
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=192,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-3,
        bf16=False,
        logging_steps=1,
        max_tool_calling_iterations=3,
    )
    env_class = environment_factory(url, "echo", token=token)
    trainer = RecordingTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        environment_factory=env_class,
    )
    before = [p.detach().clone() for p in model.parameters()]
    started = time.monotonic()
    result = trainer.train()
    seconds = time.monotonic() - started
    moved = sum(
        int(not torch.equal(a, b.detach())) for a, b in zip(before, model.parameters(), strict=True)
    )
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    print(
        json.dumps(
            {
                "steps": result.global_step,
                "train_s": round(seconds, 2),
                "tools": sorted(t.__name__ for t in trainer.tools),
                "env_class": env_class.__name__,
                "batches": trainer.batches,
                "grad_norms": [entry.get("grad_norm") for entry in logs],
                "tool_call_frequency": [entry.get("tools/call_frequency") for entry in logs],
                "params_changed": moved,
                "longest": LONGEST[0],
            }
        )
    )


if __name__ == "__main__":
    main()
