"""A cluster's host: the same front, with episodes hosted by Ray workers (DESIGN §9).

`palaestra serve --ray ADDRESS|auto|local:N` runs the one front (server/manager.py) over this
host behind the unchanged app. The front picks the task and asks the ledger for the token's
quota (`LedgerQuota`); the host holds no episode: it sends the reset to the freest worker
that can host it (placement.py);
steps go to the episode's worker over its channel. The episode → worker map is in the
shared store (written by the worker), so a restarted front, or a second one, routes the
same episodes. A worker whose node or actor is gone is `lost`: its active episodes end
`void` with reason `worker_lost` (the policy did not cause it; the sampler ignores it).
Several fronts may serve one cluster: workers and the ledger are named, detached actors
that the first front creates and every front finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from palaestra.sdk.errors import CapacityError, InvalidActionError, UnavailableError
from palaestra.sdk.failures import Failure, FailureKind
from palaestra.sdk.harness import HARNESS_OPTION
from palaestra.sdk.models import (
    EpisodeState,
    EpisodeStatus,
    ForkResponse,
    Observation,
    ResetResponse,
    StepRequest,
    StepResponse,
    Verdict,
)
from palaestra.server import heldout
from palaestra.server.auth import Principal
from palaestra.server.cluster import depot
from palaestra.server.cluster.channel import ChannelClient, WorkerUnreachable
from palaestra.server.cluster.connect import RayConnection
from palaestra.server.cluster.ledger import LEDGER_NAME, Ledger
from palaestra.server.cluster.metrics import Scrape, exposition
from palaestra.server.cluster.placement import (
    WORKER_FULL,
    Needs,
    WorkerInfo,
    candidates,
    cluster_full,
)
from palaestra.server.cluster.regrades import ClusterRegrades
from palaestra.server.cluster.resume import ClusterCheckpoints
from palaestra.server.cluster.worker import (
    EpisodeWorker,
    order_json,
    principal_json,
    settings_for_workers,
    worker_name,
)
from palaestra.server.config import Settings
from palaestra.server.episode import void_verdict
from palaestra.server.fork import stored_ended
from palaestra.server.host import Accounting, Ending, StartOrder
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.sandboxes import SandboxOwner
from palaestra.server.services import Services
from palaestra.server.store import Store
from palaestra.server.stored_episodes import StoredEpisodes
from palaestra.server.tenancy import candidate_keys, quota_error

if TYPE_CHECKING:
    from palaestra.server.episode import Episode
    from palaestra.server.host import ForkOrder

log = logging.getLogger("palaestra.cluster")

LOST = "worker_lost"
ROUTES_CACHED = 65536
WORKER_START_S = 300.0


@dataclass
class Worker:
    info: WorkerInfo
    handle: Any
    channel: ChannelClient


@dataclass(frozen=True)
class Route:
    worker: str
    task: str


class ClusterHost:
    """The `EpisodeHost` of a cluster front: routing, placement and loss handling."""

    def __init__(self, services: Services, sandboxes: SandboxOwner, accounting: Accounting) -> None:
        self.services = services
        self.settings, self.store = services.settings, services.store
        self.sandboxes = sandboxes  # publish tokens' generators only
        self.accounting = accounting
        self.stored = StoredEpisodes(services.store)
        self.checkpoints = ClusterCheckpoints(self)  # server/cluster/resume.py
        self.quota = LedgerQuota(self)
        self.connection: RayConnection | None = None
        self._poller: asyncio.Task[None] | None = None
        self.ledger: Any = None
        self._ledger_channel: ChannelClient | None = None
        self.workers: dict[str, Worker] = {}
        self._routes: OrderedDict[str, Route] = OrderedDict()
        self._ends_seen: OrderedDict[str, None] = OrderedDict()
        self._over_cpu: set[str] = set()
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._published: set[str] = set()
        self.ledger_starts: list[tuple[str, float]] = []

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self) -> None:
        """Join the cluster, find (or make) the ledger and a worker on every node."""
        # Ray joins (and starts a local cluster) on the main thread only: this blocks the
        # loop once, before the app serves anything.
        self.connection = RayConnection(self.settings)
        self.ledger = self._find_ledger()
        await self._sync_packs()
        await self._refresh_workers(wait=True)
        self._poller = asyncio.create_task(self._poll_forever(), name="palaestra-cluster-poll")

    async def aclose(self) -> None:
        """Workers and the ledger stay for the other fronts (a local cluster goes with us)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for task in self._starting.values():
            task.cancel()
        for worker in self.workers.values():
            await worker.channel.aclose()
        if self._ledger_channel is not None:
            await self._ledger_channel.aclose()
        await self.sandboxes.aclose()  # publish tokens' generators
        if self.connection is not None:
            await asyncio.to_thread(self.connection.close)

    @property
    def ready(self) -> bool:
        return self._poller is not None and not self._poller.done() and bool(self.workers)

    @property
    def live_count(self) -> int:
        return sum(w.info.live for w in self.workers.values())

    def _live_by_status(self) -> dict[str, int]:
        return {EpisodeStatus.ACTIVE.value: self.live_count}

    async def reap(self) -> int:
        return 0  # workers expire their own idle episodes

    def _find_ledger(self) -> Any:
        """The cluster's ledger (made by the first front to ask), on the head node: it lives
        as long as the cluster does."""
        return (
            self._ray()
            .remote(Ledger)
            .options(
                name=LEDGER_NAME,
                namespace=self.settings.ray_namespace,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                resources={"node:__internal_head__": 0.001},
            )
            .remote(self.settings.model_dump_json(), self.ledger_starts)
        )

    async def _ledger(self, method: str, *args: Any) -> Any:
        """A ledger call through Ray; a ledger that died (its node did) is made again, once."""
        for attempt in range(2):
            try:
                return await getattr(self.ledger, method).remote(*args)
            except Exception as exc:
                if attempt or not self._actor_gone(exc):
                    raise
                log.error("the ledger is gone (%s); starting a new one", type(exc).__name__)
                self.ledger = self._find_ledger()
        raise AssertionError("unreachable")

    async def ledger_call(self, method: str, args: dict[str, Any]) -> None:
        """An admit, refund or end over the ledger's channel (every call is idempotent by
        episode key, so one that broke is sent again once the channel is open again)."""
        for attempt in range(2):
            channel = self._ledger_channel
            if channel is None or channel.broken:
                if channel is not None:
                    await channel.aclose()
                where = await self._ledger("open_channel")  # remakes a dead ledger
                channel = ChannelClient(where["host"], where["port"], bytes.fromhex(where["key"]))
                self._ledger_channel = channel
            try:
                await channel.call(method, args)
                return
            except WorkerUnreachable:
                await channel.aclose()
                self._ledger_channel = None
                if attempt:
                    raise UnavailableError(
                        "the cluster's ledger did not answer; retry the request",
                        code="ledger_unreachable",
                        retryable=True,
                        retry_after=1.0,
                    ) from None

    async def exposition(self, own: bytes) -> bytes:
        """The front's series and every live worker's, labelled by worker (cluster/metrics.py)."""
        workers = list(self.workers.values())
        texts = await asyncio.gather(*(self._worker_metrics(w) for w in workers))
        scrapes = [Scrape(w.info, t) for w, t in zip(workers, texts, strict=True)]
        return await asyncio.to_thread(exposition, own, scrapes)

    async def _worker_metrics(self, worker: Worker) -> bytes | None:
        """The worker's exposition; None when it does not answer in time."""
        try:
            text = await asyncio.wait_for(
                worker.handle.metrics.remote(), self.settings.ray_metrics_timeout_s
            )
        except Exception as exc:
            log.warning("worker %s: no metrics (%s)", worker.info.name, type(exc).__name__)
            return None
        return text if isinstance(text, bytes) else None

    # -- workers --------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(self.settings.ray_poll_s)
            rounds += 1
            try:
                await self._refresh_workers(wait=False)
                self._over_cpu = set(await self._ledger("over_cpu"))
                if rounds % 5 == 0:
                    await self._sync_packs()
            except Exception:
                log.exception("cluster poll failed")

    async def _refresh_workers(self, wait: bool) -> None:
        ray = self._ray()
        nodes = await asyncio.to_thread(ray.nodes)
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        for name, worker in list(self.workers.items()):
            if worker.info.node not in alive:
                await self.lose(name, "its node left the cluster")
        checks = [self._check(name, w) for name, w in self.workers.items()]
        await asyncio.gather(*checks)
        for node in alive:
            name = worker_name(node)
            if name not in self.workers and name not in self._starting:
                self._starting[name] = asyncio.create_task(self._start_worker(name, node))
        if wait and self._starting:
            await asyncio.gather(*self._starting.values(), return_exceptions=True)

    async def _check(self, name: str, worker: Worker) -> None:
        try:
            info = await asyncio.wait_for(worker.handle.info.remote(), 10.0)
        except Exception as exc:
            if self._actor_gone(exc):
                await self.lose(name, f"its actor is gone ({type(exc).__name__})")
            return
        worker.info = WorkerInfo(**info)

    def _actor_gone(self, exc: BaseException) -> bool:
        errors = self._ray().exceptions
        return isinstance(exc, errors.RayActorError | errors.ActorDiedError)

    async def _start_worker(self, name: str, node: str) -> None:
        ray = self._ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        secret_file = self.settings.heldout_secret_file or (
            self.settings.data_dir / heldout.SECRET_FILE
        )
        secret = await asyncio.to_thread(heldout.ensure_secret, secret_file)
        handle = (
            ray.remote(EpisodeWorker)
            .options(
                name=name,
                namespace=self.settings.ray_namespace,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_restarts=0,
                max_concurrency=10_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            )
            .remote(name, settings_for_workers(self.settings), secret)
        )
        try:
            info = WorkerInfo(
                **await asyncio.wait_for(handle.start.remote(self.ledger), WORKER_START_S)
            )
        except Exception as exc:
            log.error("worker %s on node %s did not start: %s", name, node, exc)
            return
        finally:
            self._starting.pop(name, None)
        channel = ChannelClient(info.host, info.port, bytes.fromhex(info.key))
        self.workers[name] = Worker(info, handle, channel)
        log.info("worker %s ready on node %s (%d slots)", name, node, info.slots)

    async def lose(self, name: str, why: str) -> int:
        """Worker `name` is gone: its active episodes end void (`worker_lost`); how many."""
        worker = self.workers.pop(name, None)
        if worker is not None:
            await worker.channel.aclose()
        keys = await self.store.active_on(name)
        kept = await self.checkpoints.lost(keys)  # checkpointed: resumed elsewhere below
        ended = [key for key in keys if key not in kept]
        for key in ended:
            await self._void_lost(key)
        if ended:
            await self.ledger_call("ended", {"keys": ended})
        await self.store.commit()  # the voids are on disk before the loss is reported
        log.warning("worker %s lost (%s): %d episodes void", name, why, len(ended))
        left = await self.checkpoints.resume_lost(kept)
        if left:
            await self.ledger_call("ended", {"keys": left})
        return len(keys)

    async def _void_lost(self, key: str) -> None:
        state = await self.store.load_episode(key, False)
        if state is None or state.status is not EpisodeStatus.ACTIVE:
            return
        try:
            digest = self.services.packs.resolve(state.task).digest
        except Exception:
            digest = ""
        now = time.time()
        state.status, state.void_reason = EpisodeStatus.VOID, LOST
        state.failure = Failure.of(FailureKind.WORKER_LOST, LOST)
        state.ended_at = state.updated_at = now
        state.verdict = void_verdict(digest, LOST, 0.0, FailureKind.WORKER_LOST)
        self.store.put_verdict(key, state.verdict)
        self.store.update_episode(state)
        self.accounting.ended(Ending(key, "", state.task, "void", 0.0, False, LOST, now))
        self.services.metrics.episodes_ended.labels(status="void").inc()
        self.services.metrics.episode_failures.labels("worker_lost", "server").inc()

    async def _unreachable(self, worker: Worker) -> bool:
        """After a broken channel: whether Ray says the worker is gone (then it is lost)."""
        try:
            await asyncio.wait_for(worker.handle.info.remote(), 10.0)
        except Exception as exc:
            if self._actor_gone(exc) or isinstance(exc, TimeoutError):
                await self.lose(worker.info.name, f"unreachable ({type(exc).__name__})")
                return True
        return False

    def _ray(self) -> Any:
        if self.connection is None:
            raise UnavailableError("this front has not joined its cluster", code="not_ready")
        return self.connection.ray

    async def _sync_packs(self) -> None:
        """Export what this front has published; load what other fronts published."""
        registry = self.services.registry
        if registry is None:
            return
        rows = await asyncio.to_thread(registry.published)
        new = [r for r in rows if r.digest not in self._published]
        if not new:
            return
        await asyncio.to_thread(depot.sync_published, self.services)
        for row in new:
            try:
                await asyncio.to_thread(depot.export, registry, self.store, row)
                self._published.add(row.digest)
            except Exception as exc:  # not on this front: another front exports it
                log.debug("pack %s@%s not exported here: %s", row.name, row.version, exc)

    # -- episodes -------------------------------------------------------------------------
    async def start(self, order: StartOrder) -> ResetResponse:
        if HARNESS_OPTION in order.request.options:  # docs/decisions.md (cluster mode)
            raise InvalidActionError(
                "harness episodes are not supported in cluster mode (--ray) yet: the model "
                "session lives on the worker that hosts the sandbox; run them on an embedded "
                "`palaestra serve`",
                code="harness_unsupported",
            )
        task = order.task
        needs = Needs.of(self.services.families.get(task.family), task, self.settings)
        infos = [w.info for w in self.workers.values()]
        where = f"family {task.family!r}"
        order_ = candidates(infos, needs, self.settings.ray_overcommit, where)  # or 503
        args = {"order": order_json(order), "needs": needs.to_json()}
        body, chosen = await self._place(order_, args)
        chosen.info.live += 1
        self._remember(order.key, Route(chosen.info.name, task.ref))
        reply = ResetResponse.model_validate_json(body)
        reply.info["worker"] = chosen.info.name
        return reply

    async def _place(self, order: list[WorkerInfo], args: dict[str, Any]) -> tuple[bytes, Worker]:
        """Try the workers in `order` until one takes the episode; 429 when all refuse."""
        refusals: list[str] = []
        for info in order:
            worker = self.workers.get(info.name)
            if worker is None:
                continue
            try:
                return await worker.channel.call("reset", args), worker
            except CapacityError as exc:
                if exc.code != WORKER_FULL:
                    raise
                refusals.append(exc.message)
                worker.info.live = worker.info.slots  # until its next report
            except WorkerUnreachable:
                await self._unreachable(worker)
        raise cluster_full(refusals)

    def _remember(self, key: str, route: Route) -> None:
        self._routes[key] = route
        if len(self._routes) > ROUTES_CACHED:
            self._routes.popitem(last=False)

    async def _route(self, principal: Principal, episode_id: str) -> tuple[str, Route] | None:
        """The key and route of the episode `episode_id` may name (its worker checks whose
        it is); None when no worker ever hosted such an episode."""
        keys = candidate_keys(principal.token_id, episode_id)
        for key in keys:
            route = self._routes.get(key)
            if route is not None:
                return key, route
        for key in keys:
            found = await self.store.placement(key)
            if found is not None:
                route = Route(found[0], "")
                self._remember(key, route)
                return key, route
        return None

    async def _call(self, route: Route, method: str, args: dict[str, Any]) -> bytes | None:
        """The worker's answer; None when the worker is lost (the store answers then)."""
        worker = self.workers.get(route.worker)
        if worker is None:
            return None
        try:
            return await worker.channel.call(method, args)
        except WorkerUnreachable:
            if await self._unreachable(worker):
                return None
            raise UnavailableError(
                f"worker {route.worker} did not answer; retry the request",
                code="worker_unreachable",
                retryable=True,
                retry_after=1.0,
            ) from None

    async def _saw_end(
        self, key: str, route: Route, status: str, verdict: dict[str, Any] | None
    ) -> None:
        """An episode ended through this front: the ledger hears it before the client does
        (so the token's next reset, through any front, sees the slot free)."""
        if key in self._ends_seen:
            return
        self._ends_seen[key] = None
        if len(self._ends_seen) > ROUTES_CACHED:
            self._ends_seen.popitem(last=False)
        await self.ledger_call("ended", {"keys": [key]})
        worker = self.workers.get(route.worker)
        if worker is not None and worker.info.live > 0:
            worker.info.live -= 1
        verdict = verdict or {}
        reason = verdict.get("feedback") if status == EpisodeStatus.VOID.value else None
        task = route.task
        if not task:  # started through another front: the store knows its task
            stored = await self.store.load_episode(key, False)
            task = stored.task if stored is not None else ""
        self.accounting.ended(
            Ending(
                key=key,
                owner="",  # the ledger counts live episodes in a cluster
                task=task,
                status=status,
                reward=float(verdict.get("reward", 0.0)),
                passed=bool(verdict.get("passed", False)),
                reason=reason,
                at=time.time(),
            )
        )

    async def step(
        self, principal: Principal, episode_id: str, request: StepRequest
    ) -> StepResponse:
        found = await self._route(principal, episode_id)
        if found is None:  # stored, or 404
            key = await self.stored.key(principal, episode_id)
            return await self.stored.step(key, episode_id, request.request_id)
        key, route = found
        if principal.token_id in self._over_cpu:
            limit = self.services.tenancy.limits(principal)[2] or 0.0
            raise quota_error(
                "sandbox CPU-seconds per hour", limit, 60.0, "wait for the hour to roll on"
            )
        args = {
            "id": episode_id,
            "request": request.model_dump(mode="json"),
            "principal": principal_json(principal),
        }
        body = await self._call(route, "step", args)
        if body is None:
            return await self._after_loss(key, episode_id, request, principal)
        reply = StepResponse.model_validate_json(body)
        if reply.terminated or reply.truncated:
            status = str(reply.info.get("status", EpisodeStatus.DONE.value))
            await self._saw_end(key, route, status, reply.info.get("verdict"))
        return reply

    async def _after_loss(
        self, key: str, episode_id: str, request: StepRequest, principal: Principal
    ) -> StepResponse:
        """A step for an episode whose worker is lost: a replay from the store, or void."""
        key = await self.stored.key(principal, episode_id)  # ownership checked as always
        if request.request_id:
            stored = await self.store.find_step(key, request.request_id)
            if stored is not None:
                return stored
        state = await self.stored.load(key, episode_id)
        if state.status is EpisodeStatus.VOID and state.void_reason == LOST:
            verdict = state.verdict.model_dump(mode="json") if state.verdict else None
            failure = state.failure.model_dump(mode="json") if state.failure else None
            return StepResponse(
                observation=Observation(text=f"episode void: {LOST} (its worker is gone)"),
                terminated=True,
                info={
                    "status": "void",
                    "void_reason": LOST,
                    "verdict": verdict,
                    "failure": failure,
                },
            )
        return await self.stored.step(key, episode_id, request.request_id)

    async def verify(self, principal: Principal, episode_id: str) -> Verdict:
        found = await self._route(principal, episode_id)
        if found is not None:
            key, route = found
            args = {"id": episode_id, "principal": principal_json(principal)}
            body = await self._call(route, "verify", args)
            if body is not None:
                verdict = Verdict.model_validate_json(body)
                status = EpisodeStatus.VOID if verdict.status == "void" else EpisodeStatus.DONE
                await self._saw_end(key, route, status.value, verdict.model_dump(mode="json"))
                return verdict
        key = await self.stored.key(principal, episode_id)
        return await self.stored.verdict(key, episode_id)

    async def state(self, principal: Principal, episode_id: str) -> EpisodeState:
        found = await self._route(principal, episode_id)
        if found is not None:
            args = {"id": episode_id, "principal": principal_json(principal)}
            body = await self._call(found[1], "state", args)
            if body is not None:
                return EpisodeState.model_validate_json(body)
        key = await self.stored.key(principal, episode_id)
        return await self.stored.load(key, episode_id)

    async def close(self, principal: Principal, episode_id: str) -> None:
        found = await self._route(principal, episode_id)
        if found is not None:
            key, route = found
            args = {"id": episode_id, "principal": principal_json(principal)}
            if await self._call(route, "close", args) is not None:
                await self._saw_end(key, route, EpisodeStatus.CLOSED.value, None)
                return
        await self.stored.key(principal, episode_id)  # 404: not the caller's

    async def fork(self, order: ForkOrder) -> ForkResponse:
        """On the parent's worker (a fork copies its sandbox there); the fork is routed
        there from then on, by every front (its placement is stored first)."""
        found = await self._route(order.principal, order.parent_id)
        if found is not None:
            route = found[1]
            args = {
                "principal": principal_json(order.principal),
                "parent": order.parent_id,
                "request": order.request.model_dump(mode="json"),
                "key": order.key,
            }
            body = await self._call(route, "fork", args)
            if body is not None:
                worker = self.workers.get(route.worker)
                if worker is not None:
                    worker.info.live += 1
                self._remember(order.key, Route(route.worker, route.task))
                reply = ForkResponse.model_validate_json(body)
                reply.info["worker"] = route.worker
                return reply
        key = await self.stored.key(order.principal, order.parent_id)  # 404: not the caller's
        raise await stored_ended(self.store, key, order.parent_id)  # 409: its worker is gone

    async def owned(self, principal: Principal, episode_id: str) -> tuple[Episode | None, str]:
        """No episode is held on a front: the store's key (404 when not the caller's)."""
        return None, await self.stored.key(principal, episode_id)


class LedgerQuota:
    """The `Quota` of a cluster: the ledger actor counts every front's admissions."""

    def __init__(self, host: ClusterHost) -> None:
        self.host = host

    async def restore(self, starts: list[tuple[str, float]]) -> None:
        self.host.ledger_starts = starts  # the ledger is made with them, if this front makes it

    async def admit(self, principal: Principal, key: str) -> float:
        await self.host.ledger_call("admit", {"principal": principal_json(principal), "key": key})
        return 0.0

    async def refund(self, principal: Principal, key: str, ticket: float) -> None:
        await self.host.ledger_call("refund", {"key": key})


def build_front(settings: Settings) -> EpisodeManager:
    """A front over a cluster; published packs are exported for the workers at once."""
    from palaestra.server.manager import FrontAccounts
    from palaestra.server.runtime import build_parts

    def exporter(store: Store, registry: PackRegistry) -> Callable[[], Awaitable[None]]:
        async def export() -> None:
            await asyncio.to_thread(depot.export_all, registry, store)

        return export

    parts = build_parts(settings, cluster_node=True, hosts_episodes=False, after_publish=exporter)
    services = parts.services
    host = ClusterHost(services, parts.sandboxes, FrontAccounts(services.tenancy, services.sampler))
    manager = EpisodeManager(services, host, host.quota)
    manager.regrader.remote = ClusterRegrades(host).regrade  # on the worker that kept it
    return manager
