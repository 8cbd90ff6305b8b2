"""The published-pack registry: which `name@version` is published, by whom, with which digest.

The table `published_packs` (name, version, digest, published_at, publisher, bytes) of the
server's database (server/db.py) is its index, and a row there is what makes a version
live; the pack itself is a folder of the on-disk store (server/packs/store.py). Rules:

- the archive is verified before anything is installed: it extracts safely
  (server/packs/archive.py), and `load_pack` accepts it with the server's families (which
  also checks a `pack.lock` in it against the files and the pack digest);
- a published `name@version` is immutable: the same digest again is a no-op (200), other
  bytes are refused (409, "bump the version");
- installation is atomic: the store unpacks and renames the folder into place, then the
  index row is written; a failure at any point leaves nothing half-installed (an orphan
  folder without a row is never served, and is reused by the next publish);
- a pack that runs Python inside the server when it loads (`[source] python = …`) can
  only be published by an admin token; a publish token's generator pack (`[generators.*]`)
  is generated at publish in sandboxes (server/packs/generate.py), its tasks stored beside
  the pack (server/packs/genstore.py) and served from there: its code never runs in the
  server (an admin's generator pack still loads in-process, docs/reference/packs.md);
- pack names have owners (`PublishRights`): a publish token publishes only into the orgs an
  admin granted it, the built-in orgs (Settings.builtin_orgs) are admin-only (403
  `org_not_granted`), so nobody else can add a version that an unpinned `org/name`
  resolves to; each publisher stores at most Settings.publisher_max_bytes installed bytes
  and publisher_max_versions versions (413 `publish_quota`: retrying never helps, and a
  429 would tell clients to retry);
- a pack a non-admin publishes is held out of unfiltered sampling until an admin enables
  its name (`enable`, table `enabled_packs`); explicit refs and `pack=` still reach it;
- a version its publisher (or an admin) yanks (`yank`, column `yanked_at`) stays installed
  and reachable by `name@version` or digest, but `name` alone, and so sampling, skip it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from palaestra.sandbox import SandboxError
from palaestra.sdk.errors import (
    BadRequestError,
    CapacityError,
    ConflictError,
    NotFoundError,
    PalaestraError,
    PermissionDeniedError,
    UnavailableError,
)
from palaestra.server.db import Database
from palaestra.server.packs.archive import ArchiveLimits
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.generate import GenerationError
from palaestra.server.packs.genstore import GeneratedStore, canonical
from palaestra.server.packs.loader import GeneratedSet, Pack, PackUnavailable, load_pack
from palaestra.server.packs.lock import pack_digest, pack_files
from palaestra.server.packs.manifest import PackError, PackManifest, read_manifest
from palaestra.server.packs.store import PackStore
from palaestra.server.packs.taskfields import HostPolicy
from palaestra.server.packs.validator import TaskValidator

log = logging.getLogger("palaestra.registry")

# Runs a generator pack's generators in sandboxes (server/packs/generate.py); async on the
# server's loop, called through `Generate` from an install thread.
AsyncGenerate = Callable[[Path, PackManifest], Coroutine[Any, Any, GeneratedSet]]
Generate = Callable[[Path, PackManifest], GeneratedSet]


@dataclass(frozen=True)
class Published:
    name: str
    version: str
    digest: str
    published_at: float
    publisher: str
    generated: str = ""  # the digest of its stored generated tasks' index ("" for none)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "published_at": self.published_at,
            "publisher": self.publisher,
        }


class QuotaExceededError(PalaestraError):
    """A publisher's storage quota is spent (413: a retry never helps; an admin raises it)."""

    status = 413
    default_code = "publish_quota"


@dataclass(frozen=True)
class PublishRights:
    """What one publisher may do: its orgs (None: any, an admin), its storage quota (None:
    unlimited), and whether what it publishes joins unfiltered sampling at once."""

    orgs: frozenset[str] | None = None
    builtin_orgs: frozenset[str] = frozenset()
    max_bytes: int | None = None
    max_versions: int | None = None
    enable: bool = True

    @classmethod
    def publisher(
        cls,
        orgs: Iterable[str],
        *,
        builtin_orgs: Iterable[str],
        max_bytes: int,
        max_versions: int,
    ) -> PublishRights:
        """A publish token's rights (not an admin's)."""
        return cls(frozenset(orgs), frozenset(builtin_orgs), max_bytes, max_versions, False)

    def check_org(self, name: str) -> None:
        if self.orgs is None:
            return
        org = name.split("/", 1)[0]
        if org in self.builtin_orgs:
            raise PermissionDeniedError(
                f"org {org!r} is built in ({', '.join(sorted(self.builtin_orgs))}): only an "
                "admin token may publish into it; publish under an org granted to your token",
                code="org_not_granted",
            )
        if org not in self.orgs:
            granted = ", ".join(sorted(self.orgs)) or "none"
            raise PermissionDeniedError(
                f"this token may not publish into org {org!r} (it is granted: {granted}); "
                f"ask an admin for one that is: `palaestra token create --scope publish "
                f"--org {org}`",
                code="org_not_granted",
            )


ADMIN_RIGHTS = PublishRights()


@dataclass
class _Turn:
    """A publisher's queue of publishes: one installs at a time."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # publishes holding or waiting for the lock


class PackRegistry:
    """Published pack versions, indexed in `db`; their folders are in the store under
    `<data_dir>/packs/` (`store`)."""

    def __init__(
        self,
        data_dir: Path,
        db: Database,
        *,
        archive_limits: ArchiveLimits | None = None,
        install_workers: int = 2,
        install_queue: int = 8,
        queued_per_publisher: int = 4,
    ) -> None:
        self.store = PackStore(data_dir, archive_limits)
        self.generated = GeneratedStore(self.store.root)
        self.db = db
        self._lock = threading.Lock()
        # Installs run on their own few threads (never asyncio's shared pool, which every
        # store flush needs); past `install_queue` waiting, a publish is refused with 429.
        self._installer = ThreadPoolExecutor(install_workers, thread_name_prefix="pack-install")
        self._install_queue = install_queue
        self._installing = 0
        # One install at a time per publisher (the rest of its publishes wait their turn), so
        # one publisher never holds more than one install thread: the others get the rest.
        self._queued_per_publisher = queued_per_publisher
        self._turns: dict[str, _Turn] = {}

    async def ainstall(
        self,
        data: bytes | BinaryIO,
        *,
        publisher: str,
        generate: AsyncGenerate | None = None,
        **kwargs: Any,
    ) -> tuple[Pack, bool]:
        """`install` off the event loop, on the registry's bounded pool of install threads,
        one at a time per publisher; `generate` runs on this loop while its install thread
        waits."""
        turn = self._turns.get(publisher)
        if turn is None:
            turn = self._turns[publisher] = _Turn()
        if turn.waiting >= self._queued_per_publisher:
            raise CapacityError(
                f"publisher {publisher!r} has {turn.waiting} publishes in progress already, "
                "the most it may queue; wait for them to finish",
                code="publish_busy",
                retry_after=2.0,
            )
        turn.waiting += 1
        try:
            async with turn.lock:
                return await self._install_off_loop(data, publisher, generate, kwargs)
        finally:
            turn.waiting -= 1
            if not turn.waiting:
                del self._turns[publisher]

    async def _install_off_loop(
        self,
        data: bytes | BinaryIO,
        publisher: str,
        generate: AsyncGenerate | None,
        kwargs: dict[str, Any],
    ) -> tuple[Pack, bool]:
        if self._installing >= self._install_queue:
            raise CapacityError(
                f"{self._installing} pack archives are being installed; retry shortly",
                code="publish_busy",
                retry_after=2.0,
            )
        self._installing += 1
        try:
            loop = asyncio.get_running_loop()
            blocking: Generate | None = None
            if generate is not None:
                run = generate

                def blocking(root: Path, manifest: PackManifest) -> GeneratedSet:
                    return asyncio.run_coroutine_threadsafe(run(root, manifest), loop).result()

            install = functools.partial(
                self.install, data, publisher=publisher, generate=blocking, **kwargs
            )
            return await loop.run_in_executor(self._installer, install)
        finally:
            self._installing -= 1

    # -- index ------------------------------------------------------------------------------
    def published(self, name: str | None = None) -> list[Published]:
        with self.db.connection() as db:
            rows = db.execute(
                "SELECT name, version, digest, published_at, publisher, generated"
                " FROM published_packs"
                + (" WHERE name=?" if name else "")
                + " ORDER BY name, published_at",
                (name,) if name else (),
            ).fetchall()
        return [Published(*row) for row in rows]

    def find(self, name: str, version: str) -> Published | None:
        with self.db.connection() as db:
            row = db.execute(
                "SELECT name, version, digest, published_at, publisher, generated"
                " FROM published_packs"
                " WHERE name=? AND version=?",
                (name, version),
            ).fetchone()
        return Published(*row) if row else None

    def enabled(self) -> set[str]:
        """Names an admin let into unfiltered sampling."""
        with self.db.connection() as db:
            return {row[0] for row in db.all("SELECT name FROM enabled_packs")}

    def enable(self, name: str, by: str, catalog: PackCatalog | None = None) -> bool:
        """Let the sampler draw `name` unfiltered; False if it already could."""
        if not self.published(name):
            raise NotFoundError(f"no published pack {name!r}; GET /v1/packs lists the packs")
        with self.db.connection() as db:
            added = db.execute(
                "INSERT INTO enabled_packs (name, enabled_at, enabled_by) VALUES (?,?,?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, time.time(), by),
            ).rowcount
        if catalog is not None:
            catalog.enable(name)
        return bool(added)

    def yanked(self) -> set[tuple[str, str]]:
        """The (name, version) pairs yanked."""
        with self.db.connection() as db:
            sql = "SELECT name, version FROM published_packs WHERE yanked_at IS NOT NULL"
            return {(row[0], row[1]) for row in db.all(sql)}

    def yank(
        self,
        name: str,
        version: str,
        by: str,
        *,
        admin: bool = False,
        undo: bool = False,
        catalog: PackCatalog | None = None,
    ) -> bool:
        """Yank `name@version` (or, `undo`, restore it); only its publisher or an admin may.
        False if it already was (or was not) yanked."""
        row = self.find(name, version)
        if row is None:
            raise NotFoundError(
                f"no published version {name}@{version}; GET /v1/packs/{name} lists its versions"
            )
        if not admin and row.publisher != by:
            raise PermissionDeniedError(
                f"{name}@{version} was published by another publisher; only its publisher or "
                "an admin may yank it",
                code="not_owner",
            )
        with self.db.connection() as db:
            if undo:
                sql = "UPDATE published_packs SET yanked_at=NULL, yanked_by=NULL"
                changed = db.execute(
                    sql + " WHERE name=? AND version=? AND yanked_at IS NOT NULL", (name, version)
                ).rowcount
            else:
                sql = "UPDATE published_packs SET yanked_at=?, yanked_by=?"
                changed = db.execute(
                    sql + " WHERE name=? AND version=? AND yanked_at IS NULL",
                    (time.time(), by, name, version),
                ).rowcount
        if catalog is not None:
            catalog.yank(name, version, not undo)
        log.info("pack %s@%s %s by %s", name, version, "unyanked" if undo else "yanked", by)
        return bool(changed)

    def usage(self, publisher: str) -> tuple[int, int]:
        """(installed bytes, versions) this publisher has published."""
        with self.db.connection() as db:
            row = db.execute(
                "SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM published_packs WHERE publisher=?",
                (publisher,),
            ).fetchone()
        return int(row[0]), int(row[1])

    def _check_quota(self, rights: PublishRights, publisher: str, size: int) -> None:
        used, versions = self.usage(publisher)
        fix = "ask an admin to raise it (Settings publisher_max_bytes / publisher_max_versions)"
        if rights.max_versions is not None and versions + 1 > rights.max_versions:
            raise QuotaExceededError(
                f"publisher {publisher!r} has published {versions} pack versions, the most "
                f"it may (publisher_max_versions={rights.max_versions}); {fix}"
            )
        if rights.max_bytes is not None and used + size > rights.max_bytes:
            raise QuotaExceededError(
                f"publisher {publisher!r} stores {used} bytes; this pack ({size} bytes) would "
                f"pass its quota of {rights.max_bytes} bytes (publisher_max_bytes); {fix}"
            )

    # -- load at start ----------------------------------------------------------------------
    def load_into(
        self,
        catalog: PackCatalog,
        families: Iterable[str | TaskValidator],
        policy: HostPolicy | None = None,
        broken: Mapping[str, str] | None = None,
        *,
        fetch: Callable[[Published], None] | None = None,
    ) -> int:
        """Serve every published pack not served yet; a broken one goes to `catalog.errors`,
        never fatal (one of a family that failed to import, `broken`, to
        `catalog.unavailable`). `fetch` brings a row's folders to this node first (a
        cluster's workers: server/cluster/depot.py).

        The task checks run again (`policy`): a pack published before them, or under a
        wider image list, is refused here rather than reaching a sandbox."""
        known = list(families)
        loaded = 0
        enabled = self.enabled()
        for name, version in self.yanked():
            catalog.yank(name, version)
        for row in self.published():
            where = f"{row.name}@{row.version}"
            served = _served(catalog, row.name, row.version)
            if served is not None and served.digest == row.digest:
                continue
            try:
                if fetch is not None:
                    fetch(row)
                path = self.store.path_of(row.digest)
                # Generated in sandboxes at publish: served from the store, never imported.
                stored = self.generated.load(row.digest, row.generated) if row.generated else None
                pack = load_pack(
                    path,
                    known,
                    policy,
                    secret=catalog.secret,
                    cache=catalog.task_cache,
                    generated=stored,
                    broken=broken,
                    draws=catalog.draws,
                )
                if pack.digest != row.digest:
                    raise PackError(f"its files hash to {pack.digest}, published as {row.digest}")
                catalog.add(pack, held=row.name not in enabled)
                loaded += 1
            except Exception as exc:
                if isinstance(exc, PackUnavailable):
                    catalog.unavailable(exc)
                catalog.errors[where] = f"published pack not loaded: {exc}"
                log.error("published pack %s not loaded: %s", where, exc)
        return loaded

    # -- install ----------------------------------------------------------------------------
    def install(
        self,
        data: bytes | BinaryIO,
        *,
        publisher: str,
        families: Iterable[str | TaskValidator],
        catalog: PackCatalog | None = None,
        allow_code: bool = False,
        expect_digest: str | None = None,
        rights: PublishRights = ADMIN_RIGHTS,
        policy: HostPolicy | None = None,
        generate: Generate | None = None,
        broken: Mapping[str, str] | None = None,
        audit: Callable[[Pack], None] | None = None,
    ) -> tuple[Pack, bool]:
        """Verify and install one archive; returns the pack and whether it is new.

        `audit` is called with a new version's loaded pack before it is placed (publish's
        cheat audit); what it raises refuses the archive.

        A generator pack's tasks come from `generate` (sandboxes) and are stored beside it,
        whenever `generate` is given and always without `allow_code`. Raises BadRequestError
        (not a valid pack, lock mismatch, unexpected digest, a task naming a host path, a
        generator that failed), PermissionDeniedError (a `[source]` pack without
        `allow_code`, an org `rights` does not own), UnavailableError (no sandbox for the
        generators), QuotaExceededError or ConflictError (the version is published with
        other bytes)."""
        with self.store.unpacked(data) as root:
            try:
                manifest = read_manifest(root)
                rights.check_org(manifest.name)  # before anything else is read
            except PackError as exc:
                raise BadRequestError(f"not a valid pack: {exc}", code="invalid_pack") from None
            if manifest.source is not None and not allow_code:
                raise PermissionDeniedError(
                    "this pack runs Python inside the server when it loads ([source] python); "
                    "only an admin token may publish such packs (a [generators.*] pack is "
                    "fine: its generators run in a sandbox at publish)",
                    code="missing_scope",
                )
            known = self._known(root, manifest)  # other bytes: refused before generating
            generated = None
            if known is not None and known.generated:  # the same bytes again: as stored
                generated = self.generated.load(known.digest, known.generated)
            elif manifest.generators and (generate is not None or not allow_code):
                if known is None:  # over quota: refused before any generator runs
                    self._check_quota(rights, publisher, _files_size(root))
                generated = self._generate(root, manifest, generate)  # never in-process
            try:
                secret = catalog.secret if catalog is not None else None  # sealed seeds
                cache = catalog.task_cache if catalog is not None else None
                pack = load_pack(
                    root,
                    list(families),
                    policy,
                    secret=secret,
                    cache=cache,
                    generated=generated,
                    broken=broken,
                    draws=catalog.draws if catalog is not None else None,
                )
            except PackUnavailable as exc:  # the server's fault, not the pack's
                why = "; ".join(exc.families.values())
                raise UnavailableError(
                    f"this server cannot load the pack: {why}",
                    code="family_unavailable",
                    retryable=False,
                ) from None
            except Exception as exc:
                raise BadRequestError(f"not a valid pack: {exc}", code="invalid_pack") from None
            if expect_digest is not None and pack.digest != expect_digest:
                raise BadRequestError(
                    f"the archive's pack digest is {pack.digest}, expected {expect_digest}",
                    code="digest_mismatch",
                )
            if audit is not None and self.find(pack.name, pack.version) is None:
                audit(pack)
            with self._lock:
                return self._place(pack, root, publisher, catalog, rights, generated)

    def _known(self, root: Path, manifest: PackManifest) -> Published | None:
        """The index row of this version if it is published (ConflictError where with other
        bytes: refused before any generator runs); None for a new version."""
        known = self.find(manifest.name, manifest.version)
        if known is not None and pack_digest(root) != known.digest:
            raise ConflictError(
                f"{manifest.name}@{manifest.version} is already published with other bytes "
                f"({known.digest}); a published version is immutable: bump the version",
                code="version_exists",
            )
        return known

    @staticmethod
    def _generate(root: Path, manifest: PackManifest, generate: Generate | None) -> GeneratedSet:
        if generate is None:
            raise UnavailableError(
                "this server cannot run a generator pack's generators in a sandbox",
                code="no_generator_sandbox",
            )
        try:
            return generate(root, manifest)
        except GenerationError as exc:
            message = f"generator pack {manifest.name}@{manifest.version} refused: {exc}"
            raise BadRequestError(message, code="generator_failed") from None
        except SandboxError as exc:
            raise UnavailableError(
                f"no sandbox for the generators of {manifest.name}@{manifest.version}: {exc}",
                code="sandbox_failed",
            ) from None

    def _place(
        self,
        pack: Pack,
        root: Path,
        publisher: str,
        catalog: PackCatalog | None,
        rights: PublishRights,
        generated: GeneratedSet | None = None,
    ) -> tuple[Pack, bool]:
        where = f"{pack.name}@{pack.version}"
        existing = self.find(pack.name, pack.version)
        served = _served(catalog, pack.name, pack.version)
        for digest in (existing.digest if existing else None, served.digest if served else None):
            if digest is not None and digest != pack.digest:
                raise ConflictError(
                    f"{where} is already published with other bytes ({digest}); "
                    "a published version is immutable: bump the version",
                    code="version_exists",
                )
        if existing is not None or served is not None:
            current = served or pack
            return current, False
        size = _files_size(root)
        if generated is not None:  # the stored tasks count toward the publisher's quota
            size += sum(len(canonical(t)) for splits in generated.values() for t in splits.values())
        self._check_quota(rights, publisher, size)
        pack.move_to(self.store.place(root, pack.digest))
        index = self.generated.place(pack.digest, generated) if generated is not None else ""
        with self.db.transaction() as db:
            db.execute(
                "INSERT INTO published_packs (name, version, digest, published_at, publisher,"
                " bytes, generated) VALUES (?,?,?,?,?,?,?)",
                (pack.name, pack.version, pack.digest, time.time(), publisher, size, index),
            )
            if rights.enable:
                db.execute(
                    "INSERT INTO enabled_packs (name, enabled_at, enabled_by)"
                    " VALUES (?,?,?) ON CONFLICT (name) DO NOTHING",
                    (pack.name, time.time(), publisher),
                )
            enabled = bool(
                db.execute("SELECT 1 FROM enabled_packs WHERE name=?", (pack.name,)).fetchone()
            )
        if catalog is not None:
            catalog.add(pack, held=not enabled)
        log.info("pack %s published (%s) by %s", where, pack.digest, publisher)
        return pack, True


def _served(catalog: PackCatalog | None, name: str, version: str) -> Pack | None:
    if catalog is None:
        return None
    try:
        return catalog.get(name, version)
    except Exception:
        return None


def _files_size(root: Path) -> int:
    """Bytes of the pack's own files (what a publisher's quota counts before generation)."""
    return sum(p.stat().st_size for p in pack_files(root).values())
