"""verl's own AgentLoopWorker runs palaestra's agent loop against a real palaestra server.

    verl_loop.py URL TOKEN TASK:ANSWER...

The model is a tiny randomly initialised Qwen2 built here with a byte-level tokenizer (no
downloads). verl's config comes from its package (hydra `ppo_trainer`), the loop from an
`agent_loop_config_path` file, as verl's workers load custom loops. The LLM server client
forces the tool calls (one `echo`, then `submit` with the answer given on the command line)
and scores them with the tiny model's real log-probabilities. Prints one JSON line per
trajectory's AgentLoopOutput fields, unpadded, and the episode ids; then a few GRPO steps
with verl's own advantage and policy loss on them, and how a row without a task and a row
on a sealed split are refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import verl
from hydra import compose, initialize_config_dir
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

HERE = Path(__file__).resolve().parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def tiny_model(where: Path) -> None:
    """A byte-level tokenizer with a Qwen-like chat template and a random tiny Qwen2."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL,
    )
    tok.add_tokens(TOOL_TOKENS)
    tok.chat_template = (HERE / "verl_chat_template.jinja").read_text()
    tok.save_pretrained(where)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(where)


class ForcedToolCalls(LLMServerClient):
    """Answers each generate call with the next forced tool call of the trajectory (found
    from the prompt), log-probabilities from the tiny model's forward pass."""

    def __init__(self, config: Any, model_dir: Path, answers: dict[str, str]) -> None:
        super().__init__(config)
        self.tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
        self.model = Qwen2ForCausalLM.from_pretrained(model_dir).eval()
        self.answers = answers
        self.calls = 0

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        self.calls += 1
        prompt = self.tok.decode(prompt_ids)
        word = next(w for w in self.answers if f"'{w}'" in prompt)
        if "<tool_response>" not in prompt:
            call = {"name": "echo", "arguments": {"text": word}}
        else:
            call = {"name": "submit", "arguments": {"answer": self.answers[word]}}
        text = f"Let me try.<tool_call>{json.dumps(call)}</tool_call><|im_end|>"
        ids = self.tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt_ids + ids])).logits[0]
        logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1].float(), dim=-1)
        chosen = logp.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
        return TokenOutput(token_ids=ids, log_probs=chosen, stop_reason="completed")


def train(out: DataProto, model_dir: Path, config: Any, steps: int = 3) -> dict[str, Any]:
    """A few GRPO steps on the rollouts with verl's own advantage and policy loss (the two
    trajectories are one group). Returns the losses, how far the fresh policy's log-probs
    are from the rollout's (the same weights: ~0 when tokens and masks line up), and how
    each trajectory's mean log-prob of its own tokens moved."""
    model = Qwen2ForCausalLM.from_pretrained(model_dir).train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = out.batch
    mask = b["response_mask"]
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        b["rm_scores"], mask, np.array(["group"] * len(out), dtype=object)
    )
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    width = b["responses"].shape[1]

    def log_probs() -> torch.Tensor:
        logits = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits[:, -width - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(2, b["responses"][..., None])[..., 0]

    def mean_own(logp: torch.Tensor) -> list[float]:
        return ((logp * mask).sum(1) / mask.sum(1)).tolist()

    losses, first = [], None
    for _ in range(steps):
        logp = log_probs()
        if first is None:
            first = logp.detach()
        loss, _ = loss_fn(
            old_log_prob=b["rollout_log_probs"],
            log_prob=logp,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=actor,
        )
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        last = log_probs()
    assert first is not None
    gap = ((first - b["rollout_log_probs"]).abs() * mask).max()
    moved = [a - z for a, z in zip(mean_own(last), mean_own(first), strict=True)]
    return {"losses": losses, "rollout_logprob_gap": float(gap), "own_logprob_moved": moved}


def main() -> None:
    url, token, *pairs = sys.argv[1:]
    torch.set_num_threads(1)
    tasks = [p.rsplit(":", 1)[0] for p in pairs]
    answers = {t.rsplit("say-", 1)[1]: a for t, a in (p.rsplit(":", 1) for p in pairs)}
    work = Path(tempfile.mkdtemp(prefix="verl-loop-"))
    tiny_model(work / "model")
    loops = work / "agent_loops.yaml"
    loops.write_text(
        "- name: palaestra\n  _target_: palaestra.sdk.integrations.verl.PalaestraAgentLoop\n"
    )
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={work / 'model'}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.prompt_length=1024",
                "actor_rollout_ref.rollout.response_length=512",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                "actor_rollout_ref.rollout.multi_turn.format=hermes",
                "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                f"+palaestra.url={url}",
                "+palaestra.token=${oc.env:PALAESTRA_TEST_TOKEN}",
            ],
        )
    os.environ["PALAESTRA_TEST_TOKEN"] = token
    server = ForcedToolCalls(config, work / "model", answers)
    worker = AgentLoopWorker(config, llm_client=server)
    n = len(tasks)
    batch = DataProto(
        non_tensor_batch={
            "raw_prompt": np.array(
                [[{"role": "system", "content": "You are a careful agent."}]] * n, dtype=object
            ),
            "extra_info": np.array([{"task": t} for t in tasks], dtype=object),
            "agent_name": np.array(["palaestra"] * n, dtype=object),
            "index": np.arange(n),
        },
        meta_info={"global_steps": 1, "validate": False},
    )
    out = asyncio.run(worker.generate_sequences(batch))
    tok = server.tok
    rows = []
    for i in range(n):
        attention = out.batch["attention_mask"][i]
        plen = out.batch["prompts"].shape[1]
        prompt = out.batch["prompts"][i][attention[:plen].bool()].tolist()
        keep = attention[plen:].bool()
        response = out.batch["responses"][i][keep].tolist()
        mask = out.batch["response_mask"][i][keep].tolist()
        rows.append(
            {
                "task": tasks[i],
                "episode_id": out.non_tensor_batch["episode_id"][i],
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": mask,
                "reward": float(out.batch["rm_scores"][i].sum()),
                "logprobs": len(out.batch["rollout_log_probs"][i][keep].tolist()),
                "num_turns": int(out.non_tensor_batch["__num_turns__"][i]),
                "model_text": tok.decode([t for t, m in zip(response, mask, strict=True) if m]),
                "env_text": tok.decode([t for t, m in zip(response, mask, strict=True) if not m]),
            }
        )
    refused = {}
    for name, extra in (("no_task", {}), ("sealed", {"task": "palaestra/echo:say-apple"})):
        bad = DataProto(
            non_tensor_batch={
                "raw_prompt": np.array([[]], dtype=object),
                "extra_info": np.array([extra], dtype=object),
                "agent_name": np.array(["palaestra"], dtype=object),
                "index": np.arange(1),
            },
            meta_info={"global_steps": 1, "validate": False},
        )
        try:
            asyncio.run(worker.generate_sequences(bad))
            refused[name] = "not refused"
        except Exception as exc:
            refused[name] = f"{type(exc).__name__}: {exc}"
    result = {
        "generate_calls": server.calls,
        "trajectories": rows,
        "refused": refused,
        "training": train(out, work / "model", config),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
