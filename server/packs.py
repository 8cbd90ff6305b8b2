"""Task packs on disk (DESIGN §6), first version: `pack.toml` plus `tasks.jsonl` or a source.

A pack directory holds `pack.toml` (name, version, description, license, families,
splits with `sealed`) and its tasks, either as `tasks.jsonl` (one task a line) or from
a `[source] python = "file.py"` whose `load_tasks()` yields the same dicts (for data
sets that ship in a Python package, like HumanEval). The pack digest is sha256 over the
sorted (path, bytes) of its files plus, for a source pack, the digests of its tasks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import random
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.sdk.errors import BadRequestError, NotFoundError
from palaestra.sdk.models import PackInfo, SplitInfo
from palaestra.sdk.task import Task

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*/[a-z0-9][a-z0-9_.-]*$")
REF_RE = re.compile(r"^(?P<pack>[^@:\s]+/[^@:\s]+)(?:@(?P<version>[^:\s]+))?:(?P<task>\S+)$")
TASK_KEYS = {"id", "family", "domain", "split", "difficulty", "public", "private"}


class PackError(ValueError):
    """A pack on disk is malformed; the message names the file and what to fix."""


@dataclass
class Pack:
    name: str
    version: str
    description: str
    license: str
    families: list[str]
    sealed: dict[str, bool]
    digest: str
    root: Path
    tasks: dict[str, Task] = field(default_factory=dict)

    def info(self) -> PackInfo:
        counts: dict[str, int] = dict.fromkeys(self.sealed, 0)
        for task in self.tasks.values():
            counts[task.split] = counts.get(task.split, 0) + 1
        return PackInfo(
            name=self.name,
            version=self.version,
            digest=self.digest,
            description=self.description,
            license=self.license,
            families=self.families,
            splits=[
                SplitInfo(name=s, sealed=self.sealed.get(s, False), tasks=n)
                for s, n in sorted(counts.items())
            ],
        )


def _dir_digest(root: Path) -> hashlib._Hash:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h


def _task_dicts(root: Path, meta: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    source = meta.get("source", {}).get("python")
    if source:
        spec = importlib.util.spec_from_file_location(f"_palaestra_pack_{root.name}", root / source)
        if spec is None or spec.loader is None:
            raise PackError(f"{root / source}: cannot be imported")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for i, task in enumerate(module.load_tasks()):
            yield f"{source} task #{i}", task
        return
    path = root / "tasks.jsonl"
    if not path.exists():
        raise PackError(f"{root}: needs tasks.jsonl or a [source] python file in pack.toml")
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise PackError(f"{path}:{number}: not JSON ({exc.msg})") from None


def load_pack(root: Path, known_families: Iterable[str] | None = None) -> Pack:
    """Read and validate one pack directory; raises PackError saying what to fix."""
    toml_path = root / "pack.toml"
    try:
        meta = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackError(f"{root}: no pack.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise PackError(f"{toml_path}: invalid TOML ({exc})") from None
    name, version = meta.get("name"), meta.get("version")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise PackError(f"{toml_path}: name must look like 'org/name' (lowercase), got {name!r}")
    if not isinstance(version, str) or not re.match(r"^\d+\.\d+\.\d+", version):
        raise PackError(f"{toml_path}: version must be semver like '1.0.0', got {version!r}")
    splits = meta.get("splits") or {}
    sealed = {str(s): bool(v.get("sealed", False)) for s, v in splits.items()}
    families = list(meta.get("families") or [])
    known = set(known_families) if known_families is not None else None
    digest = _dir_digest(root)
    is_source = bool(meta.get("source"))
    tasks: dict[str, Task] = {}
    for where, raw in _task_dicts(root, meta):
        missing = {"id", "family", "split", "public", "private"} - raw.keys()
        if missing or not raw.keys() <= TASK_KEYS:
            extra = sorted(raw.keys() - TASK_KEYS)
            raise PackError(f"{where}: missing fields {sorted(missing)}; unknown fields {extra}")
        if raw["split"] not in sealed:
            raise PackError(f"{where}: split {raw['split']!r} is not declared in pack.toml")
        if known is not None and raw["family"] not in known:
            raise PackError(f"{where}: unknown family {raw['family']!r}")
        if raw["id"] in tasks:
            raise PackError(f"{where}: duplicate task id {raw['id']!r}")
        domain = raw.get("domain") or f"{name.split('/')[1]}/{raw['family']}"
        task = Task(
            id=str(raw["id"]),
            family=raw["family"],
            domain=domain,
            split=raw["split"],
            pack=name,
            version=version,
            public=raw["public"],
            private=raw["private"],
            difficulty=str(raw.get("difficulty", "")),
            sealed=sealed[raw["split"]],
            digest=Task.compute_digest(raw["family"], domain, raw["public"], raw["private"]),
        )
        tasks[task.id] = task
        if is_source:
            digest.update(task.digest.encode())
    return Pack(
        name=name,
        version=version,
        description=str(meta.get("description", "")),
        license=str(meta.get("license", "")),
        families=families,
        sealed=sealed,
        digest="sha256:" + digest.hexdigest(),
        root=root,
        tasks=tasks,
    )


class PackRegistry:
    """The packs the server serves, by name and version."""

    def __init__(self) -> None:
        self._packs: dict[str, dict[str, Pack]] = {}
        self.errors: dict[str, str] = {}

    def add(self, pack: Pack) -> None:
        self._packs.setdefault(pack.name, {})[pack.version] = pack

    def load_dirs(self, dirs: Iterable[Path], known_families: Iterable[str]) -> None:
        """Load every pack under `dirs`; a broken pack is recorded in `errors`, never fatal."""
        families = list(known_families)
        for base in dirs:
            for root in sorted(p.parent for p in Path(base).glob("*/pack.toml")):
                try:
                    self.add(load_pack(root, families))
                except Exception as exc:
                    self.errors[str(root)] = str(exc)
                    log.error("pack %s not loaded: %s", root, exc)

    def all(self) -> list[Pack]:
        return [v for name in sorted(self._packs) for _, v in sorted(self._packs[name].items())]

    def get(self, name: str, version: str | None = None) -> Pack:
        if "@" in name and version is None:
            name, version = name.split("@", 1)
        versions = self._packs.get(name)
        if not versions:
            raise NotFoundError(f"unknown pack {name!r}; GET /v1/packs lists the packs served")
        if version is None:
            return versions[max(versions, key=_semver_key)]
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


def _semver_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])
