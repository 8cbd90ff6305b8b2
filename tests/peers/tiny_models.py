"""Tiny Qwen2 models written in code (no downloads), shared by the tests that need a model.

`python tiny_models.py DIR` (or `make_models(DIR)`) writes, once per version stamp:
- DIR/tiny-qwen2: a randomly initialised Qwen2 (hidden 256, 2 layers, vocab 1024, bf16)
  and a byte-level BPE tokenizer trained on stdlib sources, ChatML template with tools;
- DIR/tiny-qwen2-tools: the same shapes with weights set so that greedy decoding after the
  generation prompt emits one hermes tool call, `<tool_call>CALL</tool_call><|im_end|>`
  (CALL is TOOL_CALL below): its layers add nothing (o_proj and down_proj are zero), so the
  next token depends on the current one alone, and the embeddings chain the call's tokens.
Prints `{"random": DIR/tiny-qwen2, "tools": DIR/tiny-qwen2-tools}` as its last line.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import sys
import sysconfig
from pathlib import Path

STAMP = "tiny-qwen2 v1"
TOOL_CALL = '{"name": "submit", "arguments": {"answer": "tiny"}}'
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", TOOL_CALL]
TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")


def _tokenizer(out: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))[:60]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024 - len(SPECIAL) - len(PLAIN),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.add_tokens(PLAIN)
    fast.chat_template = TEMPLATE.read_text()
    fast.save_pretrained(out)
    return fast


def _model(out: Path, tokenizer: object, *, tool_caller: bool) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = tokenizer.convert_tokens_to_ids  # type: ignore[attr-defined]
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=vocab("<|endoftext|>"),
        eos_token_id=vocab("<|im_end|>"),
        pad_token_id=vocab("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    if tool_caller:
        text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
        chain = [prompt[-1], *(vocab(t) for t in ("<tool_call>", TOOL_CALL, "</tool_call>"))]
        chain.append(vocab("<|im_end|>"))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            embed, head = model.model.embed_tokens.weight, model.lm_head.weight
            for k, (current, following) in enumerate(itertools.pairwise(chain)):
                embed[current] = 0.0
                embed[current, k] = 1.0
                head[following] = 0.0
                head[following, k] = 10.0
    model.to(torch.bfloat16).save_pretrained(out)
    GenerationConfig(eos_token_id=config.eos_token_id, do_sample=False).save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]


def make_models(root: Path) -> dict[str, str]:
    """Write both tiny models under `root` (skipped when this version is there already)."""
    made = {"random": root / "tiny-qwen2", "tools": root / "tiny-qwen2-tools"}
    stamp = root / "tiny-models.stamp"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "tiny-models.lock", "w") as lock:  # test workers run side by side
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.is_file() and stamp.read_text() == STAMP):
            tokenizer = _tokenizer(root / "tokenizer")
            _model(made["random"], tokenizer, tool_caller=False)
            _model(made["tools"], tokenizer, tool_caller=True)
            stamp.write_text(STAMP)
    return {k: str(v) for k, v in made.items()}


if __name__ == "__main__":
    print(json.dumps(make_models(Path(sys.argv[1]))))
