"""The server's shared parts, built once (server/runtime.py) and handed to whoever needs them:
the front, its host, the routes and the doors (`services_of` in server/caller.py)."""

from __future__ import annotations

from dataclasses import dataclass

from palaestra.server.auth import Authenticator
from palaestra.server.catalog import Catalog
from palaestra.server.config import Settings
from palaestra.server.draws import DrawKeeper
from palaestra.server.families import FamilyRegistry
from palaestra.server.harness.proxy import SessionProxy
from palaestra.server.judges import ServerJudges
from palaestra.server.metrics import Metrics
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.sampler import Sampler
from palaestra.server.store import Store
from palaestra.server.tenancy import Tenancy


@dataclass
class Services:
    settings: Settings
    store: Store
    families: FamilyRegistry
    packs: PackCatalog  # what is served: built-in and published packs
    registry: PackRegistry | None  # the published packs' store (None: publishing is off)
    sampler: Sampler
    catalog: Catalog  # what the read-only and publishing routes answer
    metrics: Metrics
    judges: ServerJudges  # shared by every episode's verifier and by group judging
    tenancy: Tenancy  # per-token counters of this front
    auth: Authenticator  # bearer token -> principal (cached; a revoke `forget`s)
    sessions: SessionProxy | None = None  # harness episodes' model sessions (None: no harness)
    draws: DrawKeeper | None = None  # held-out draws: rotation and its schedule
