"""Building a server from settings: backend, store, packs, families, the host and its front."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from palaestra.sandbox import Backend
from palaestra.sandbox.base import SocketService
from palaestra.sandbox.egress import EgressProxy
from palaestra.sandbox.forkserver import PythonForkServer
from palaestra.sandbox.pool import WarmPool
from palaestra.server import heldout, served
from palaestra.server.auth import Authenticator, ensure_admin_token
from palaestra.server.catalog import Catalog
from palaestra.server.cluster import depot
from palaestra.server.config import Settings
from palaestra.server.draws import Depot, DrawBook, DrawKeeper
from palaestra.server.families import FamilyRegistry, unjudged_families
from palaestra.server.harness.proxy import SessionProxy
from palaestra.server.judges import ServerJudges
from palaestra.server.local_host import LocalHost
from palaestra.server.manager import EpisodeManager, FrontAccounts
from palaestra.server.metrics import Metrics
from palaestra.server.packs.archive import ArchiveLimits
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.gencache import GeneratedTaskCache
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.packs.taskfields import HostPolicy
from palaestra.server.packs.warming import WARM_LOG, PackWarmer
from palaestra.server.sampler import Sampler
from palaestra.server.sandboxes import SandboxOwner
from palaestra.server.services import Services
from palaestra.server.store import Store
from palaestra.server.tenancy import LocalQuota, Tenancy


def make_backend(settings: Settings, *, gateway: SocketService | None = None) -> Backend:
    """The configured sandbox backend. `gateway` serves the one listener of a harness
    episode's sandbox (`SandboxSpec.gateway`: the session model proxy's `gateway`); None:
    a spec with `gateway` is refused."""
    name = settings.sandbox
    # The only way out of a sandbox whose task declares internet access.
    egress = EgressProxy.from_settings(settings.egress_allow, settings.egress_private)
    if name == "bwrap":
        from palaestra.sandbox.bwrap import BwrapBackend

        return BwrapBackend(
            cache=settings.cache,
            images_dir=settings.images_dir,
            exec_helper=settings.exec_helper,
            egress=egress,
            gateway=gateway,
        )
    if name == "docker":
        from palaestra.sandbox.docker import DockerBackend

        return DockerBackend(
            default_image=settings.docker_image,
            cache=settings.cache,
            egress=egress,
            gateway=gateway,
        )
    if name == "e2b":
        from palaestra.sandbox.e2b import E2BBackend

        key = settings.e2b_api_key
        return E2BBackend(api_key=key.get_secret_value() if key else None)
    raise ValueError(f"unknown sandbox backend {name!r}; this version has: bwrap, docker, e2b")


def with_pool(backend: Backend, settings: Settings) -> Backend:
    """Wrap `backend` in a warm pool of `settings.pool_size` per spec (0: no pool)."""
    if settings.pool_size <= 0:
        return backend
    return WarmPool(backend, size=settings.pool_size, max_total=settings.pool_max_total)


@dataclass
class Parts:
    """What a server is built from: the shared services, and what hosts episodes here."""

    services: Services
    sandboxes: SandboxOwner


def build_parts(
    settings: Settings,
    *,
    backend: Backend | None = None,
    cluster_node: bool = False,
    admin_token: bool = True,
    background_warm: bool = False,
    hosts_episodes: bool = True,
    families: FamilyRegistry | None = None,
    after_publish: Callable[[Store, PackRegistry], Callable[[], Awaitable[None]]] | None = None,
) -> Parts:
    """The parts on the embedded defaults.

    `cluster_node`: built for a cluster's worker or front (server/cluster/): published packs
    missing from this node's data dir are fetched from the shared store by digest.
    `admin_token`: write the local admin token (workers authenticate nobody).
    `background_warm`: packs whose generated tasks are not cached are generated after
    `start()`, in a process of their own, while the others are served; False: before this
    returns. `hosts_episodes`: False for a cluster front, whose sandboxes only run publish
    tokens' generators (no warm pool, fork server or model sessions).
    `families`: the families to serve (None: the installed ones, discovered).
    `after_publish`: what runs after a pack is published (made from the store and registry)."""
    if families is None:
        families = FamilyRegistry.discover(settings)  # each with its slice of `families`
    secret_file = settings.heldout_secret_file or settings.data_dir / heldout.SECRET_FILE
    secret = heldout.ensure_secret(secret_file)  # sealed generated seeds
    task_cache = GeneratedTaskCache(settings.cache / "generated")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(
        settings.database(),
        max_backlog_bytes=settings.store_max_backlog_mb << 20,
        token_backlog_bytes=settings.store_token_backlog_mb << 20,
    )
    draws = DrawBook(store.db)  # the held-out draw each rotated sealed split serves
    packs = PackCatalog(secret, task_cache)
    packs.draws.update(draws.current())
    policy = HostPolicy.from_settings(settings)  # what a task's image and paths may name
    broken = families.unavailable()  # families that failed to import: their packs are 503
    packs.load_dirs(settings.packs_dirs, families.all(), policy, broken, cached_only=True)
    if packs.warming:  # generated in a process of their own (server/packs/warming.py)
        warmer = PackWarmer(packs, task_cache.folder, settings.data_dir / "logs" / WARM_LOG)
        if background_warm:
            packs.warmer = warmer  # EpisodeManager.start starts it
        else:
            warmer.run_blocking()
    if settings.auth == "token" and admin_token:
        ensure_admin_token(settings.data_dir, store.db)
    # Published packs (the server's content-addressed store) after the built-in ones.
    limits = ArchiveLimits.from_settings(settings)  # bombs are refused while they inflate
    registry = PackRegistry(
        settings.data_dir,
        store.db,
        archive_limits=limits,
        queued_per_publisher=settings.publish_queue_per_publisher,
    )
    fetch = functools.partial(depot.fetch, registry, store) if cluster_node else None
    registry.load_into(packs, families.all(), policy, broken, fetch=fetch)
    fork_server, proxy = None, None
    if hosts_episodes:
        proxy = SessionProxy(settings)
    if backend is None:
        if settings.sandbox in ("bwrap", "docker"):
            served.preflight(settings.sandbox)  # `serve` told the user already; ServeError
        backend = make_backend(settings, gateway=proxy.gateway if proxy else None)
        if hosts_episodes:
            backend = with_pool(backend, settings)
            fork_server = make_fork_server(settings)
    metrics = Metrics()
    if isinstance(backend, WarmPool):
        metrics.bind_pool(backend.stats)
    sandboxes = SandboxOwner(settings, backend, fork_server)
    sampler = Sampler(settings, packs, unjudged=unjudged_families(settings, families))
    catalog = Catalog(
        settings,
        families=families,
        packs=packs,
        sampler=sampler,
        store=store,
        registry=registry,
        sandboxes=sandboxes,
        after_publish=after_publish(store, registry) if after_publish else None,
    )
    services = Services(
        settings=settings,
        store=store,
        families=families,
        packs=packs,
        registry=registry,
        sampler=sampler,
        catalog=catalog,
        metrics=metrics,
        judges=ServerJudges.from_settings(settings, metrics.judges),  # shared by all episodes
        tenancy=Tenancy(settings),
        auth=Authenticator(store.db, settings.auth),
        sessions=proxy,
    )
    shared = None  # a cluster node shares a rotated generator pack's tasks through the store
    if cluster_node:
        export = functools.partial(depot.export_generated, registry, store)
        shared = Depot(export, functools.partial(depot.fetch_generated, registry, store))
    services.draws = DrawKeeper(
        settings, packs, draws, sampler, registry, generate=catalog.generate_draw, depot=shared
    )
    return Parts(services, sandboxes)


def build_manager(
    settings: Settings,
    *,
    backend: Backend | None = None,
    background_warm: bool = False,
    families: FamilyRegistry | None = None,
) -> EpisodeManager:
    """The front over this process's episodes (a cluster's, with `settings.ray`); call
    `await manager.start()` inside the event loop. `background_warm`: see `build_parts`
    (`palaestra serve` and `palaestra run` pass `settings.background_warm`)."""
    if settings.ray:
        from palaestra.server.cluster.front import build_front

        return build_front(settings)
    parts = build_parts(
        settings, backend=backend, background_warm=background_warm, families=families
    )
    services = parts.services
    accounts = FrontAccounts(services.tenancy, services.sampler)
    host = LocalHost(services, parts.sandboxes, accounts)
    return EpisodeManager(services, host, LocalQuota(services.tenancy))


def make_fork_server(settings: Settings) -> PythonForkServer | None:
    """One-shot Python sandboxes beside the bwrap backend (`forkserver` false: none).

    It starts at the first run; where it cannot, callers fall back to the backend."""
    if settings.sandbox != "bwrap" or not settings.forkserver:
        return None
    return PythonForkServer()
