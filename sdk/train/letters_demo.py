"""The CPU training demo: a tiny randomly initialised transformer learns `palaestra/letters`.

Everything is built in code: a character tokenizer over the few characters the demo's
turns use, a 2-layer GPT-2 (transformers) with random weights, and a compact episode
format. A prompt is `<bos>1a` (shift, letter); the model samples one character (its
guess); a wrong guess gets the environment turn `+` or `-` (the answer is later or
earlier) and a refused one `!`, tokenized alone, appended and masked out of the loss.
`palaestra train` and tests/sdk/train/test_train_learning.py run this.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.train.backends import HFBackend
from palaestra.sdk.train.collector import CollectorConfig, RolloutCollector
from palaestra.sdk.train.formats import UnparseableAction
from palaestra.sdk.train.grpo import GRPOConfig
from palaestra.sdk.train.tokenizers import CharTokenizer
from palaestra.sdk.train.trainer import StepReport, Trainer
from palaestra.sdk.train.types import Group, SamplingParams

ALPHABET = "abcdefgh"
VOCAB = ALPHABET + "12+-!"
PACK = "palaestra/letters"


class LettersFormat:
    """The demo's compact turns (see the module doc); no stop token: one char a turn."""

    stop_token_ids: tuple[int, ...] = ()

    def __init__(self, tokenizer: CharTokenizer) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(self, reset: ResetResponse) -> list[int]:
        data = reset.observation.data
        text = f"{data['shift']}{data['letter']}"
        return [CharTokenizer.BOS, *self.tokenizer.encode(text)]

    def observation_ids(self, reply: StepResponse) -> list[int]:
        hint = reply.observation.data.get("hint")
        return self.tokenizer.encode("+" if hint == "later" else "-")

    def error_ids(self, message: str) -> list[int]:
        return self.tokenizer.encode("!")

    def parse_action(self, ids: list[int]) -> Action:
        text = self.tokenizer.decode(ids)
        if not text:
            raise UnparseableAction("no character sampled")
        return Action(tool="guess", arguments={"letter": text[0]})


def tiny_model(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """A 2-layer, 64-wide GPT-2 with random weights (about 0.1 M parameters)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    config._attn_implementation = "eager"
    model: torch.nn.Module = GPT2LMHeadModel(config)
    return model


def reward_shuffler(seed: int) -> Callable[[list[Group]], None]:
    """The control: permute rewards across a step's trajectories (no link to the actions)."""
    rng = random.Random(seed)

    def shuffle(groups: list[Group]) -> None:
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = [t.reward for t in trajectories]
        rng.shuffle(rewards)
        for traj, reward in zip(trajectories, rewards, strict=True):
            traj.reward = reward

    return shuffle


@dataclass
class DemoConfig:
    steps: int = 80
    groups_per_step: int = 16
    group_size: int = 8
    lr: float = 3e-3
    normalize_std: bool = True
    seed: int = 0
    concurrency: int = 64
    batch_routes: bool = True
    shuffle_rewards: bool = False
    domain: str = "next"


@dataclass
class Demo:
    trainer: Trainer
    collector: RolloutCollector
    backend: HFBackend
    tokenizer: CharTokenizer


def build_demo(client: AsyncClient, config: DemoConfig, tasks: Sequence[str] = ()) -> Demo:
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    tokenizer = CharTokenizer(VOCAB)
    model = tiny_model(tokenizer.vocab_size, config.seed)
    backend = HFBackend(model, pad_token_id=CharTokenizer.BOS)
    refs = list(tasks) or [f"{PACK}:{config.domain}-{c}" for c in ALPHABET]
    collector = RolloutCollector(
        client,
        backend,
        LettersFormat(tokenizer),
        refs,
        CollectorConfig(
            concurrency=config.concurrency,
            group_size=config.group_size,
            max_turns=4,
            batch_routes=config.batch_routes,
            sampling=SamplingParams(max_tokens=1),
        ),
        seed=config.seed,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    trainer = Trainer(
        model,
        optimizer,
        collector,
        backend,
        GRPOConfig(normalize_std=config.normalize_std),
        groups_per_step=config.groups_per_step,
        pad_token_id=CharTokenizer.BOS,
        reward_hook=reward_shuffler(config.seed) if config.shuffle_rewards else None,
    )
    return Demo(trainer, collector, backend, tokenizer)


async def run_demo(
    client: AsyncClient,
    config: DemoConfig,
    on_step: Callable[[StepReport], None] | None = None,
    stop: Callable[[list[StepReport]], bool] | None = None,
) -> list[StepReport]:
    demo = build_demo(client, config)
    try:
        return await demo.trainer.train(config.steps, on_step, stop)
    finally:
        await demo.backend.aclose()
