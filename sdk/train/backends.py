"""Generation backends behind one protocol, and the Hugging Face transformers one.

`generate(prompt_ids, params) -> Generation` (sampled ids, their logprobs, finish reason,
the weight version that sampled them); `update_weights(state_dict, version)` where the
backend holds its own copy of the weights. Backends batch concurrent requests themselves
(`MicroBatcher`): while one batch runs, new requests queue and form the next one, so N
concurrent episodes keep an accelerator busy without the collector knowing about batches.

`token_exact` says whether `ids` are the very tokens sampled (HF, vLLM engine, vLLM server
with token ids). A chat backend re-tokenizes text: fine for evaluation, never for training
(the collector refuses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from palaestra.sdk.train.types import Generation, SamplingParams


@runtime_checkable
class GenerationBackend(Protocol):
    token_exact: bool

    @property
    def weight_version(self) -> int: ...

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation: ...


@runtime_checkable
class UpdatableBackend(GenerationBackend, Protocol):
    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None: ...


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]


class MicroBatcher:
    """Queue concurrent `generate` calls; run them `max_batch` at a time in a thread.

    Subclasses implement `run_batch` (blocking: torch or vLLM). A weight update takes the
    same lock as a batch, so no batch ever mixes two weight versions."""

    token_exact = True

    def __init__(self, max_batch: int = 256) -> None:
        self.max_batch = max_batch
        self.lock = threading.Lock()
        self._version = 0
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0
        self.batched_requests = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def set_weight_version(self, version: int) -> None:
        """For a backend that shares its model with the trainer (updated in place)."""
        with self.lock:
            self._version = version

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), params, loop.create_future())
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work(), name="palaestra-generate")
        assert self._wakeup is not None
        self._wakeup.set()
        return await request.future

    async def _work(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch = [r for r in self._pending[: self.max_batch] if not r.future.done()]
                del self._pending[: self.max_batch]
                if not batch:
                    continue
                try:
                    out = await asyncio.to_thread(self._locked_run, batch)
                except Exception as exc:
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    continue
                self.batches += 1
                self.batched_requests += len(batch)
                for request, generation in zip(batch, out, strict=True):
                    if not request.future.done():
                        request.future.set_result(generation)

    def _locked_run(self, batch: list[_Request]) -> list[Generation]:
        with self.lock:
            return self.run_batch([(r.prompt_ids, r.params) for r in batch], self._version)

    def run_batch(
        self, batch: list[tuple[list[int], SamplingParams]], version: int
    ) -> list[Generation]:
        raise NotImplementedError

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker


class HFBackend(MicroBatcher):
    """A transformers causal LM (CPU or GPU): batched, left-padded, KV-cached sampling.

    Each request draws from its own seeded generator (`params.seed`), so what a request
    samples does not depend on which batch it landed in. Logprobs are those of the
    distribution sampled from (logits / temperature), as the GRPO loss computes them.
    With `model` shared with the trainer (sync training), call `set_weight_version` after
    each update; with a copy (async training), `update_weights` loads new weights."""

    def __init__(self, model: Any, *, pad_token_id: int = 0, max_batch: int = 256) -> None:
        super().__init__(max_batch)
        self.model = model
        self.pad_token_id = pad_token_id

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        def load() -> None:
            with self.lock:
                self.model.load_state_dict(dict(state_dict))
                self._version = version

        await asyncio.to_thread(load)

    def run_batch(
        self, batch: list[tuple[list[int], SamplingParams]], version: int
    ) -> list[Generation]:
        import torch

        for _, params in batch:
            if params.top_p != 1.0:
                raise ValueError("HFBackend samples the full distribution; top_p must be 1.0")
        device = next(self.model.parameters()).device
        size = len(batch)
        width = max(len(p) for p, _ in batch)
        ids = torch.full((size, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((size, width), dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        temps = torch.tensor([max(p.temperature, 1e-6) for _, p in batch], device=device)
        greedy = [p.temperature == 0 for _, p in batch]
        gens = [
            torch.Generator().manual_seed(p.seed if p.seed is not None else random.getrandbits(63))
            for _, p in batch
        ]
        out_ids: list[list[int]] = [[] for _ in batch]
        out_lps: list[list[float]] = [[] for _ in batch]
        reasons: list[str | None] = [None] * size
        longest = max(p.max_tokens for _, p in batch)
        # transformers ≥ 5.2x names the KV cache `cache`; older releases `past_key_values`.
        cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else None
        cache_kw = cache_kw or "past_key_values"
        past: Any = None
        step_ids, step_pos = ids, positions
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for _ in range(longest):
                    out = self.model(
                        input_ids=step_ids,
                        attention_mask=mask,
                        position_ids=step_pos,
                        use_cache=True,
                        **{cache_kw: past},
                    )
                    past = getattr(out, cache_kw, None)
                    logits = out.logits[:, -1, :].float()
                    logp = torch.log_softmax(logits / temps[:, None], dim=-1)
                    draws = torch.stack([torch.rand((), generator=g) for g in gens]).to(device)
                    cdf = logp.exp().cumsum(-1)
                    token = (cdf < draws[:, None]).sum(-1).clamp(max=logits.shape[-1] - 1)
                    for row in range(size):
                        if greedy[row]:
                            token[row] = logits[row].argmax()
                    token_lp = logp.gather(-1, token[:, None])[:, 0]
                    for row, (_, params) in enumerate(batch):
                        if reasons[row] is not None:
                            continue
                        tok = int(token[row])
                        out_ids[row].append(tok)
                        out_lps[row].append(float(token_lp[row]))
                        if tok in params.stop_token_ids:
                            reasons[row] = "stop"
                        elif len(out_ids[row]) >= params.max_tokens:
                            reasons[row] = "length"
                    if all(r is not None for r in reasons):
                        break
                    step_ids = token[:, None]
                    step_pos = step_pos[:, -1:] + 1
                    mask = torch.cat(
                        [mask, torch.ones((size, 1), dtype=mask.dtype, device=device)], 1
                    )
        finally:
            self.model.train(was_training)
        return [
            Generation(
                ids=out_ids[row],
                logprobs=out_lps[row],
                finish_reason="stop" if reasons[row] == "stop" else "length",
                weight_version=version,
            )
            for row in range(size)
        ]
