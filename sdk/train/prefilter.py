"""A cheap pre-filter in front of the expensive verifier: drop clearly inferior answers.

When the policy's action is the final `submit`, a small scorer (a reward model, a cheap
judge) scores the answer first. Below `drop_below` the trajectory is kept with reward 0
and marked `prefiltered`, and the episode is closed without verifying: the verifier (a
test run, a large judge) is spared. A seeded share `audit_rate` of those drops is verified
anyway, so the collector can say how often the pre-filter agrees with the full verifier
(it says drop ⇔ the full reward is below `pass_reward`); an audited drop still trains as
a drop (reward 0), so auditing never changes what the policy learns from.

Kept answers are verified as always, and compared too: `agreement` is over every answer
whose full verdict is known (kept ones, and audited drops).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from palaestra.sdk.models import Action


@runtime_checkable
class PreFilter(Protocol):
    """A cheap scorer of a final answer: higher is better (any scale `drop_below` uses)."""

    async def score(self, task: str, text: str) -> float:
        """`task`: what the policy was asked (the public task only); `text`: its answer."""
        ...


class CallablePreFilter:
    """A reward model (or any function) as a pre-filter: `fn(task, text)`, sync or async."""

    def __init__(self, fn: Callable[[str, str], float | Awaitable[float]]) -> None:
        self.fn = fn

    async def score(self, task: str, text: str) -> float:
        out = self.fn(task, text)
        if not isinstance(out, int | float):
            out = await out
        return float(out)


def answer_text(action: Action) -> str:
    """The answer a `submit` carries: its `answer` argument, else its arguments as JSON."""
    answer = action.arguments.get("answer")
    if isinstance(answer, str):
        return answer
    return json.dumps(action.arguments, sort_keys=True)


@dataclass(frozen=True)
class Decision:
    """What the pre-filter said of one answer."""

    score: float
    drop: bool  # below drop_below
    audit: bool  # a drop chosen to be verified anyway

    @property
    def skip(self) -> bool:
        """Close the episode unverified."""
        return self.drop and not self.audit


@dataclass
class PreFilterReport:
    """The pre-filter's counts; `dropped_share` and `agreement` are what to watch."""

    scored: int = 0
    dropped: int = 0  # said drop (audited ones included)
    skipped: int = 0  # verifications spared
    audited: int = 0
    compared: int = 0  # answers whose full verdict is known
    agreed: int = 0

    @property
    def dropped_share(self) -> float:
        return self.dropped / self.scored if self.scored else 0.0

    @property
    def agreement(self) -> float | None:
        """Share of compared answers where drop ⇔ full reward < pass_reward (None: none)."""
        return self.agreed / self.compared if self.compared else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefilter_scored": self.scored,
            "prefilter_dropped": self.dropped,
            "prefilter_skipped": self.skipped,
            "prefilter_audited": self.audited,
            "prefilter_compared": self.compared,
            "prefilter_dropped_share": self.dropped_share,
            "prefilter_agreement": self.agreement,
        }


class PreFilterGate:
    """The collector's side of a pre-filter: decisions, seeded audits, the report."""

    def __init__(
        self,
        prefilter: PreFilter,
        *,
        drop_below: float,
        audit_rate: float = 0.0,
        pass_reward: float = 0.5,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= audit_rate <= 1.0:
            raise ValueError(f"audit_rate must be in [0, 1]; got {audit_rate}")
        self.prefilter = prefilter
        self.drop_below = drop_below
        self.audit_rate = audit_rate
        self.pass_reward = pass_reward
        self.seed = seed
        self.report = PreFilterReport()

    def _audited(self, key: tuple[object, ...]) -> bool:
        """Whether the drop of episode `key` is verified anyway: a draw seeded by the
        collector's seed and the episode, so a rerun audits the same episodes."""
        digest = hashlib.blake2b(repr((self.seed, "audit", *key)).encode(), digest_size=8)
        return random.Random(digest.digest()).random() < self.audit_rate

    async def decide(self, task: str, action: Action, key: tuple[object, ...]) -> Decision:
        score = await self.prefilter.score(task, answer_text(action))
        drop = score < self.drop_below
        decision = Decision(score=score, drop=drop, audit=drop and self._audited(key))
        self.report.scored += 1
        self.report.dropped += drop
        self.report.skipped += decision.skip
        self.report.audited += decision.audit
        return decision

    def settle(self, decision: Decision, reward: float) -> float:
        """Count the full verdict's agreement; the reward to train on (0 for a drop)."""
        self.report.compared += 1
        self.report.agreed += decision.drop == (reward < self.pass_reward)
        return 0.0 if decision.drop else reward
