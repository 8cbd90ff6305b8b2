"""The server's content-addressed pack store: publish, install, load again at start.

On disk, an installed pack is the extracted archive under
`<data_dir>/packs/sha256/<hex>/` (`hex`: the pack digest, DESIGN §6); the SQLite table
`published_packs` (name, version, digest, published_at, publisher) is its index, and a
row there is what makes a version live. Rules:

- the archive is verified before anything is installed: it extracts safely
  (server/archive.py), and `load_pack` accepts it with the server's families (which
  also checks a `pack.lock` in it against the files and the pack digest);
- a published `name@version` is immutable: the same digest again is a no-op (200), other
  bytes are refused (409, "bump the version");
- installation is atomic: extract into `packs/tmp/`, then one `rename` into place, then
  the index row; a failure at any point leaves nothing half-installed (an orphan folder
  under `sha256/` without a row is never served, and is reused by the next publish);
- a pack that runs Python inside the server when it loads (`[source] python = …`, or
  `[generators.*]`) can only be published by an admin token.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.sdk.errors import BadRequestError, ConflictError, PermissionDeniedError
from palaestra.server.archive import ArchiveError, extract_archive, pack_archive
from palaestra.server.packs import Pack, PackError, PackRegistry, load_pack, pack_digest
from palaestra.server.store import PACKS_SCHEMA

log = logging.getLogger("palaestra.registry")


@dataclass(frozen=True)
class Published:
    name: str
    version: str
    digest: str
    published_at: float
    publisher: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "published_at": self.published_at,
            "publisher": self.publisher,
        }


def runs_code(root: Path) -> bool:
    """Whether loading the pack would run its Python in the server process."""
    try:
        meta = tomllib.loads((root / "pack.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False  # load_pack reports it
    return bool(meta.get("source") or meta.get("generators")) or (root / "generators").exists()


class PackStore:
    """Published packs under `<data_dir>/packs/`, indexed in the SQLite file at `db_path`."""

    def __init__(self, data_dir: Path, db_path: Path) -> None:
        self.root = data_dir / "packs"
        self.objects = self.root / "sha256"
        self.tmp = self.root / "tmp"
        self.db_path = db_path
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.db_path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(PACKS_SCHEMA)
        return db

    # -- index ------------------------------------------------------------------------------
    def published(self, name: str | None = None) -> list[Published]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT name, version, digest, published_at, publisher FROM published_packs"
                + (" WHERE name=?" if name else "")
                + " ORDER BY name, published_at",
                (name,) if name else (),
            ).fetchall()
        return [Published(*row) for row in rows]

    def find(self, name: str, version: str) -> Published | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT name, version, digest, published_at, publisher FROM published_packs"
                " WHERE name=? AND version=?",
                (name, version),
            ).fetchone()
        return Published(*row) if row else None

    def path_of(self, digest: str) -> Path:
        return self.objects / digest.removeprefix("sha256:")

    # -- load at start ----------------------------------------------------------------------
    def load_into(self, registry: PackRegistry, families: Iterable[str]) -> int:
        """Serve every published pack; a broken one goes to `registry.errors`, never fatal."""
        known = list(families)
        loaded = 0
        for row in self.published():
            where = f"{row.name}@{row.version}"
            try:
                pack = load_pack(self.path_of(row.digest), known)
                if pack.digest != row.digest:
                    raise PackError(f"its files hash to {pack.digest}, published as {row.digest}")
                registry.add(pack)
                loaded += 1
            except Exception as exc:
                registry.errors[where] = f"published pack not loaded: {exc}"
                log.error("published pack %s not loaded: %s", where, exc)
        return loaded

    # -- install ----------------------------------------------------------------------------
    def install(
        self,
        data: bytes,
        *,
        publisher: str,
        families: Iterable[str],
        registry: PackRegistry | None = None,
        allow_code: bool = False,
        expect_digest: str | None = None,
    ) -> tuple[Pack, bool]:
        """Verify and install one archive; returns the pack and whether it is new.

        Raises BadRequestError (not a valid pack, lock mismatch, unexpected digest),
        PermissionDeniedError (a code-running pack without `allow_code`) or ConflictError
        (the version is published with other bytes)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.objects.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="install-", dir=self.tmp))
        try:
            try:
                root = extract_archive(data, work / "pack")
            except ArchiveError as exc:
                raise BadRequestError(f"bad pack archive: {exc}", code="invalid_archive") from None
            if runs_code(root) and not allow_code:
                raise PermissionDeniedError(
                    "this pack runs Python inside the server when it loads ([source] or "
                    "generators/); only an admin token may publish such packs",
                    code="missing_scope",
                )
            try:
                pack = load_pack(root, list(families))
            except Exception as exc:
                raise BadRequestError(f"not a valid pack: {exc}", code="invalid_pack") from None
            if expect_digest is not None and pack.digest != expect_digest:
                raise BadRequestError(
                    f"the archive's pack digest is {pack.digest}, expected {expect_digest}",
                    code="digest_mismatch",
                )
            with self._lock:
                return self._place(pack, root, publisher, registry)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _place(
        self, pack: Pack, root: Path, publisher: str, registry: PackRegistry | None
    ) -> tuple[Pack, bool]:
        where = f"{pack.name}@{pack.version}"
        existing = self.find(pack.name, pack.version)
        served = _served(registry, pack.name, pack.version)
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
        final = self.path_of(pack.digest)
        # A folder there was left by an install that stopped between the rename and the
        # index row; a rename is all-or-nothing, so its files are whole. Check them anyway.
        if final.exists() and pack_digest(final) != pack_digest(root):
            shutil.rmtree(final)
        if not final.exists():
            os.rename(root, final)
        pack.root = final
        with self._connect() as db:
            db.execute(
                "INSERT INTO published_packs (name, version, digest, published_at, publisher)"
                " VALUES (?,?,?,?,?)",
                (pack.name, pack.version, pack.digest, time.time(), publisher),
            )
        if registry is not None:
            registry.add(pack)
        log.info("pack %s published (%s) by %s", where, pack.digest, publisher)
        return pack, True

    def archive(self, pack: Pack) -> bytes:
        return pack_archive(pack.root)


def _served(registry: PackRegistry | None, name: str, version: str) -> Pack | None:
    if registry is None:
        return None
    try:
        return registry.get(name, version)
    except Exception:
        return None
