"""Episode workers: the Ray actors that host a cluster's episodes, one per node.

A worker is an `EpisodeManager` (the same one the embedded server runs) on its node, with
its own sandbox backend, families and packs, writing to the shared store. Fronts find it by
name through Ray, learn its channel address and key from `info()`, and send episode calls
over the channel (server/cluster/channel.py). Quotas are the ledger's: the worker reports
the CPU its episodes used and the episodes it ended on its own.

The worker writes the placement row (episode → worker) before the episode's own row, so an
episode the store knows is always one a front can route, or void when its worker is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict
from typing import Any

from palaestra.sdk.errors import CapacityError, UnavailableError
from palaestra.sdk.models import EpisodeStatus, ResetRequest, StepRequest
from palaestra.server.auth import Principal, Quota
from palaestra.server.cluster import depot
from palaestra.server.cluster.channel import ChannelServer
from palaestra.server.cluster.placement import SLOTS_RESOURCE, WORKER_FULL, Needs, WorkerInfo
from palaestra.server.config import Settings
from palaestra.server.episode import Episode
from palaestra.server.manager import EpisodeManager
from palaestra.server.tenancy import Tenancy, episode_key

log = logging.getLogger("palaestra.cluster")

WORKER_PREFIX = "palaestra-worker-"


def worker_name(node_id: str) -> str:
    return WORKER_PREFIX + node_id[:16]


def principal_json(principal: Principal) -> dict[str, Any]:
    return {
        "name": principal.name,
        "scopes": sorted(principal.scopes),
        "token_id": principal.token_id,
        "orgs": sorted(principal.orgs),
        "quota": asdict(principal.quota),
    }


def principal_from(data: dict[str, Any]) -> Principal:
    return Principal(
        name=data["name"],
        scopes=frozenset(data["scopes"]),
        token_id=data["token_id"],
        orgs=frozenset(data["orgs"]),
        quota=Quota(**data["quota"]),
    )


class WorkerTenancy(Tenancy):
    """Quotas are checked by the ledger before a front sends a reset; here the worker only
    gathers the CPU its episodes use, for the ledger."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.spent: dict[str, float] = {}

    def admit(self, principal: Principal) -> float:
        return time.time()

    def refund(self, owner: str, started: float) -> None:
        pass

    def ended(self, owner: str) -> None:
        pass

    def check_cpu(self, principal: Principal) -> None:
        pass

    def check_pending(self, principal: Principal) -> None:
        pass

    def charge(self, owner: str, seconds: float) -> None:
        if owner and seconds > 0:
            self.spent[owner] = self.spent.get(owner, 0.0) + seconds

    def drain(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


class WorkerManager(EpisodeManager):
    """The episode manager of one worker: a share of the cluster's episodes, within its slots."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tenancy = WorkerTenancy(self.settings)
        self.identity = ("", "")  # (worker name, node id), set by EpisodeWorker
        self.slots = self.settings.max_episodes
        self.cpus = self.memory_mb = 0.0
        self._needs: dict[str, Needs] = {}
        self.ended_keys: list[str] = []  # for the ledger

    async def start(self) -> None:
        """No `mark_unfinished`: other workers' episodes are alive. This worker's own active
        episodes in the store were a previous incarnation's: lost with it."""
        stale = await self.store.active_on(self.identity[0])
        if stale:
            log.warning("%s: %d episodes of its previous run lost", self.identity[0], len(stale))
        self._reaper = asyncio.create_task(self._reap_forever(), name="palaestra-reaper")

    @property
    def reserved(self) -> tuple[float, float]:
        return (
            sum(n.cpus for n in self._needs.values()),
            sum(n.memory_mb for n in self._needs.values()),
        )

    async def host(
        self, request: ResetRequest, principal: Principal, new_id: str, needs: Needs
    ) -> bytes:
        cpus, memory = self.reserved
        overcommit = self.settings.ray_overcommit
        if (
            self.live_count >= self.slots
            or cpus + needs.cpus > self.cpus * overcommit
            or memory + needs.memory_mb > self.memory_mb * overcommit
        ):
            raise CapacityError(
                f"worker {self.identity[0]} is full: {self.live_count}/{self.slots} episodes, "
                f"{cpus:g}+{needs.cpus:g} of {self.cpus * overcommit:g} CPUs, "
                f"{memory:.0f}+{needs.memory_mb:.0f} of {self.memory_mb * overcommit:.0f} MB",
                code=WORKER_FULL,
            )
        key = episode_key(principal.token_id, request.episode_id, new_id)
        self._needs[key] = needs
        self.store.put_placement(key, *self.identity)  # before the episode's row
        try:
            reply = await self.reset(request, principal, new_id=new_id)
        except BaseException:
            self._needs.pop(key, None)
            raise
        if key not in self._live:  # ended during reset
            self._needs.pop(key, None)
        return reply.model_dump_json().encode()

    async def _end(
        self, episode: Episode, status: EpisodeStatus, reason: str | None = None
    ) -> None:
        was_active = episode.state.status is EpisodeStatus.ACTIVE
        await super()._end(episode, status, reason)
        if was_active:
            self._needs.pop(episode.id, None)
            self.ended_keys.append(episode.id)


class EpisodeWorker:
    """The Ray actor (made with `ray.remote(EpisodeWorker)` by a front, one per node)."""

    def __init__(self, name: str, settings_json: str, heldout_secret: bytes) -> None:
        self.name = name
        self.settings_json = settings_json
        self.heldout_secret = heldout_secret
        self.key = secrets.token_bytes(32)
        self.manager: WorkerManager | None = None
        self.channel: ChannelServer | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._starting = asyncio.Lock()
        self._report: asyncio.Task[None] | None = None
        self._ledger: Any = None

    async def start(self, ledger: Any) -> dict[str, Any]:
        """Build the manager and open the channel (once; later calls just answer info)."""
        async with self._starting:
            if self.manager is None:
                self._ledger = ledger
                self.manager = await asyncio.to_thread(self._build)
                await self.manager.start()
                gc.collect()  # as `palaestra serve` does: what is loaded leaves the
                gc.freeze()  # collector's view, so collections walk only episodes' objects
                self.channel = ChannelServer(self._handle, self.key)
                self.port = await self.channel.start(self.host)
                self._report = asyncio.create_task(self._report_forever())
        return self.info()

    def _build(self) -> WorkerManager:
        import importlib

        from palaestra.server.runtime import build_manager

        ray: Any = importlib.import_module("ray")  # untyped: its calls are Any here
        context = ray.get_runtime_context()
        node = context.get_node_id()
        self.host = ray.util.get_node_ip_address() or socket.gethostname()
        settings = Settings.model_validate_json(self.settings_json)
        local = settings.cache / "workers" / self.name  # this node's own data dir
        local.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret_file = local / "heldout.secret"
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(self.heldout_secret.hex() + "\n")  # the format of server/heldout.py
        settings = settings.model_copy(
            update={"data_dir": local, "heldout_secret_file": secret_file, "ray": ""}
        )
        manager = build_manager(settings, make=WorkerManager, cluster_node=True, admin_token=False)
        assert isinstance(manager, WorkerManager)
        resources = next(n for n in ray.nodes() if n["NodeID"] == node)
        res = resources.get("Resources", {})
        manager.identity = (self.name, node)
        manager.slots = int(res.get(SLOTS_RESOURCE) or settings.ray_node_episodes or 0) or (
            settings.max_episodes
        )
        manager.cpus = float(res.get("CPU", 1.0))
        manager.memory_mb = float(res.get("memory", 0.0)) / 2**20
        self.labels = dict(resources.get("Labels") or {})
        return manager

    def info(self) -> dict[str, Any]:
        manager = self.manager
        if manager is None:
            raise UnavailableError(f"worker {self.name} has not started", code="worker_starting")
        cpus, memory = manager.reserved
        return WorkerInfo(
            name=self.name,
            node=manager.identity[1],
            host=self.host,
            port=self.port,
            key=self.key.hex(),
            labels={k: v for k, v in self.labels.items() if not k.startswith("ray.io/")},
            slots=manager.slots,
            cpus=manager.cpus,
            memory_mb=manager.memory_mb,
            live=manager.live_count,
            reserved_cpus=cpus,
            reserved_memory_mb=memory,
        ).to_json()

    async def sync_packs(self) -> int:
        """Load packs published since this worker started (fetched from the shared store)."""
        manager = self._manager()
        return await asyncio.to_thread(depot.sync_published, manager)

    async def metrics(self) -> bytes:
        return self._manager().metrics.render()

    async def stop(self) -> None:
        if self._report is not None:
            self._report.cancel()
        if self.channel is not None:
            await self.channel.close()
        if self.manager is not None:
            await self.manager.shutdown()

    def _manager(self) -> WorkerManager:
        if self.manager is None:
            raise UnavailableError(f"worker {self.name} has not started", code="worker_starting")
        return self.manager

    async def _report_forever(self) -> None:
        manager = self._manager()
        assert isinstance(manager.tenancy, WorkerTenancy)
        while True:
            await asyncio.sleep(manager.settings.ray_poll_s)
            with contextlib.suppress(Exception):
                spent, ended = manager.tenancy.drain(), manager.ended_keys
                manager.ended_keys = []
                if spent:
                    self._ledger.charge.remote(spent)
                if ended:
                    self._ledger.ended.remote(ended)

    # -- the channel's calls ------------------------------------------------------------
    async def _handle(self, method: str, args: dict[str, Any]) -> bytes:
        manager = self._manager()
        principal = principal_from(args["principal"])
        if method == "step":
            step = StepRequest.model_validate(args["request"])
            reply = await manager.step(args["id"], step, principal)
            return reply.model_dump_json().encode()
        if method == "reset":
            reset = ResetRequest.model_validate(args["request"])
            await self._ensure_task(manager, reset, args["task_digest"])
            return await manager.host(
                reset, principal, args["new_id"], Needs.from_json(args["needs"])
            )
        if method == "verify":
            return (await manager.verify(args["id"], principal)).model_dump_json().encode()
        if method == "state":
            return (await manager.state(args["id"], principal)).model_dump_json().encode()
        if method == "close":
            await manager.close(args["id"], principal)
            return b"null"
        raise UnavailableError(f"worker {self.name} has no call {method!r}", code="worker_error")

    async def _ensure_task(
        self, manager: WorkerManager, request: ResetRequest, digest: str
    ) -> None:
        """The front picked the task: this node must serve the very same bytes of it."""
        assert request.task is not None
        for attempt in range(2):
            try:
                task = manager.packs.resolve(request.task)
            except Exception:
                task = None
            if task is not None and task.digest == digest:
                return
            if attempt == 0:
                await self.sync_packs()
        raise UnavailableError(
            f"worker {self.name} does not serve task {request.task} with digest {digest}",
            code="pack_unavailable",
        )


def settings_for_workers(settings: Settings) -> str:
    """What a front sends its workers: its settings, with the store's location made
    absolute (a SQLite store stays the front's file: local clusters only) and the judges'
    API keys shown (each worker builds its own judge endpoints)."""
    store = settings.store or f"sqlite://{(settings.data_dir / 'palaestra.sqlite3').resolve()}"
    return settings.model_copy(update={"store": store}).model_dump_json(context={"secrets": True})
