"""The packs a server serves, by name and version: task refs resolved, tasks selected.

Packs come in from pack directories (`load_dirs`, the built-in ones) and from the
published-pack registry (server/packs/registry.py). A published pack an admin has not
enabled is *held*: served by explicit ref or `pack=`, never drawn by unfiltered sampling
(DESIGN §5b). A *yanked* version (withdrawn by its publisher) is what `name` alone never
resolves to, so sampling never draws it; `name@version` and `name@sha256:…` still reach it.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from palaestra.sdk.errors import BadRequestError, NotFoundError, UnavailableError
from palaestra.sdk.task import Task
from palaestra.server.packs.drawing import Draws
from palaestra.server.packs.gencache import GeneratedTaskCache, NotCached
from palaestra.server.packs.loader import GeneratedSet, Pack, PackUnavailable, load_pack
from palaestra.server.packs.manifest import read_manifest, semver_key
from palaestra.server.packs.taskfields import HostPolicy
from palaestra.server.packs.validator import TaskValidator
from palaestra.server.packs.warming import Warming, warming_error

if TYPE_CHECKING:
    from palaestra.server.packs.warming import PackWarmer

log = logging.getLogger(__name__)

REF_RE = re.compile(r"^(?P<pack>[^@:\s]+/[^@:\s]+)(?:@(?P<version>[^:\s]+))?:(?P<task>\S+)$")


class PackCatalog:
    """The packs the server serves, by name and version."""

    def __init__(
        self, secret: bytes | None = None, task_cache: GeneratedTaskCache | None = None
    ) -> None:
        self._packs: dict[str, dict[str, Pack]] = {}
        self.errors: dict[str, str] = {}
        self.secret = secret  # the held-out secret packs load with (server/heldout.py)
        self.task_cache = task_cache  # generated tasks kept between starts
        # Published packs an admin has not enabled: served by explicit ref or `pack=`, never
        # drawn by the sampler's unfiltered mode (DESIGN §5b).
        self._held: set[str] = set()
        # Packs not served because a family their tasks use failed to import:
        # {name: {version: why}}; asking for one is a 503 naming the family (not a 404).
        self._unavailable: dict[str, dict[str, str]] = {}
        self._yanked: set[tuple[str, str]] = set()  # (name, version)
        # Built-in packs whose generated tasks are not cached yet, by name: generated in the
        # background (server/packs/warming.py), served once loaded; asking for one is a
        # 503 `warming` with Retry-After.
        self.warming: dict[str, Warming] = {}
        self.warmer: PackWarmer | None = None
        # The held-out draw of each rotated sealed generated split, (name, split) -> draw
        # (server/draws.py): packs load with it; a task of an earlier draw is retired.
        self.draws: dict[tuple[str, str], int] = {}
        self._families: list[str | TaskValidator] = []
        self._policy: HostPolicy | None = None
        self._broken: Mapping[str, str] | None = None

    def add(self, pack: Pack, *, held: bool = False) -> None:
        self._packs.setdefault(pack.name, {})[pack.version] = pack
        if held:
            self._held.add(pack.name)

    def enable(self, name: str) -> None:
        """Let the sampler draw `name` with no pack filter (an admin's decision)."""
        self._held.discard(name)

    def yank(self, name: str, version: str, yanked: bool = True) -> None:
        """Withdraw `name@version` from resolution by name (or, `yanked=False`, restore it)."""
        if yanked:
            self._yanked.add((name, version))
        else:
            self._yanked.discard((name, version))

    def is_yanked(self, name: str, version: str) -> bool:
        return (name, version) in self._yanked

    @property
    def yanked(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._yanked)

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def sampled(self, name: str) -> bool:
        """Whether unfiltered sampling may draw this pack."""
        return name not in self._held

    def unavailable(self, exc: PackUnavailable) -> None:
        """Remember a pack its broken families keep from being served."""
        why = "; ".join(exc.families.values())
        self._unavailable.setdefault(exc.name, {})[exc.version] = why

    def load_dirs(
        self,
        dirs: Iterable[Path],
        known_families: Iterable[str | TaskValidator],
        policy: HostPolicy | None = None,
        broken: Mapping[str, str] | None = None,
        *,
        cached_only: bool = False,
    ) -> None:
        """Load every pack in `dirs`: each is a folder of pack folders, or a pack folder
        itself. A broken pack, or a folder that does not exist, is recorded in `errors`,
        never fatal. `broken`: the families that failed to import
        (FamilyRegistry.unavailable). `cached_only`: a pack whose generated tasks are not
        cached is put in `warming` instead of generated (a PackWarmer generates it)."""
        self._families = list(known_families)
        self._policy, self._broken = policy, broken
        for base in map(Path, dirs):
            if not base.is_dir():
                self.errors[str(base)] = (
                    f"packs_dirs names {base}, which is not a folder; name a pack folder or a "
                    "folder of pack folders"
                )
                log.error("%s", self.errors[str(base)])
                continue
            found = [base] if (base / "pack.toml").is_file() else base.glob("*/pack.toml")
            for root in sorted(p if p == base else p.parent for p in found):
                result = self.read(root, cached_only=cached_only)
                if isinstance(result, NotCached):
                    name = read_manifest(root).name  # read fine a moment ago
                    self.warming[name] = Warming(name, root)
                    continue
                self.take(root, result)

    def read(
        self,
        root: Path,
        *,
        cached_only: bool = False,
        draws: Draws | None = None,
        generated: GeneratedSet | None = None,
    ) -> Pack | Exception:
        """One pack folder loaded with the families, policy and secret of `load_dirs` (and
        the served held-out draws, or `draws`; `generated`: a published pack's stored
        tasks), or why not; changes nothing (a PackWarmer calls it from a thread)."""
        try:
            return load_pack(
                root,
                self._families,
                self._policy,
                secret=self.secret,
                cache=self.task_cache,
                generated=generated,
                broken=self._broken,
                cached_only=cached_only,
                draws=self.draws if draws is None else draws,
            )
        except Exception as exc:
            return exc

    def take(self, root: Path, result: Pack | Exception) -> None:
        """Serve what `read` gave (a pack, or the error that keeps it from being served)."""
        self.warming = {k: w for k, w in self.warming.items() if w.root != root}
        if isinstance(result, Pack):
            self.add(result)
            return
        if isinstance(result, PackUnavailable):
            self.unavailable(result)
        self.errors[str(root)] = str(result)
        log.error("pack %s not loaded: %s", root, result)

    def warming_error(self, what: str) -> UnavailableError | None:
        """A 503 `warming` for a request no ready pack serves, while some pack warms."""
        return warming_error(what, list(self.warming.values())) if self.warming else None

    def all(self) -> list[Pack]:
        return [v for name in sorted(self._packs) for _, v in sorted(self._packs[name].items())]

    def get(self, name: str, version: str | None = None) -> Pack:
        if "@" in name and version is None:
            name, version = name.split("@", 1)
        versions = self._packs.get(name)
        missing = self._unavailable.get(name, {})
        if missing and (version in missing or (version is None and not versions)):
            why = missing[version] if version is not None else missing[max(missing, key=semver_key)]
            raise UnavailableError(
                f"pack {name}{'@' + version if version else ''} is not served: {why}",
                code="family_unavailable",
                retryable=False,
            )
        if not versions and name in self.warming:
            raise warming_error(f"pack {name} is not served yet", [self.warming[name]])
        if not versions:
            raise NotFoundError(f"unknown pack {name!r}; GET /v1/packs lists the packs served")
        if version is None:
            live = [v for v in versions if (name, v) not in self._yanked]
            if not live:
                raise NotFoundError(
                    f"every version of pack {name!r} is yanked ({', '.join(sorted(versions))}); "
                    "pin one exactly (name@version) to use it anyway"
                )
            return versions[max(live, key=semver_key)]
        if version.startswith("sha256:"):
            for pack in versions.values():
                if pack.digest == version:
                    return pack
            raise NotFoundError(f"pack {name!r} has no version with digest {version}")
        if version not in versions:
            raise NotFoundError(
                f"pack {name!r} has no version {version!r}; it has {sorted(versions)}"
            )
        return versions[version]

    def resolve(self, ref: str) -> Task:
        match = REF_RE.match(ref)
        if not match:
            raise BadRequestError(f"task {ref!r} must look like 'org/name[@version]:task_id'")
        pack = self.get(match["pack"], match["version"])
        task = pack.tasks.get(match["task"])
        if task is None:
            retired = retired_draw(pack, match["task"])
            if retired is not None:
                raise NotFoundError(
                    f"task {match['task']!r} of {pack.name}@{pack.version} belongs to held-out "
                    f"draw {retired[1]} of split {retired[0]!r}, which is retired (draw "
                    f"{pack.draws[retired[0]]} is served); GET /v1/tasks lists the current one",
                    code="draw_retired",
                )
            raise NotFoundError(f"pack {pack.name}@{pack.version} has no task {match['task']!r}")
        return task

    def select(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        family: str | None = None,
        domain: str | None = None,
    ) -> list[Task]:
        packs = [self.get(pack)] if pack else self.all()
        return [
            t
            for p in packs
            for t in p.tasks.values()
            if (split is None or t.split == split)
            and (family is None or t.family == family)
            and (domain is None or t.domain == domain or t.domain.startswith(domain + "/"))
        ]

    def sample(self, rng: random.Random, **filters: str | None) -> Task:
        """Uniform choice among matching tasks (the curriculum sampler comes with pack issue)."""
        candidates = self.select(**filters)
        if not candidates:
            shown = {k: v for k, v in filters.items() if v}
            raise NotFoundError(f"no task matches {shown or 'any filter'}")
        return rng.choice(candidates)


def retired_draw(pack: Pack, task_id: str) -> tuple[str, int] | None:
    """(split, draw) when `task_id` names a task of an earlier held-out draw of one of the
    pack's rotated splits (`<generator>-<split>-<index>` is draw 0, `…-d<N>-<index>` draw N)."""
    manifest = pack.manifest
    if manifest is None:
        return None
    for split, current in pack.draws.items():
        for gen in manifest.generators:
            head = f"{gen}-{split}-"
            if not task_id.startswith(head):
                continue
            match = re.fullmatch(r"(?:d(\d+)-)?\d+", task_id[len(head) :])
            if match is not None:
                draw = int(match[1] or 0)
                if draw < current:
                    return split, draw
    return None
