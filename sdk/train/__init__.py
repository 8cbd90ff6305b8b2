"""The trainer adapter (DESIGN §7; extra `train`): rollouts, GRPO, generation backends.

- `collector.RolloutCollector`: N concurrent episodes over HTTP or in process, groups of
  G (same task and seed) with over-sampling and refill, deadlines, void/lost/429 handling;
- `types.Trajectory`: token-in/token-out (prompt ids, sampled and environment tokens, the
  loss mask, the generator's logprobs, weight versions, reward, timings);
- `grpo`: advantages, the clipped token-mean loss, truncated importance sampling (torch);
- `trainer.Trainer`: collect → update, synchronous or asynchronous with bounded staleness;
- `backends.HFBackend` (transformers), `vllm_engine.VLLMEngineBackend` (vLLM offline
  engine), `remote.CompletionsBackend` (vLLM/OpenAI server with token ids),
  `remote.ChatBackend` (chat endpoint, evaluation only);
- `openai_server`: an OpenAI-compatible server (chat, completions, tool calls, token ids)
  over `HFBackend`: `python -m palaestra.sdk.train.openai_server --model DIR`;
- `harness`: harness mode (docs/harness.md): the proxy's recorded model calls → samples
  (the context-edit rule), `HarnessCollector` (groups of harness episodes);
- `group_rewards`: a complete group judged together (`CollectorConfig.group_scorer`);
- `prefilter`: a cheap scorer of final answers before the verifier (`PreFilter`,
  `CallablePreFilter`; a judge one is `palaestra.verifiers.judge_prefilter.JudgePreFilter`);
- `letters_demo`: a tiny random transformer that learns `palaestra/letters` on a CPU.

See docs/training.md. Modules that need torch import it themselves; this package does not.
"""

from palaestra.sdk.train.collector import (
    CollectorConfig,
    EpisodeBroken,
    GroupCollector,
    RolloutCollector,
)
from palaestra.sdk.train.formats import EpisodeFormat, JSONToolFormat, UnparseableAction
from palaestra.sdk.train.harness import HarnessCollector, trajectories_from_calls
from palaestra.sdk.train.prefilter import CallablePreFilter, PreFilter, PreFilterReport
from palaestra.sdk.train.tokenizers import CharTokenizer, HFTokenizer, Tokenizer
from palaestra.sdk.train.types import Generation, Group, SamplingParams, Trajectory

__all__ = [
    "CallablePreFilter",
    "CharTokenizer",
    "CollectorConfig",
    "EpisodeBroken",
    "EpisodeFormat",
    "Generation",
    "Group",
    "GroupCollector",
    "HFTokenizer",
    "HarnessCollector",
    "JSONToolFormat",
    "PreFilter",
    "PreFilterReport",
    "RolloutCollector",
    "SamplingParams",
    "Tokenizer",
    "Trajectory",
    "UnparseableAction",
    "trajectories_from_calls",
]
