"""Infrastructure failures are masked out of training groups, never scored 0, and counted.

open-instruct found 5–15 % of samples lost to infrastructure had been trained on as zeros: a
policy then learns the host's faults, or (were voids 0-free but countable) to cause them. A
member whose episode failed for a reason the policy cannot cause (sdk/failures.py) is left out
of its group's statistics: resampled, or its whole group dropped (`InfrastructurePolicy`).
An agent's failure (an `ok` verdict with an agent kind) is trained on as the 0 it is.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from palaestra.sdk.failures import FailureKind, is_infrastructure

InfrastructurePolicy = Literal["drop_group", "resample"]
POLICIES: tuple[InfrastructurePolicy, ...] = ("drop_group", "resample")
KINDS = frozenset(kind.value for kind in FailureKind)
# EpisodeBroken reasons (sdk/train/collector.py) that are infrastructure failures: a void
# episode, one the server lost, a server error. The collector's own deadlines (turn_timeout,
# episode_timeout) are resampled as before, not counted here.
INFRASTRUCTURE_REASONS = ("void", "lost", "server_")


def failure_kind(info: dict[str, Any]) -> str | None:
    """The failure kind a terminal step's info names (None: none, or an older server)."""
    failure = info.get("failure")
    kind = failure.get("kind") if isinstance(failure, dict) else None
    return kind if kind in KINDS else None


class FailureCounts:
    """Failures counted into the collector's running `stats` and into this step's counts,
    which `take` hands the trainer (StepReport.failures)."""

    def __init__(self, stats: Counter[str]) -> None:
        self.stats = stats
        self.step: Counter[str] = Counter()

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] += n
        self.step[name] += n

    def agent(self, kind: str | None) -> None:
        """An episode that ended `ok` with an agent's failure: trained on as 0."""
        if kind is not None and not is_infrastructure(kind):
            self.count("agent_failures")
            self.count(f"agent:{kind}")

    def infrastructure(self, label: str) -> None:
        """A member lost to infrastructure (`label`: its kind, else the collector's reason)."""
        self.count("infra_failures")
        self.count(f"infra:{label}")
        self.count("masked")

    def group_dropped(self, finished: int) -> None:
        """drop_group: the group's `finished` members are masked with the failed one."""
        self.count("masked", finished)
        self.count("groups_dropped_infra")

    def take(self) -> dict[str, int]:
        """The counts since the last call: `infra_failures` (episodes ended by an
        infrastructure failure), `masked` (episodes left out of group statistics for one),
        `groups_dropped_infra`, `agent_failures` (trained on as 0), and each by kind
        (`infra:<kind>`, `agent:<kind>`)."""
        counts = {"infra_failures": 0, "masked": 0, **self.step}
        self.step.clear()
        return counts
