"""VLLMEngineBackend over a real `vllm.LLM` (run with the vllm peer venv's python).

    python vllm_engine.py RANDOM_MODEL_DIR TOOLS_MODEL_DIR

palaestra must be importable (the test puts it on PYTHONPATH). One engine for all checks:
generate with token-id prompts and logprobs, a GRPO batch from those generations against
the same weights in transformers, then `update_weights` with the tool-calling model's
weights must change what greedy decoding emits. Prints one JSON line of findings.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


async def checks(random_dir: str, tools_dir: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from palaestra.sdk.train.grpo import group_advantages, grpo_loss, make_batch, token_logprobs
    from palaestra.sdk.train.types import Group, SamplingParams, Trajectory
    from palaestra.sdk.train.vllm_engine import VLLMEngineBackend

    found: dict[str, Any] = {}
    started = time.monotonic()
    backend = VLLMEngineBackend(
        random_dir, dtype="bfloat16", max_model_len=512, max_num_seqs=8, seed=0, enforce_eager=True
    )
    found["load_s"] = round(time.monotonic() - started, 1)
    tokenizer = AutoTokenizer.from_pretrained(random_dir)
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say something"}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
    eos = int(tokenizer.eos_token_id)

    # Four concurrent requests: one micro-batch, seeded, so the same seed repeats exactly.
    sampled = [SamplingParams(max_tokens=12, temperature=1.0, seed=s) for s in (1, 2, 3, 1)]
    gens = await asyncio.gather(*(backend.generate(prompt, p) for p in sampled))
    found["batches"] = backend.batches
    found["lengths"] = [len(g.ids) for g in gens]
    found["logprob_lengths"] = [len(g.logprobs) for g in gens]
    found["logprobs_nonpositive"] = all(lp <= 1e-6 for g in gens for lp in g.logprobs)
    found["seed_repeats"] = gens[0].ids == gens[3].ids
    found["seeds_differ"] = len({tuple(g.ids) for g in gens[:3]}) > 1
    found["versions"] = [g.weight_version for g in gens]

    # A GRPO batch from these generations; the trainer's logprobs of the same tokens
    # (transformers, same weights) must match what vLLM reported for them.
    trajs = [
        Trajectory(prompt_ids=list(prompt), reward=float(i % 2), sample_id=i) for i in range(4)
    ]
    for traj, gen in zip(trajs, gens, strict=True):
        traj.append_sampled(gen.ids, gen.logprobs)
        traj.append_environment(tokenizer.encode("\nok\n", add_special_tokens=False))
    kept, zero = group_advantages([Group(0, "t", 0, trajs)])
    batch = make_batch(kept, pad_token_id=int(tokenizer.pad_token_id))
    trainer = AutoModelForCausalLM.from_pretrained(random_dir, torch_dtype=torch.float32)
    logprobs = token_logprobs(trainer, batch)
    loss, stats = grpo_loss(logprobs, batch)
    loss.backward()
    grads = [p.grad for p in trainer.parameters() if p.grad is not None]
    found["batch_shape"] = list(batch.input_ids.shape)
    found["mask_shape"] = list(batch.loss_mask.shape)
    found["mask_tokens"] = int(batch.loss_mask.sum())
    found["sampled_tokens"] = sum(len(g.ids) for g in gens)
    found["zero_variance_groups"] = zero
    found["loss_finite"] = bool(torch.isfinite(loss))
    found["has_grad"] = bool(grads) and any(float(g.abs().sum()) > 0 for g in grads)
    found["max_abs_logprob_diff"] = stats["max_abs_logprob_diff"]

    # Weight update: the tool-calling model's weights make greedy decoding emit its call.
    greedy = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(eos,))
    before = await backend.generate(prompt, greedy)
    tools = AutoModelForCausalLM.from_pretrained(tools_dir, torch_dtype=torch.bfloat16)
    await backend.update_weights(tools.state_dict(), version=1)
    after = await backend.generate(prompt, greedy)
    found["before"] = before.ids
    found["after"] = after.ids
    found["after_text"] = tokenizer.decode(after.ids)
    found["after_finish"] = after.finish_reason
    found["after_version"] = after.weight_version
    await backend.aclose()
    return found


if __name__ == "__main__":  # vLLM's engine core is a spawned process: the guard is needed
    print(json.dumps(asyncio.run(checks(sys.argv[1], sys.argv[2]))))
