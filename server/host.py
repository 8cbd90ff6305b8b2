"""Where episodes run, seen from the one front (server/manager.py).

The front decides what every episode shares, whatever runs it: which task (resolved or
sampled), whether the caller may start it (sealed split, oracle), its limits, its store key,
the token's quota, and the reply's annotations. It hands the episode to an `EpisodeHost`:
- `LocalHost` (server/local_host.py): episodes and their sandboxes in this process;
- `ClusterHost` (server/cluster/front.py): episodes on Ray workers, each a `LocalHost`.

A host reports what its episodes use and how they end through `Accounting`, and a front
admits new episodes through a `Quota`; each has a local form and a cluster form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from palaestra.sdk.models import (
    CheckpointResponse,
    EpisodeState,
    ForkRequest,
    ForkResponse,
    Limits,
    ResetRequest,
    ResetResponse,
    ResumeResponse,
    StepRequest,
    StepResponse,
    Verdict,
)
from palaestra.sdk.task import Task
from palaestra.server.auth import Principal

if TYPE_CHECKING:
    from palaestra.server.episode import Episode


@dataclass(frozen=True)
class StartOrder:
    """A new episode as the front decided it; a host starts it as it is."""

    task: Task
    request: ResetRequest  # pinned: `request.task` is the task's full ref
    principal: Principal
    key: str  # the episode's store key (server/tenancy.py)
    limits: Limits
    oracle: bool  # the oracle drives it (allowed by the front)


@dataclass(frozen=True)
class ForkOrder:
    """A fork as the front decided it (its key, its quota admitted); a host makes it."""

    principal: Principal
    parent_id: str  # the parent, by the id its caller uses
    request: ForkRequest
    key: str  # the fork's store key (server/tenancy.py)


@dataclass(frozen=True)
class Ending:
    """How an episode ended, for the accounts and the sampler."""

    key: str
    owner: str
    task: str  # its full ref ("" when the host does not know it)
    status: str  # EpisodeStatus: done, void, closed, expired
    reward: float
    passed: bool
    reason: str | None  # why it went void or expired
    at: float


class Checkpointing(Protocol):
    """Checkpoint and resume of a host's episodes (server/checkpoint.py); 404 as for every
    call, 409 for an episode that is not live (checkpoint) or not resumable (resume)."""

    async def checkpoint(self, principal: Principal, episode_id: str) -> CheckpointResponse: ...

    async def resume(self, principal: Principal, episode_id: str) -> ResumeResponse: ...


class EpisodeHost(Protocol):
    """Runs episodes; every call names the episode by the id its caller uses and checks
    that the caller owns it (404 otherwise, as for an unknown id)."""

    @property
    def ready(self) -> bool: ...

    @property
    def live_count(self) -> int:
        """Live episodes, and those being started."""
        ...

    async def open(self) -> None: ...

    async def aclose(self) -> None: ...

    async def start(self, order: StartOrder) -> ResetResponse: ...

    async def step(
        self, principal: Principal, episode_id: str, request: StepRequest
    ) -> StepResponse: ...

    async def verify(self, principal: Principal, episode_id: str) -> Verdict: ...

    async def state(self, principal: Principal, episode_id: str) -> EpisodeState: ...

    async def close(self, principal: Principal, episode_id: str) -> None: ...

    async def fork(self, order: ForkOrder) -> ForkResponse:
        """A copy of the caller's live episode under `order.key` (server/fork.py); 404 as
        for every call, 409 when the parent has ended."""
        ...

    @property
    def checkpoints(self) -> Checkpointing: ...

    async def owned(self, principal: Principal, episode_id: str) -> tuple[Episode | None, str]:
        """The episode held here that `episode_id` names for `principal` (None when it is
        not held here) and its store key; 404 when it names none the principal owns."""
        ...

    async def reap(self) -> int:
        """End idle episodes; how many."""
        ...

    async def exposition(self, own: bytes) -> bytes:
        """The Prometheus exposition: the front's `own`, and what the host adds."""
        ...


class Accounting(Protocol):
    """What a host tells the front's accounts as its episodes run."""

    def before_step(self, principal: Principal) -> None:
        """Raise 429 while the token may not step (its CPU-seconds of the hour are spent)."""
        ...

    def charged(self, owner: str, seconds: float) -> None:
        """CPU-seconds the owner's sandboxes used."""
        ...

    def ended(self, ended: Ending) -> None:
        """An episode ended."""
        ...


class Quota(Protocol):
    """A token's admission to a new episode (live episodes, starts per hour, CPU)."""

    async def restore(self, starts: list[tuple[str, float]]) -> None:
        """The episode starts of the last hour, read back from the store at start-up."""
        ...

    async def admit(self, principal: Principal, key: str) -> float:
        """Reserve the episode's slot (429 when over); a ticket for `refund`."""
        ...

    async def refund(self, principal: Principal, key: str, ticket: float) -> None:
        """The start failed: give its slot back."""
        ...
