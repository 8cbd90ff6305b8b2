"""What the collector produces and the loss consumes: token-in/token-out trajectories.

A trajectory keeps the token ids exactly as they were generated and as the environment
turns were tokenized (each alone, appended), never a re-rendered chat: the trainer scores
the very tokens the generator sampled. `loss_mask` is 1 only on sampled tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from palaestra.sdk.hack_monitor import HackFlag

StopReason = Literal[
    "terminated",  # the environment ended the episode (submit, solved, out of attempts)
    "truncated",  # the server's step or wall-time limit ended it
    "max_turns",  # the collector's turn budget ran out; the episode was verified as is
    "max_tokens",  # the context budget ran out; verified as is
]


@dataclass(frozen=True)
class SamplingParams:
    """How one turn is sampled. `seed` makes a turn's draw independent of batching."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One turn from a backend: token ids, their logprobs, why it stopped, which weights."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    weight_version: int


@dataclass
class Trajectory:
    """One finished episode, ready for the loss.

    `completion_ids` holds every token after the prompt, model turns and environment turns
    alike; `loss_mask[i]` is 1 where `completion_ids[i]` was sampled; `logprobs[i]` is the
    generator's logprob of a sampled token (0.0 on environment tokens)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    task: str = ""
    seed: int = 0
    group_id: int = 0
    sample_id: int = 0
    episode_id: str = ""
    stop_reason: StopReason = "terminated"
    weight_versions: list[int] = field(default_factory=list)
    turns: int = 0
    generation_s: float = 0.0
    environment_s: float = 0.0
    advantage: float = 0.0
    # The episode's own verifier reward where another replaced `reward`: a group judge's
    # (sdk/train/group_rewards.py) or a pre-filter's drop (sdk/train/prefilter.py, audited).
    verifier_reward: float | None = None
    prefiltered: bool = False  # the pre-filter dropped it: reward 0, mostly never verified
    prefilter_score: float | None = None
    # The task's domain (the reset's info) and the reward-hack monitor's flags on the
    # episode's actions (sdk/hack_monitor.py): kept whole and trained on; a flag is a metric.
    domain: str = ""
    hack_flags: list[HackFlag] = field(default_factory=list)

    @property
    def weight_version(self) -> int:
        """The oldest weights that sampled any of its tokens (what staleness is measured by)."""
        return min(self.weight_versions) if self.weight_versions else 0

    def append_sampled(self, ids: list[int], logprobs: list[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} logprobs from the generator")
        self.completion_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs

    def append_environment(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def check(self) -> None:
        """Refuse a broken trajectory (the loss would silently mis-align)."""
        n = len(self.completion_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == n):
            raise ValueError("completion ids, loss mask and logprobs differ in length")
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward {self.reward} outside [0, 1]")


@dataclass
class Group:
    """G episodes of one task and seed (the unit GRPO's advantages are relative to): one
    trajectory each, or several for a harness episode whose context was edited."""

    group_id: int
    task: str
    seed: int
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        """One reward per episode: the samples of one harness episode (same non-empty
        `episode_id`, sdk/train/harness.py) share its reward and count once."""
        seen: dict[object, float] = {}
        for k, t in enumerate(self.trajectories):
            seen.setdefault(t.episode_id or k, t.reward)
        return list(seen.values())
