"""The ledger: per-token quotas held once for a whole cluster, whatever front a call reaches.

One named, detached Ray actor (`palaestra-ledger`) keeps a `Tenancy` (server/tenancy.py) for
every front: fronts admit a reset here before a worker starts it, and report the episodes
they see end; workers report the sandbox CPU their episodes used and the episodes they end
on their own (idle TTL). Fronts make the calls on an episode's path (admit, refund, ended)
over the ledger's own episode channel (channel.py), not as Ray actor calls: an actor call
from an asyncio front costs milliseconds, two of them a coding episode's 10 % budget
(docs/reference/cluster.md). It is an async actor whose methods never await inside,
so calls run one at a time in the order they arrived, and live episodes are held as a set
of episode keys, so an end reported twice (by the front and the worker) counts once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
from typing import Any

from palaestra.sdk.errors import CapacityError, ServerError
from palaestra.server.auth import Principal
from palaestra.server.cluster.channel import ChannelServer
from palaestra.server.cluster.worker import principal_from
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
        self._key = secrets.token_bytes(32)
        self._channel: ChannelServer | None = None
        self._address: dict[str, Any] = {}
        self._opening = asyncio.Lock()

    # -- the channel (fronts) -------------------------------------------------------------
    async def open_channel(self) -> dict[str, Any]:
        """Where fronts reach this ledger: host, port and key (opened on the first ask)."""
        async with self._opening:
            if self._channel is None:
                import importlib

                ray: Any = importlib.import_module("ray")
                host = ray.util.get_node_ip_address() or socket.gethostname()
                self._channel = ChannelServer(self._handle, self._key)
                port = await self._channel.start(host)
                self._address = {"host": host, "port": port, "key": self._key.hex()}
        return self._address

    async def _handle(self, method: str, args: dict[str, Any]) -> bytes:
        if method == "admit":
            self.admit(principal_from(args["principal"]), str(args["key"]))
        elif method == "refund":
            self.refund(str(args["key"]))
        elif method == "ended":
            await self.ended([str(key) for key in args["keys"]])
        else:
            raise ServerError(f"the ledger has no call {method!r}", code="ledger_error")
        return json.dumps(None).encode()

    # -- quotas ---------------------------------------------------------------------------
    def admit(self, principal: Principal, key: str) -> None:
        """Count episode `key` for `principal`; raises the 429 when its quota is full."""
        if key in self._live:
            return
        self.tenancy.check_cpu(principal)
        started = self.tenancy.admit(principal)
        self._live[key] = (principal.token_id, started)
        self._principals[principal.token_id] = principal

    def refund(self, key: str) -> None:
        """A start that failed: its slot and its hourly start are given back."""
        held = self._live.pop(key, None)
        if held is not None:
            self.tenancy.refund(*held)

    async def ended(self, keys: list[str]) -> None:
        for key in keys:
            held = self._live.pop(key, None)
            if held is not None:
                self.tenancy.ended(held[0])

    async def charge(self, spent: dict[str, float]) -> None:
        for owner, seconds in spent.items():
            self.tenancy.charge(owner, seconds)

    async def over_cpu(self) -> list[str]:
        """Owners over their CPU-seconds per hour now (a front refuses their steps)."""
        over = []
        for owner, principal in self._principals.items():
            try:
                self.tenancy.check_cpu(principal)
            except CapacityError:
                over.append(owner)
        return over
