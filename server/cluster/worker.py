"""Episode workers: the Ray actors that host a cluster's episodes, one per node.

A worker runs a `LocalHost` (the host the embedded server runs) on its node, with its own
sandbox backend, families and packs, writing to the shared store. Fronts find it by
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
from dataclasses import asdict, dataclass
from typing import Any

from palaestra.sdk.errors import CapacityError, UnavailableError
from palaestra.sdk.models import ForkRequest, Limits, RegradeRequest, ResetRequest, StepRequest
from palaestra.server.auth import Principal, Quota
from palaestra.server.cluster import depot
from palaestra.server.cluster.channel import ChannelServer
from palaestra.server.cluster.placement import SLOTS_RESOURCE, WORKER_FULL, Needs, WorkerInfo
from palaestra.server.config import Settings
from palaestra.server.host import Ending, ForkOrder, StartOrder
from palaestra.server.local_host import LocalHost
from palaestra.server.regrade import Regrader
from palaestra.server.services import Services

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


def order_json(order: StartOrder) -> dict[str, Any]:
    """A front's start order, for the channel (the worker resolves the task again)."""
    return {
        "request": order.request.model_dump(mode="json"),
        "principal": principal_json(order.principal),
        "key": order.key,
        "limits": order.limits.model_dump(mode="json"),
        "oracle": order.oracle,
        "task_digest": order.task.digest,
    }


class WorkerAccounts:
    """The `Accounting` of a worker: quotas are the ledger's (a front checks them before it
    routes a call here); the worker gathers, for the ledger, the CPU its episodes used and
    the episodes that ended, and frees what their placement reserved."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.ended_keys: list[str] = []
        self.needs: dict[str, Needs] = {}  # per live episode, what placement reserved

    def before_step(self, principal: Principal) -> None:
        return None

    def charged(self, owner: str, seconds: float) -> None:
        if owner and seconds > 0:
            self.spent[owner] = self.spent.get(owner, 0.0) + seconds

    def ended(self, ended: Ending) -> None:
        self.needs.pop(ended.key, None)
        self.ended_keys.append(ended.key)

    def drain(self) -> tuple[dict[str, float], list[str]]:
        spent, self.spent = self.spent, {}
        ended, self.ended_keys = self.ended_keys, []
        return spent, ended

    @property
    def reserved(self) -> tuple[float, float]:
        return (
            sum(n.cpus for n in self.needs.values()),
            sum(n.memory_mb for n in self.needs.values()),
        )


@dataclass
class Node:
    """What this worker's node offers (from Ray), and the episodes it may hold."""

    name: str
    node_id: str
    slots: int
    cpus: float
    memory_mb: float


@dataclass
class Hosting:
    """A started worker's parts: its node, services, host and accounts."""

    node: Node
    services: Services
    host: LocalHost
    accounts: WorkerAccounts

    def take(self, order: StartOrder | None, needs: Needs) -> None:
        """Refuse (429 `worker_full`) an episode over this node's slots, CPUs or memory."""
        cpus, memory = self.accounts.reserved
        overcommit = self.services.settings.ray_overcommit
        node, live = self.node, self.host.live_count
        if (
            live >= node.slots
            or cpus + needs.cpus > node.cpus * overcommit
            or memory + needs.memory_mb > node.memory_mb * overcommit
        ):
            raise CapacityError(
                f"worker {node.name} is full: {live}/{node.slots} episodes, "
                f"{cpus:g}+{needs.cpus:g} of {node.cpus * overcommit:g} CPUs, "
                f"{memory:.0f}+{needs.memory_mb:.0f} of {node.memory_mb * overcommit:.0f} MB",
                code=WORKER_FULL,
            )

    async def start(self, order: StartOrder, needs: Needs) -> bytes:
        self.take(order, needs)
        key = order.key
        self.accounts.needs[key] = needs
        self.services.store.put_placement(key, self.node.name, self.node.node_id)  # first
        try:
            reply = await self.host.start(order)
        except BaseException:
            self.accounts.needs.pop(key, None)
            raise
        if not self.host.holds(key):  # ended during reset
            self.accounts.needs.pop(key, None)
        return reply.model_dump_json().encode()

    async def resume(self, principal: Principal, args: dict[str, Any]) -> bytes:
        """A `resumable` episode restored here from its checkpoint (server/checkpoint.py),
        placed as a start is (429 `worker_full` over this node's room)."""
        needs, key = Needs.from_json(args["needs"]), args["key"]
        self.take(None, needs)
        self.accounts.needs[key] = needs
        self.services.store.put_placement(key, self.node.name, self.node.node_id)  # first
        try:
            reply = await self.host.checkpoints.resume(principal, args["id"])
        except BaseException:
            self.accounts.needs.pop(key, None)
            raise
        return reply.model_dump_json().encode()

    async def fork(self, order: ForkOrder) -> bytes:
        """A fork of an episode this worker hosts, here (it copies the parent's sandbox),
        with the parent's needs (429 `worker_full` over this node's room)."""
        parent_key = (await self.host.owned(order.principal, order.parent_id))[1]  # or 404
        needs = self.accounts.needs.get(parent_key, Needs())
        self.take(None, needs)
        self.accounts.needs[order.key] = needs
        self.services.store.put_placement(order.key, self.node.name, self.node.node_id)  # first
        try:
            reply = await self.host.fork(order)
        except BaseException:
            self.accounts.needs.pop(order.key, None)
            raise
        return reply.model_dump_json().encode()


class EpisodeWorker:
    """The Ray actor (made with `ray.remote(EpisodeWorker)` by a front, one per node)."""

    def __init__(self, name: str, settings_json: str, heldout_secret: bytes) -> None:
        self.name = name
        self.settings_json = settings_json
        self.heldout_secret = heldout_secret
        self.key = secrets.token_bytes(32)
        self.hosting: Hosting | None = None
        self.channel: ChannelServer | None = None
        self.address = "127.0.0.1"
        self.port = 0
        self.labels: dict[str, str] = {}
        self._starting = asyncio.Lock()
        self._report: asyncio.Task[None] | None = None
        self._ledger: Any = None

    async def start(self, ledger: Any) -> dict[str, Any]:
        """Build the host and open the channel (once; later calls just answer info)."""
        async with self._starting:
            if self.hosting is None:
                self._ledger = ledger
                hosting = await asyncio.to_thread(self._build)
                await hosting.host.open()
                self.hosting = hosting
                gc.collect()  # as `palaestra serve` does: what is loaded leaves the
                gc.freeze()  # collector's view, so collections walk only episodes' objects
                self.channel = ChannelServer(self._handle, self.key)
                self.port = await self.channel.start(self.address)
                self._report = asyncio.create_task(self._report_forever())
        return self.info()

    def _build(self) -> Hosting:
        import importlib

        from palaestra.server.runtime import build_parts

        ray: Any = importlib.import_module("ray")  # untyped: its calls are Any here
        context = ray.get_runtime_context()
        node_id = context.get_node_id()
        self.address = ray.util.get_node_ip_address() or socket.gethostname()
        settings = Settings.model_validate_json(self.settings_json)
        local = settings.cache / "workers" / self.name  # this node's own data dir
        for folder in (local.parent, local):  # it holds the held-out secret: this user's only
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.chmod(0o700)
        secret_file = local / "heldout.secret"
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a file left by an older worker keeps its mode otherwise
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(self.heldout_secret.hex() + "\n")  # the format of server/heldout.py
        settings = settings.model_copy(
            update={"data_dir": local, "heldout_secret_file": secret_file, "ray": ""}
        )
        parts = build_parts(settings, cluster_node=True, admin_token=False)
        resources = next(n for n in ray.nodes() if n["NodeID"] == node_id)
        res = resources.get("Resources", {})
        node = Node(
            name=self.name,
            node_id=node_id,
            slots=int(res.get(SLOTS_RESOURCE) or settings.ray_node_episodes or 0)
            or settings.max_episodes,
            cpus=float(res.get("CPU", 1.0)),
            memory_mb=float(res.get("memory", 0.0)) / 2**20,
        )
        self.labels = dict(resources.get("Labels") or {})
        accounts = WorkerAccounts()
        services = parts.services
        host = LocalHost(services, parts.sandboxes, accounts, node=self.name)
        return Hosting(node, services, host, accounts)

    def info(self) -> dict[str, Any]:
        hosting = self._hosting()
        cpus, memory = hosting.accounts.reserved
        node = hosting.node
        return WorkerInfo(
            name=self.name,
            node=node.node_id,
            host=self.address,
            port=self.port,
            key=self.key.hex(),
            labels={k: v for k, v in self.labels.items() if not k.startswith("ray.io/")},
            slots=node.slots,
            cpus=node.cpus,
            memory_mb=node.memory_mb,
            live=hosting.host.live_count,
            reserved_cpus=cpus,
            reserved_memory_mb=memory,
        ).to_json()

    async def sync_packs(self) -> int:
        """Load packs published since this worker started (fetched from the shared store),
        and held-out draws rotated since (server/draws.py): the front may send a task of
        a draw this worker has not loaded yet."""
        services = self._hosting().services
        loaded = await asyncio.to_thread(depot.sync_published, services)
        if services.draws is not None:
            loaded += len(await services.draws.sync())
        return loaded

    async def metrics(self) -> bytes:
        return self._hosting().services.metrics.render()

    async def stop(self) -> None:
        if self._report is not None:
            self._report.cancel()
        if self.channel is not None:
            await self.channel.close()
        if self.hosting is not None:
            await self.hosting.host.aclose()
            await self.hosting.services.store.aclose()

    def _hosting(self) -> Hosting:
        if self.hosting is None:
            raise UnavailableError(f"worker {self.name} has not started", code="worker_starting")
        return self.hosting

    async def _report_forever(self) -> None:
        hosting = self._hosting()
        while True:
            await asyncio.sleep(hosting.services.settings.ray_poll_s)
            with contextlib.suppress(Exception):
                spent, ended = hosting.accounts.drain()
                if spent:
                    self._ledger.charge.remote(spent)
                if ended:
                    self._ledger.ended.remote(ended)

    # -- the channel's calls ------------------------------------------------------------
    async def _handle(self, method: str, args: dict[str, Any]) -> bytes:
        hosting = self._hosting()
        host = hosting.host
        if method == "reset":
            order = await self._order(hosting, args["order"])
            return await hosting.start(order, Needs.from_json(args["needs"]))
        principal = principal_from(args["principal"])
        if method == "step":
            step = StepRequest.model_validate(args["request"])
            reply = await host.step(principal, args["id"], step)
            return reply.model_dump_json().encode()
        if method == "verify":
            return (await host.verify(principal, args["id"])).model_dump_json().encode()
        if method == "state":
            return (await host.state(principal, args["id"])).model_dump_json().encode()
        if method == "close":
            await host.close(principal, args["id"])
            return b"null"
        if method == "checkpoint":
            made = await host.checkpoints.checkpoint(principal, args["id"])
            return made.model_dump_json().encode()
        if method == "resume":  # server/cluster/resume.py
            return await hosting.resume(principal, args)
        if method == "regrade":  # server/cluster/regrades.py: it kept the final state
            regrade = RegradeRequest.model_validate(args["request"])
            regrader = Regrader(hosting.services, host.sandboxes)
            verdict = await regrader.regrade(principal, args["id"], regrade)
            return verdict.model_dump_json().encode()
        if method == "fork":
            request = ForkRequest.model_validate(args["request"])
            return await hosting.fork(ForkOrder(principal, args["parent"], request, args["key"]))
        raise UnavailableError(f"worker {self.name} has no call {method!r}", code="worker_error")

    async def _order(self, hosting: Hosting, data: dict[str, Any]) -> StartOrder:
        """The front's order, with the task this node serves under the very same digest."""
        request = ResetRequest.model_validate(data["request"])
        assert request.task is not None
        digest = data["task_digest"]
        for attempt in range(2):
            try:
                task = hosting.services.packs.resolve(request.task)
            except Exception:
                task = None
            if task is not None and task.digest == digest:
                return StartOrder(
                    task=task,
                    request=request,
                    principal=principal_from(data["principal"]),
                    key=data["key"],
                    limits=Limits.model_validate(data["limits"]),
                    oracle=bool(data["oracle"]),
                )
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
