"""Held-out draws: a generated pack's sealed split rotates (docs/evaluation.md).

A model trained (or tuned by hand) against a fixed held-out set can memorise it; the
defence is a new set. A sealed split a generator draws has a draw number: draw 0 is the
set the server always served (seeds from its secret, server/heldout.py), draw N > 0 takes
`count` seeds from the secret and N, none that an earlier draw used, and ids
`<generator>-<split>-d<N>-<index>` (server/packs/drawing.py). Rotating (`palaestra pack
heldout rotate`, `POST /v1/packs/{org}/{name}/heldout/rotate`, or the schedule of
`heldout_rotate_every_days`) generates the next draw, then records it in the table
`heldout_draws` (one row a pack name and split), then serves it: every version of the
pack loads at that draw, and the tasks of earlier draws are gone from the catalog, so
neither an eval token (404 `draw_retired`) nor a train token (a sealed task: 403, and
now not even that) starts an episode on one again. Episodes already running finish.

The table is shared by every process on the store: a rotation wins by a conditional
update, and the schedule's loop (and a cluster worker sent a task it lacks) loads any draw
another process made (`sync`); a publish token's generator pack rotated on one node is
fetched by the others from the store's blobs (server/cluster/depot.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from palaestra.sdk.errors import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    PalaestraError,
    UnavailableError,
)
from palaestra.sdk.heldout import HeldoutDraws, SplitDraw
from palaestra.server.auth import ADMIN, ADMIN_PRINCIPAL, Principal
from palaestra.server.config import Settings
from palaestra.server.db import Database
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.drawing import Draws, rotatable_splits, stored_split
from palaestra.server.packs.loader import GeneratedSet, Pack
from palaestra.server.packs.manifest import PackManifest
from palaestra.server.packs.registry import PackRegistry, Published
from palaestra.server.sampler import Sampler

log = logging.getLogger("palaestra.draws")

# Runs a published pack's generators in sandboxes for some splits at some draws (the
# server catalog's `generate_draw`).
GenerateDraw = Callable[[Path, PackManifest, Draws, set[str]], Awaitable[GeneratedSet]]

DAY_S = 86400.0


@dataclass(frozen=True)
class Depot:
    """A cluster node's way to share a published pack's generated folder after a rotation
    (server/cluster/depot.py: `export_generated`, `fetch_generated`)."""

    export: Callable[[Published], None]
    fetch: Callable[[Published], None]


@dataclass(frozen=True)
class DrawRow:
    pack: str
    split: str
    draw: int
    drawn_at: float
    drawn_by: str


class DrawBook:
    """The table `heldout_draws`: the draw each rotated sealed split serves (no row: 0)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def rows(self, pack: str | None = None) -> list[DrawRow]:
        sql = "SELECT pack, split, draw, drawn_at, drawn_by FROM heldout_draws"
        args: tuple[str, ...] = ()
        if pack is not None:
            sql, args = sql + " WHERE pack=?", (pack,)
        with self.db.connection() as db:
            found = db.all(sql + " ORDER BY pack, split", args)
        return [DrawRow(r[0], r[1], int(r[2]), float(r[3]), r[4]) for r in found]

    def current(self) -> dict[tuple[str, str], int]:
        return {(r.pack, r.split): r.draw for r in self.rows() if r.draw}

    def note(self, pack: str, split: str, at: float) -> None:
        """Start the schedule's clock of a split still at draw 0 (no row yet)."""
        with self.db.connection() as db:
            db.execute(
                "INSERT INTO heldout_draws (pack, split, draw, drawn_at, drawn_by)"
                " VALUES (?,?,0,?,'') ON CONFLICT (pack, split) DO NOTHING",
                (pack, split, at),
            )

    def advance(self, pack: str, split: str, seen: int, by: str, at: float) -> bool:
        """Record draw `seen + 1` if the split is still at `seen` (False: another process
        rotated it first)."""
        with self.db.connection() as db:
            changed = db.execute(
                "INSERT INTO heldout_draws (pack, split, draw, drawn_at, drawn_by)"
                " VALUES (?,?,?,?,?) ON CONFLICT (pack, split) DO UPDATE SET"
                " draw=excluded.draw, drawn_at=excluded.drawn_at, drawn_by=excluded.drawn_by"
                " WHERE heldout_draws.draw=?",
                (pack, split, seen + 1, at, by, seen),
            ).rowcount
        return changed == 1


class DrawKeeper:
    """Rotates held-out draws, serves them, and keeps this process in step with the table."""

    def __init__(
        self,
        settings: Settings,
        packs: PackCatalog,
        book: DrawBook,
        sampler: Sampler,
        registry: PackRegistry | None = None,
        generate: GenerateDraw | None = None,
        depot: Depot | None = None,
    ) -> None:
        self.settings = settings
        self.packs = packs
        self.book = book
        self.sampler = sampler
        self.registry = registry
        self.generate = generate
        self.depot = depot  # a cluster node's: generated folders shared through the store
        self._lock = asyncio.Lock()  # one rotation or sync at a time in this process
        self._loop: asyncio.Task[None] | None = None

    # -- what is served ---------------------------------------------------------------------
    def versions(self, name: str) -> list[Pack]:
        found = [p for p in self.packs.all() if p.name == name]
        if not found:
            self.packs.get(name)  # the catalog's own 404 / 503 (warming, unavailable)
            raise NotFoundError(f"unknown pack {name!r}; GET /v1/packs lists the packs served")
        return found

    def splits_of(self, name: str) -> list[str]:
        return sorted({s for p in self.versions(name) if p.manifest for s in rotatable(p)})

    async def describe(self, name: str) -> HeldoutDraws:
        versions = self.versions(name)
        newest = self.packs.get(name) if not all(self._yanked(p) for p in versions) else None
        rows = {r.split: r for r in await asyncio.to_thread(self.book.rows, name)}
        out = []
        for split in self.splits_of(name):
            row = rows.get(split)
            count = sum(1 for t in newest.tasks.values() if t.split == split) if newest else 0
            out.append(
                SplitDraw(
                    split=split,
                    draw=self.packs.draws.get((name, split), 0),
                    drawn_at=row.drawn_at if row else None,
                    drawn_by=row.drawn_by if row else "",
                    tasks=count,
                )
            )
        return HeldoutDraws(pack=name, splits=out)

    def _yanked(self, pack: Pack) -> bool:
        return self.packs.is_yanked(pack.name, pack.version)

    # -- rotating ---------------------------------------------------------------------------
    async def rotate(
        self, name: str, split: str | None = None, principal: Principal = ADMIN_PRINCIPAL
    ) -> HeldoutDraws:
        """Draw the next held-out set of `split` (every rotatable split: None) of pack
        `name` and serve it; the draws before it are retired."""
        principal.require(ADMIN, "rotating a held-out draw")
        async with self._lock:
            await self._sync_locked()  # from the draws the store has, not a stale view
            splits = self.splits_of(name)
            if not splits:
                raise BadRequestError(
                    f"pack {name!r} has no sealed split that a generator draws: only those "
                    "rotate (a task file's sealed tasks are what they are)",
                    code="not_rotatable",
                )
            if split is not None:
                if split not in splits:
                    raise BadRequestError(
                        f"split {split!r} of {name!r} does not rotate; these do: "
                        f"{', '.join(splits)}",
                        code="not_rotatable",
                    )
                splits = [split]
            seen = {s: self.packs.draws.get((name, s), 0) for s in splits}
            draws = dict(self.packs.draws)
            draws.update({(name, s): n + 1 for s, n in seen.items()})
            loaded = await self._load_all(name, draws, set(splits))  # before it is recorded
            now = time.time()
            for s, n in seen.items():
                won = await asyncio.to_thread(self.book.advance, name, s, n, principal.name, now)
                if not won:
                    await self._sync_locked()
                    raise ConflictError(
                        f"split {s!r} of {name!r} was rotated by another server meanwhile; "
                        "it serves that draw now (GET …/heldout shows it)",
                        code="draw_conflict",
                    )
            self._serve(name, draws, loaded)
            log.info("held-out draws of %s rotated by %s: %s", name, principal.name, seen)
        result = await self.describe(name)
        for row in result.splits:
            if row.split in seen:
                row.previous = seen[row.split]
        return result

    async def _load_all(self, name: str, draws: Draws, splits: set[str]) -> list[Pack]:
        """Every served version of `name` loaded at `draws`; any failure refuses the
        rotation before anything changes."""
        out: list[Pack] = []
        for pack in self.versions(name):
            result: Pack | Exception
            try:
                generated = await self._generated(pack, draws, splits)
            except PalaestraError:
                raise
            except Exception as exc:  # a stored file missing or changed (PackError), I/O
                result = exc
            else:
                read = functools.partial(self.packs.read, draws=draws, generated=generated)
                result = await asyncio.to_thread(read, pack.root)
            if isinstance(result, Exception):
                why = result.message if isinstance(result, PalaestraError) else str(result)
                raise UnavailableError(
                    f"the new draw of {pack.name}@{pack.version} did not load: {why[:500]}",
                    code="draw_failed",
                    retryable=False,
                )
            out.append(result)
        return out

    async def _generated(self, pack: Pack, draws: Draws, splits: set[str]) -> GeneratedSet | None:
        """A published generator pack's stored tasks with the draws of `draws` added (made
        in sandboxes, stored beside the pack; its row names the new index); None for a pack
        whose generators load in-process (built in, or an admin's)."""
        registry, manifest = self.registry, pack.manifest
        if registry is None:
            return None
        row = await asyncio.to_thread(registry.find, pack.name, pack.version)
        if row is None or not row.generated:
            return None
        if self.depot is not None:  # another node may have rotated it
            await asyncio.to_thread(self.depot.fetch, row)
        assert manifest is not None
        stored = await asyncio.to_thread(registry.generated.load, row.digest, row.generated)
        wanted = {
            (gen, stored_split(split, draws.get((pack.name, split), 0)))
            for gen, spec in manifest.generators.items()
            for split in spec.splits
            if split in splits
        }
        if all(key in stored.get(gen, {}) for gen, key in wanted):
            return stored  # made already (by another process, or an earlier rotation)
        if self.generate is None:
            raise UnavailableError("this server cannot run generators", code="no_generator_sandbox")
        fresh = await self.generate(pack.root, manifest, draws, splits)
        for gen, made in fresh.items():
            stored.setdefault(gen, {}).update(made)
        index = await asyncio.to_thread(registry.generated.place, row.digest, stored)

        def record() -> None:
            with registry.db.connection() as db:
                db.execute(
                    "UPDATE published_packs SET generated=? WHERE name=? AND version=?",
                    (index, pack.name, pack.version),
                )

        await asyncio.to_thread(record)
        if self.depot is not None:  # for the cluster's other nodes
            await asyncio.to_thread(self.depot.export, dataclasses.replace(row, generated=index))
        return stored

    def _serve(self, name: str, draws: Draws, loaded: list[Pack]) -> None:
        """Swap the new draws in: the catalog's draws, every version of `name`, the sampler.
        Draws only grow, so an update (never a clear) keeps what a publish thread reads whole."""
        self.packs.draws.update({k: v for k, v in draws.items() if v})
        for pack in loaded:
            self.packs.add(pack)
        self.sampler.refresh()

    # -- in step with the table, and the schedule -------------------------------------------
    async def sync(self) -> list[str]:
        """Load the draws another process recorded; the names of the packs reloaded."""
        async with self._lock:
            return await self._sync_locked()

    async def _sync_locked(self) -> list[str]:
        recorded = await asyncio.to_thread(self.book.current)
        names = {n for n, _ in recorded} | {n for n, _ in self.packs.draws}
        changed = []
        for name in sorted(names):
            mine = {k: v for k, v in self.packs.draws.items() if k[0] == name}
            theirs = {k: v for k, v in recorded.items() if k[0] == name}
            if mine == theirs or not any(p.name == name for p in self.packs.all()):
                continue
            draws = {**{k: v for k, v in self.packs.draws.items() if k[0] != name}, **theirs}
            splits = {s for _, s in theirs}
            try:
                loaded = await self._load_all(name, draws, splits)
            except PalaestraError as exc:
                log.error("held-out draws of %s not loaded: %s", name, exc.message)
                continue
            self._serve(name, draws, loaded)
            changed.append(name)
        return changed

    async def rotate_due(self, every_s: float, now: float | None = None) -> list[str]:
        """Rotate every rotatable split whose draw is older than `every_s`."""
        now = time.time() if now is None else now
        rotated = []
        names = sorted({p.name for p in self.packs.all() if p.manifest and rotatable(p)})
        for name in names:
            for split in self.splits_of(name):
                await asyncio.to_thread(self.book.note, name, split, now)
            rows = await asyncio.to_thread(self.book.rows, name)
            for row in rows:
                if row.split in self.splits_of(name) and now - row.drawn_at >= every_s:
                    try:
                        await self.rotate(name, row.split, _SCHEDULE)
                    except PalaestraError as exc:
                        log.error("scheduled rotation of %s failed: %s", name, exc.message)
                        continue
                    rotated.append(f"{name}:{row.split}")
        return rotated

    def start(self) -> None:
        """Keep in step with the store every `heldout_sync_s`, and run the schedule of
        `heldout_rotate_every_days` (none: no rotation but an operator's)."""
        if self._loop is not None:
            return
        days = self.settings.heldout_rotate_every_days
        every_s = None if days is None else days * DAY_S
        self._loop = asyncio.create_task(self._forever(every_s), name="palaestra-draws")

    async def _forever(self, every_s: float | None) -> None:
        interval = self.settings.heldout_sync_s
        if every_s is not None:
            interval = min(interval, max(1.0, min(300.0, every_s / 10)))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sync()
                if every_s is not None:
                    await self.rotate_due(every_s)
            except Exception:  # the loop must outlive one bad pass
                log.exception("held-out draw pass failed")

    async def aclose(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None


def rotatable(pack: Pack) -> list[str]:
    return rotatable_splits(pack.manifest) if pack.manifest is not None else []


_SCHEDULE = Principal(name="schedule", scopes=frozenset({ADMIN}), token_id="schedule")
