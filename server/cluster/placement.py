"""Placement: what an episode needs of a node, what each worker offers, and which worker takes it.

An episode needs the CPUs and memory of its sandbox spec and the node labels its family
names (`Family.node_labels`, e.g. `bpy`) plus the sandbox backend's when that is not bwrap
(`docker`). A worker offers its node's labels and resources (Ray's node table) and a fixed
number of episode slots (`palaestra_episodes` resource, else `ray_node_episodes`). A front
tries the workers that can host the episode, the freest first; a worker refuses a reset it
has no room for (`worker_full`), and only when every capable worker refuses is it a 429.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from palaestra.envs.base import Family
from palaestra.sdk.errors import CapacityError, UnavailableError
from palaestra.sdk.task import Task
from palaestra.server.config import Settings

SLOTS_RESOURCE = "palaestra_episodes"
WORKER_FULL = "worker_full"
FALSE_LABELS = frozenset({"", "0", "false", "no"})


@dataclass(frozen=True)
class Needs:
    cpus: float = 0.0
    memory_mb: float = 0.0
    labels: frozenset[str] = frozenset()

    @classmethod
    def of(cls, family: Family, task: Task, settings: Settings) -> Needs:
        spec = family.sandbox_spec(task)
        labels = set(family.node_labels(task))
        if settings.sandbox != "bwrap":
            labels.add(settings.sandbox)
        if spec is None:
            return cls(labels=frozenset(labels))
        return cls(float(spec.cpus), float(spec.memory_mb), frozenset(labels))

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory_mb": self.memory_mb, "labels": sorted(self.labels)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Needs:
        return cls(float(data["cpus"]), float(data["memory_mb"]), frozenset(data["labels"]))


@dataclass
class WorkerInfo:
    """A worker as its last report showed it (`EpisodeWorker.info`)."""

    name: str
    node: str
    host: str
    port: int
    key: str  # hex of the episode channel's key
    labels: dict[str, str] = field(default_factory=dict)
    slots: int = 0
    cpus: float = 0.0
    memory_mb: float = 0.0
    live: int = 0
    reserved_cpus: float = 0.0
    reserved_memory_mb: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def has_labels(self, wanted: frozenset[str]) -> bool:
        return all(self.labels.get(label, "").lower() not in FALSE_LABELS for label in wanted)

    def could_ever_host(self, needs: Needs, overcommit: float) -> bool:
        return (
            self.has_labels(needs.labels)
            and needs.cpus <= self.cpus * overcommit
            and needs.memory_mb <= self.memory_mb * overcommit
        )

    def fits(self, needs: Needs, overcommit: float) -> bool:
        return (
            self.live < self.slots
            and self.reserved_cpus + needs.cpus <= self.cpus * overcommit
            and self.reserved_memory_mb + needs.memory_mb <= self.memory_mb * overcommit
        )

    @property
    def free(self) -> int:
        return self.slots - self.live


def candidates(
    workers: list[WorkerInfo], needs: Needs, overcommit: float, what: str
) -> list[WorkerInfo]:
    """The workers that could host an episode, the ones with room (as last reported) and
    the freest first.

    Raises UnavailableError (503) when no live worker could ever host it (the labels or
    resources are missing on every node)."""
    capable = [w for w in workers if w.could_ever_host(needs, overcommit)]
    if not capable:
        have = "; ".join(
            f"{w.name}: labels {sorted(w.labels)}, {w.cpus:g} CPUs, {w.memory_mb:.0f} MB"
            for w in workers
        )
        raise UnavailableError(
            f"no live node can host {what}: it needs labels {sorted(needs.labels) or 'none'}, "
            f"{needs.cpus:g} CPUs and {needs.memory_mb:.0f} MB; "
            f"the live workers have: {have or 'no workers at all'}",
            code="no_capable_node",
            retryable=False,
        )
    # A front's view of the load lags (reports every ray_poll_s, other fronts' resets): it
    # orders the tries, and the workers, who know, refuse (`worker_full`) or accept.
    return sorted(capable, key=lambda w: (w.fits(needs, overcommit), w.free), reverse=True)


def cluster_full(refusals: list[str]) -> CapacityError:
    shown = "; ".join(refusals[:8]) or "no worker answered"
    return CapacityError(
        f"every worker that can host this episode is full ({shown}); close finished "
        "episodes or retry later",
        retry_after=1.0,
    )
