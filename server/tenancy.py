"""Tenancy: which token owns an episode, and each token's quotas (DESIGN §3, §5b).

Episode ids. A server-made id is a random uuid (32 hex digits): it is the episode's store
key as it is. A client-chosen id is scoped by the token that chose it: its store key is
`<token id>:<episode id>`, and the client keeps using the id it chose. Two tokens may both
say "a" and never meet; a token that names an id it does not own gets the same 404 as for an
id nobody has. An admin reaches another token's client-chosen episode as
`<token id>:<episode id>`, and any server-made id as it is.

Quotas, per token (its own, else the server-wide defaults in Settings; admin tokens are
bound only by what is set on them): live episodes (starts being made count), episode starts
in the last hour, sandbox CPU-seconds in the last hour (`charge`d after every step), and
pending batch work (steps detached from a batch call that answered `still_running`).
Going over answers 429 with `Retry-After` to that token alone. The windows live in memory:
at start the episode starts of the last hour are read back from the store, CPU is not.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from palaestra.sdk.errors import CapacityError, InvalidActionError
from palaestra.sdk.models import UNSTORABLE
from palaestra.server.auth import Principal
from palaestra.server.config import Settings

HOUR_S = 3600.0
BUCKET_S = 60.0  # CPU is kept per minute: at most 60 buckets a token


def episode_key(owner: str, episode_id: str | None, new_id: str) -> str:
    """The store key of a new episode (`new_id` when the client chose no id)."""
    return f"{owner}:{episode_id}" if episode_id else new_id


def candidate_keys(owner: str, episode_id: str) -> tuple[str, str]:
    """The keys a wire id may name for `owner`: its own scoped id, then a key as it is.
    Every route's episode id passes here: one with a control character is refused (422) on
    every engine alike (PostgreSQL cannot even look a NUL up), as ResetRequest refuses it."""
    if UNSTORABLE.search(episode_id) is not None:
        raise InvalidActionError(
            f"episode_id {episode_id[:200]!r}: must not contain control characters or lone "
            "surrogates",
            code="invalid_id",
        )
    return f"{owner}:{episode_id}", episode_id


def wire_id(key: str, owner: str | None) -> str:
    """The id the owner uses for the episode stored under `key`."""
    prefix = f"{owner}:" if owner else None
    return key[len(prefix) :] if prefix and key.startswith(prefix) else key


def quota_error(what: str, limit: float, retry_after: float, fix: str) -> CapacityError:
    return CapacityError(
        f"this token is over its quota of {limit:g} {what}; {fix} (retry after "
        f"{retry_after:.0f} s)",
        code="quota_exceeded",
        retry_after=max(1.0, math.ceil(retry_after)),
    )


@dataclass
class _Account:
    live: int = 0
    starts: deque[float] = field(default_factory=deque)  # only while a per-hour cap applies
    cpu: deque[list[float]] = field(default_factory=deque)  # [bucket start, seconds]
    cpu_total: float = 0.0
    pending: int = 0
    pending_bytes: int = 0  # request bytes of the detached work (what it holds while it runs)

    def expire(self, now: float) -> None:
        cutoff = now - HOUR_S
        while self.starts and self.starts[0] <= cutoff:
            self.starts.popleft()
        while self.cpu and self.cpu[0][0] + BUCKET_S <= cutoff:
            self.cpu_total -= self.cpu.popleft()[1]
        if not self.cpu:
            self.cpu_total = 0.0

    @property
    def idle(self) -> bool:
        return not (self.live or self.starts or self.cpu or self.pending or self.pending_bytes)


class Tenancy:
    """Per-token counters; every method is synchronous and O(1) amortized (the step path)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._accounts: dict[str, _Account] = {}

    def _account(self, owner: str) -> _Account:
        account = self._accounts.get(owner)
        if account is None:
            account = self._accounts[owner] = _Account()
        return account

    def limits(self, principal: Principal) -> tuple[int | None, int | None, float | None]:
        """(live, episodes per hour, CPU-seconds per hour) for `principal`; None: no cap."""
        q = principal.quota
        if principal.is_admin:
            return q.max_live, q.max_episodes_per_hour, q.max_cpu_s_per_hour
        s = self.settings
        return (
            s.token_max_live if q.max_live is None else q.max_live,
            s.token_max_episodes_per_hour
            if q.max_episodes_per_hour is None
            else q.max_episodes_per_hour,
            s.token_max_cpu_s_per_hour if q.max_cpu_s_per_hour is None else q.max_cpu_s_per_hour,
        )

    # -- episodes -----------------------------------------------------------------------
    def admit(self, principal: Principal) -> float:
        """Reserve a live slot and an hourly start for a new episode (429 when over);
        returns the start's time, for `refund`."""
        max_live, per_hour, max_cpu = self.limits(principal)
        account = self._account(principal.token_id)
        now = time.time()
        account.expire(now)
        if max_live is not None and account.live >= max_live:
            raise quota_error(
                "live episodes", max_live, 1.0, "close or finish some of this token's episodes"
            )
        if per_hour is not None and len(account.starts) >= per_hour:
            wait = account.starts[0] + HOUR_S - now if account.starts else HOUR_S
            raise quota_error("episode starts per hour", per_hour, wait, "start fewer episodes")
        self._check_cpu(account, max_cpu, now)
        account.live += 1
        if per_hour is not None:
            account.starts.append(now)
        return now

    def hold(self, principal: Principal) -> None:
        """A live slot for work that is no episode but makes sandboxes and runs a verifier
        (a regrade): 429 while the token's live slots are taken or its CPU is over its
        cap; no hourly start is taken. Give it back with `ended`."""
        max_live, _, max_cpu = self.limits(principal)
        account = self._account(principal.token_id)
        now = time.time()
        account.expire(now)
        if max_live is not None and account.live >= max_live:
            raise quota_error("live episodes", max_live, 1.0, "a regrade holds one while it runs")
        self._check_cpu(account, max_cpu, now)
        account.live += 1

    def refund(self, owner: str, started: float) -> None:
        """A start that failed: its live slot and its hourly start are given back."""
        account = self._account(owner)
        account.live = max(0, account.live - 1)
        if started in account.starts:
            account.starts.remove(started)

    def ended(self, owner: str) -> None:
        account = self._accounts.get(owner)
        if account is not None and account.live > 0:
            account.live -= 1

    def restore_starts(self, starts: list[tuple[str, float]]) -> None:
        """Episode starts of the last hour read back from the store at start-up."""
        for owner, at in sorted(starts, key=lambda s: s[1]):
            self._account(owner).starts.append(at)

    # -- CPU ----------------------------------------------------------------------------
    def check_cpu(self, principal: Principal) -> None:
        """Before a step: 429 while the token's CPU-seconds of the last hour are over its cap."""
        max_cpu = self.limits(principal)[2]
        if max_cpu is None:
            return
        account = self._accounts.get(principal.token_id)
        if account is not None:
            now = time.time()
            account.expire(now)
            self._check_cpu(account, max_cpu, now)

    @staticmethod
    def _check_cpu(account: _Account, max_cpu: float | None, now: float) -> None:
        if max_cpu is None or account.cpu_total < max_cpu:
            return
        left, wait = account.cpu_total, HOUR_S
        for start, seconds in account.cpu:
            left -= seconds
            if left < max_cpu:
                wait = start + BUCKET_S + HOUR_S - now
                break
        raise quota_error(
            "sandbox CPU-seconds per hour", max_cpu, wait, "wait for the hour's window to move on"
        )

    def charge(self, owner: str, seconds: float) -> None:
        """CPU-seconds the owner's sandboxes used (after a step, and when an episode ends)."""
        if not seconds > 0 or not math.isfinite(seconds):
            return
        account = self._account(owner)
        bucket = time.time() // BUCKET_S * BUCKET_S
        if account.cpu and account.cpu[-1][0] == bucket:
            account.cpu[-1][1] += seconds
        else:
            account.cpu.append([bucket, seconds])
        account.cpu_total += seconds

    def cpu_used(self, owner: str) -> float:
        """CPU-seconds charged to `owner` in the last hour."""
        account = self._accounts.get(owner)
        if account is None:
            return 0.0
        account.expire(time.time())
        return account.cpu_total

    # -- pending batch work ---------------------------------------------------------------
    def check_pending(self, principal: Principal, size: int = 0) -> None:
        """Before a batch step of `size` request bytes: 429 while the token has its cap of
        detached steps running, or while what they hold and this request would pass its cap
        of pending bytes (a lone request is bounded by max_body_bytes already)."""
        account = self._accounts.get(principal.token_id)
        if account is None:
            return
        fix = (
            "wait for the steps answered `still_running` (resend them to collect their "
            "replies) before sending more"
        )
        cap = self.settings.token_max_pending
        if account.pending >= cap:
            raise quota_error("pending batch steps", cap, 1.0, fix)
        cap_bytes = self.settings.token_max_pending_bytes
        if account.pending_bytes and account.pending_bytes + size > cap_bytes:
            raise quota_error("bytes of pending batch work", cap_bytes, 1.0, fix)

    def pending(self, owner: str, delta: int, size: int = 0) -> None:
        """`delta` detached works holding `size` request bytes (negative: they ended)."""
        account = self._account(owner)
        account.pending = max(0, account.pending + delta)
        account.pending_bytes = max(0, account.pending_bytes + size)

    def prune(self) -> None:
        """Forget tokens with nothing live and empty windows (called by the reaper)."""
        now = time.time()
        for owner in list(self._accounts):
            account = self._accounts[owner]
            account.expire(now)
            if account.idle:
                del self._accounts[owner]


class LocalQuota:
    """The `Quota` (server/host.py) of one server's own counters."""

    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    async def restore(self, starts: list[tuple[str, float]]) -> None:
        self.tenancy.restore_starts(starts)

    async def admit(self, principal: Principal, key: str) -> float:
        return self.tenancy.admit(principal)

    async def refund(self, principal: Principal, key: str, ticket: float) -> None:
        self.tenancy.refund(principal.token_id, ticket)
