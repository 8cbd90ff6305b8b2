"""Published packs on every node: exported by a front into the shared store, fetched by digest.

A published pack lives in its front's data dir (the pack folder and, for a generator pack,
its sandbox-generated tasks). A front exports each one once into the shared store's
content-addressed blobs (`pack:<digest>`: a tar of both folders); a worker, or another
front, that lacks a pack's folder fetches the blob, unpacks it under its own data dir and
loads it like any published pack. Nothing is trusted for being fetched: the loader hashes
the files again (row digest, generated index chain) before serving them.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from palaestra.server.packs.genstore import INDEX, digest_of
from palaestra.server.packs.manifest import PackError
from palaestra.server.packs.registry import PackRegistry, Published
from palaestra.server.packs.taskfields import HostPolicy
from palaestra.server.store import Store

if TYPE_CHECKING:
    from palaestra.server.services import Services

log = logging.getLogger("palaestra.cluster")

PACK_DIR, GENERATED_DIR = "pack", "generated"


def blob_key(digest: str) -> str:
    return f"pack:{digest}"


def _tar(folders: dict[str, Path]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for arcname, folder in folders.items():
            if folder.is_dir():
                tar.add(folder, arcname=arcname)
    return out.getvalue()


def export(registry: PackRegistry, store: Store, row: Published) -> bool:
    """Put `row`'s pack into the shared store (idempotent); whether it had to."""
    if store.reads.get_blob(blob_key(row.digest)) is not None:
        return False
    folders = {PACK_DIR: registry.store.path_of(row.digest)}
    if row.generated:
        folders[GENERATED_DIR] = registry.generated.folder(row.digest)
    if not folders[PACK_DIR].is_dir():
        raise PackError(f"{row.name}@{row.version}: its folder is missing on this front")
    store.put_blob(blob_key(row.digest), _tar(folders))
    return True


def export_all(registry: PackRegistry, store: Store) -> int:
    """Export every published pack whose folder is on this node; how many were new."""
    return sum(
        export(registry, store, row)
        for row in registry.published()
        if registry.store.path_of(row.digest).is_dir()
    )


def fetch(registry: PackRegistry, store: Store, row: Published) -> None:
    """Make `row`'s folders exist under this node's data dir, from the shared store."""
    pack_dir = registry.store.path_of(row.digest)
    gen_dir = registry.generated.folder(row.digest)
    if pack_dir.is_dir() and (not row.generated or gen_dir.is_dir()):
        fetch_generated(registry, store, row)  # as a held-out rotation left it, if one did
        return
    data = store.reads.get_blob(blob_key(row.digest))
    if data is None:
        raise PackError(
            f"{row.name}@{row.version} ({row.digest}) is not in the shared store yet: "
            "the front it was published on has not exported it"
        )
    registry.store.tmp.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=registry.store.tmp))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(work, filter="data")  # no links out, no devices, no absolute paths
        for name, final in ((PACK_DIR, pack_dir), (GENERATED_DIR, gen_dir)):
            if (work / name).is_dir() and not final.is_dir():
                final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.rename(work / name, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("fetched %s@%s (%s) from the shared store", row.name, row.version, row.digest)
    fetch_generated(registry, store, row)


def generated_key(index: str) -> str:
    return f"generated:{index}"


def export_generated(registry: PackRegistry, store: Store, row: Published) -> None:
    """Put `row`'s generated folder as its row names it now into the shared store, keyed by
    its index digest: a held-out rotation (server/draws.py) added a draw to it."""
    key = generated_key(row.generated)
    if row.generated and store.reads.get_blob(key) is None:
        store.put_blob(key, _tar({GENERATED_DIR: registry.generated.folder(row.digest)}))


def fetch_generated(registry: PackRegistry, store: Store, row: Published) -> None:
    """Make this node's generated folder of `row` the one its row names, from the shared
    store, where a rotation on another node changed it (nothing there: left as it is, and
    the loader names what does not match)."""
    folder = registry.generated.folder(row.digest)
    index = folder / INDEX
    if not row.generated or (index.is_file() and digest_of(index.read_bytes()) == row.generated):
        return
    data = store.reads.get_blob(generated_key(row.generated))
    if data is None:
        return
    registry.store.tmp.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=registry.store.tmp))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(work, filter="data")  # no links out, no devices, no absolute paths
        if not (work / GENERATED_DIR).is_dir():
            return
        old = work / "old"
        if folder.is_dir():
            os.rename(folder, old)
        folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.rename(work / GENERATED_DIR, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("fetched the generated tasks of %s@%s (%s)", row.name, row.version, row.generated)


def sync_published(services: Services) -> int:
    """Serve the packs published (on any front) since `services` loaded; how many."""
    registry = services.registry
    if registry is None:
        return 0
    families = services.families
    loaded = registry.load_into(
        services.packs,
        families.all(),
        HostPolicy.from_settings(services.settings),
        families.unavailable(),
        fetch=partial(fetch, registry, services.store),
    )
    if loaded:
        services.sampler.refresh()
    return loaded
