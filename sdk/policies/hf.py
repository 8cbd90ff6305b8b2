"""A policy on a local Hugging Face transformers model (never downloaded), its tool calls
parsed out of the generated text."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.policies.base import PolicyError, Session, attempt_seed
from palaestra.sdk.policies.prompts import (
    SYSTEM_PROMPT,
    fallback_submit,
    openai_tools,
    parse_tool_call,
    render_observation,
)


@dataclass
class HFPolicy:
    """A local Hugging Face transformers causal LM (CPU or GPU), never downloaded.

    The prompt is the tokenizer's chat template over the conversation (with the tools,
    where the template takes them); the reply is parsed for a tool call. Generation runs
    in a worker thread, one at a time per model, seeded per attempt."""

    path: str
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    device: str = "cpu"
    system_prompt: str = SYSTEM_PROMPT
    name: str = "hf"
    _loaded: tuple[Any, Any] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def reset_options(self) -> dict[str, Any]:
        return {}

    def load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is None:
                try:
                    from transformers import AutoModelForCausalLM, AutoTokenizer
                except ImportError:
                    raise PolicyError(
                        "the hf policy needs transformers and torch: pip install "
                        "'palaestra[train]'",
                        "policy_error",
                    ) from None
                try:
                    tokenizer: Any = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
                    model: Any = AutoModelForCausalLM.from_pretrained(
                        self.path, local_files_only=True
                    )
                except (OSError, ValueError) as exc:
                    raise PolicyError(
                        f"cannot load a local transformers model from {self.path!r}: {exc}",
                        "policy_error",
                    ) from None
                model.to(self.device)
                model.eval()
                self._loaded = (tokenizer, model)
            return self._loaded

    async def start(self, reset: ResetResponse) -> Session:
        await asyncio.to_thread(self.load)
        return _HFSession(self, reset)

    def generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int
    ) -> tuple[str, int, int]:
        """(text, prompt tokens, completion tokens); blocking: run it in a thread."""
        import torch

        tokenizer, model = self.load()
        with self._lock:
            prompt = _chat_prompt(tokenizer, messages, tools)
            encoded = tokenizer(prompt, return_tensors="pt").to(self.device)
            torch.manual_seed(seed)
            sample = self.temperature > 0
            kwargs: dict[str, Any] = {
                "max_new_tokens": self.max_new_tokens,
                "do_sample": sample,
                "pad_token_id": tokenizer.pad_token_id
                if tokenizer.pad_token_id is not None
                else tokenizer.eos_token_id,
            }
            if sample:
                kwargs["temperature"] = self.temperature
            with torch.no_grad():
                out = model.generate(**encoded, **kwargs)
            prompt_len = int(encoded["input_ids"].shape[1])
            new = out[0][prompt_len:]
            text = tokenizer.decode(new, skip_special_tokens=True)
            return str(text), prompt_len, int(new.shape[0])


def _chat_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> str:
    if getattr(tokenizer, "chat_template", None):
        try:
            return str(
                tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=True
                )
            )
        except Exception:  # a template that rejects tools: render without them
            return str(
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


class _HFSession:
    def __init__(self, policy: HFPolicy, reset: ResetResponse) -> None:
        self.policy = policy
        self.reset = reset
        self.tools = openai_tools(reset.tools)
        tool_text = json.dumps([t["function"] for t in self.tools])
        self.messages: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": f"{policy.system_prompt}\nTools: {tool_text}\nAnswer with "
                '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.',
            },
            {"role": "user", "content": render_observation(reset.observation)},
        ]
        self.turn = 0
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    async def act(self, last: StepResponse | None) -> Action:
        if last is not None:
            self.messages.append({"role": "user", "content": render_observation(last.observation)})
        seed = (self.policy.seed * 1_000_003 + attempt_seed(self.reset)) * 1009 + self.turn
        self.turn += 1
        try:
            text, prompt, completion = await asyncio.to_thread(
                self.policy.generate, self.messages, self.tools, seed
            )
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"generation failed: {exc!r:.300}", "policy_error") from None
        self.usage["prompt_tokens"] += prompt
        self.usage["completion_tokens"] += completion
        self.messages.append({"role": "assistant", "content": text})
        return parse_tool_call(text) or fallback_submit(text, self.reset.tools)

    async def aclose(self) -> None:
        return None
