"""The ledger: per-token quotas held once for a whole cluster, whatever front a call reaches.

One named, detached Ray actor (`palaestra-ledger`) keeps a `Tenancy` (server/tenancy.py) for
every front: fronts admit a reset here before a worker starts it, and report the episodes
they see end; workers report the sandbox CPU their episodes used and the episodes they end
on their own (idle TTL). It is a plain (threaded, one call at a time) actor, so calls from
one front run in the order they were sent, and live episodes are held as a set of episode
keys, so an end reported twice (by the front and the worker) counts once.
"""

from __future__ import annotations

import logging
from typing import Any

from palaestra.sdk.errors import CapacityError
from palaestra.server.auth import Principal
from palaestra.server.cluster.channel import error_json
from palaestra.server.config import Settings
from palaestra.server.tenancy import Tenancy

log = logging.getLogger("palaestra.cluster")

LEDGER_NAME = "palaestra-ledger"


class Ledger:
    def __init__(self, settings_json: str, starts: list[tuple[str, float]]) -> None:
        self.tenancy = Tenancy(Settings.model_validate_json(settings_json))
        self.tenancy.restore_starts(starts)
        self._live: dict[str, tuple[str, float]] = {}  # episode key → (owner, started at)
        self._principals: dict[str, Principal] = {}  # owner → its last principal (CPU caps)

    def admit(self, principal: Principal, key: str) -> bytes | None:
        """None when `principal` may start episode `key`; else the 429's error JSON."""
        if key in self._live:
            return None
        try:
            self.tenancy.check_cpu(principal)
            started = self.tenancy.admit(principal)
        except CapacityError as exc:
            return error_json(exc)
        self._live[key] = (principal.token_id, started)
        self._principals[principal.token_id] = principal
        return None

    def refund(self, key: str) -> None:
        """A start that failed: its slot and its hourly start are given back."""
        held = self._live.pop(key, None)
        if held is not None:
            self.tenancy.refund(*held)

    def ended(self, keys: list[str]) -> None:
        for key in keys:
            held = self._live.pop(key, None)
            if held is not None:
                self.tenancy.ended(held[0])

    def charge(self, spent: dict[str, float]) -> None:
        for owner, seconds in spent.items():
            self.tenancy.charge(owner, seconds)

    def over_cpu(self) -> list[str]:
        """Owners over their CPU-seconds per hour now (a front refuses their steps)."""
        over = []
        for owner, principal in self._principals.items():
            try:
                self.tenancy.check_cpu(principal)
            except CapacityError:
                over.append(owner)
        return over

    def report(self) -> dict[str, Any]:
        """Live episodes per owner (tests and operators)."""
        counts: dict[str, int] = {}
        for owner, _ in self._live.values():
            counts[owner] = counts.get(owner, 0) + 1
        return {"live": counts}
