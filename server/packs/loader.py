"""Reading a pack directory into tasks (DESIGN §6): the three task forms.

A pack directory holds `pack.toml` (server/packs/manifest.py), an optional `pack.lock`
(server/packs/lock.py) and its tasks, in any mix of:

- `tasks.jsonl` (compact): one task a line, `{id, family, domain, split, difficulty,
  expected_reward, public{}, private{}}`;
- `tasks/<id>/` (directory): `task.toml` (the same keys, `[public]`/`[private]` tables),
  `instruction.md` (→ `public.instruction`), and file maps `{relative path: text}`:
  `environment/` and `assets/` (public), `verifier/` and `solution/` (private)
  (server/packs/dirform.py); binary files anywhere are blobs (server/packs/blobs.py);
- `[generators.<name>]` (procedural): a Python file with `generate(seed, index, level) ->
  dict`, called for each split's seeds (drawn from the split's declared seed range);
- `[source] python = "file.py"` (a variant): `load_tasks()` yields task dicts, for data
  sets that ship in a Python package (HumanEval).

The loader collects every problem it can find (not just the first) and raises one
`PackError` whose `problems` list says, for each, what to fix. Every task passes
`finalize_task` once it is built, before the pack holds it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from palaestra.sdk.blobs import BlobSource
from palaestra.sdk.models import PackInfo, SplitInfo
from palaestra.sdk.task import Task
from palaestra.server import heldout
from palaestra.server.packs import drawing
from palaestra.server.packs.blobs import BlobIndex, task_blob_problems
from palaestra.server.packs.dirform import Found, directory_tasks
from palaestra.server.packs.gencache import GeneratedTaskCache, NotCached, as_json
from palaestra.server.packs.lock import file_hashes, files_digest, pack_files, verify_lock
from palaestra.server.packs.manifest import (
    GeneratorSplit,
    PackError,
    PackManifest,
    TaskRecord,
    read_manifest,
    validation_problems,
)
from palaestra.server.packs.taskfields import HostPolicy, task_field_problems
from palaestra.server.packs.validator import TaskValidator, field_problem


@dataclass
class Pack:
    """A loaded pack: what its pack.toml says, its tasks by id, each task's expected reward."""

    name: str
    version: str
    description: str
    license: str
    families: list[str]
    sealed: dict[str, bool]
    digest: str
    root: Path
    tasks: dict[str, Task] = field(default_factory=dict)
    expected: dict[str, float] = field(default_factory=dict)
    manifest: PackManifest | None = None
    files: dict[str, str] = field(default_factory=dict)
    # Families its tasks use that failed to import: {name: why}; those tasks are left out.
    unavailable: dict[str, str] = field(default_factory=dict)
    # The held-out draw of each sealed generated split (server/draws.py; with a secret only).
    draws: dict[str, int] = field(default_factory=dict)
    # Where its tasks' binary files are (server/packs/blobs.py): `move_to` keeps it right.
    blobs: BlobSource | None = None

    def move_to(self, root: Path) -> None:
        """The pack's folder is now `root` (a publish placed it in the store)."""
        self.root = root
        if self.blobs is not None:
            self.blobs.root = root

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
                SplitInfo(name=s, sealed=self.sealed.get(s, False), tasks=n, draw=self.draws.get(s))
                for s, n in sorted(counts.items())
            ],
        )

    def expected_reward(self, task_id: str) -> float:
        return self.expected.get(task_id, 1.0)

    @property
    def domains(self) -> list[str]:
        return sorted({t.domain for t in self.tasks.values()})


def _import(root: Path, rel: str, tag: str) -> Any:
    path = root / rel
    if not path.is_file():
        raise PackError(f"{path}: no such file")
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"_palaestra_pack_{key}_{tag}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PackError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the module need it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise PackError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from None
    return module


# What a sandbox generated at publish: generator -> split -> each call's task dict.
GeneratedSet = dict[str, dict[str, list[dict[str, Any]]]]
# progress(done, total, unit) while a pack's tasks are generated (server/packs/warmjob.py)
Progress = Callable[[int, int, str], None]


def _jsonl_tasks(root: Path) -> Iterator[Found]:
    path = root / "tasks.jsonl"
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            yield where, None, [f"{where}: not JSON ({exc.msg}); one JSON object a line"]
            continue
        if not isinstance(raw, dict):
            yield where, None, [f"{where}: a task must be a JSON object"]
            continue
        yield where, raw, []


def generator_seeds(
    pack: str,
    generator: str,
    split: str,
    spec: GeneratorSplit,
    secret: bytes | None = None,
    draw: int = 0,
) -> list[int]:
    """The seeds a split draws: `count` distinct seeds of its range, fixed by the names, or
    (a sealed split on a server: `secret`) by an HMAC of the server's held-out secret.
    `draw` > 0 (a rotated sealed split, server/draws.py) draws from the secret and the draw
    number, never a seed an earlier draw of the split used; draw 0 is the original set."""
    first, end = spec.seeds
    label = f"{pack}/{generator}/{split}"
    if draw <= 0 or secret is None:
        rng = random.Random(label) if secret is None else heldout.seeded(secret, label)
        return sorted(rng.sample(range(first, end), spec.count))

    def earlier(before: int) -> list[int]:
        return generator_seeds(pack, generator, split, spec, secret, before)

    return drawing.later_draw_seeds(earlier, label, spec, secret, draw)


def _generated_tasks(
    root: Path,
    manifest: PackManifest,
    secret: bytes | None = None,
    cache: GeneratedTaskCache | None = None,
    pack_files: dict[str, str] | None = None,
    stored: GeneratedSet | None = None,
    *,
    cached_only: bool = False,
    progress: Progress | None = None,
    draws: Mapping[str, int] | None = None,
    drawn: dict[str, int] | None = None,
) -> Iterator[Found]:
    """A sealed split's tasks get secret seeds (with `secret`) and ids that name no seed
    (`<generator>-<split>-<index>`, whatever the generator says; `<generator>-<split>-d<N>-
    <index>` for draw N > 0 of a rotated split: `draws`, split -> draw, server/draws.py;
    `drawn` collects each such task's id -> draw), and their problems quote
    neither the seed nor the generator's error text (pack errors are shown by /readyz).
    A split whose every call succeeded is kept in `cache` (keyed by `pack_files`' hashes);
    a generator module is imported only for a split the cache does not hold, and with
    `cached_only` such a split raises NotCached instead (its pack is warmed in the
    background). With `stored` (what a sandbox generated at publish,
    server/packs/generate.py) the generators' results come from there and no generator is
    imported. `progress(done, total, "tasks")` follows the calls."""
    total = sum(spec.count for gen in manifest.generators.values() for spec in gen.splits.values())
    done = 0
    for gen_name, gen in manifest.generators.items():
        where = f"{root / 'pack.toml'}: generators.{gen_name}"
        generate: Callable[..., Any] | None = None  # imported at the first split not cached
        for split, spec in gen.splits.items():
            sealed = manifest.splits[split].sealed
            key = secret if sealed else None
            draw = (draws or {}).get(split, 0) if sealed and secret is not None else 0
            try:
                seeds = generator_seeds(manifest.name, gen_name, split, spec, key, draw)
            except PackError as exc:
                yield where, None, exc.problems
                continue
            levels = [gen.levels[index % len(gen.levels)] for index in range(len(seeds))]
            entry = None
            if cache is not None and pack_files is not None and stored is None:
                entry = cache.key(pack_files, gen_name, split, seeds, levels)
            cached = cache.get(entry, len(seeds)) if cache is not None and entry else None
            if stored is not None:
                cached = stored.get(gen_name, {}).get(drawing.stored_split(split, draw))
                if cached is None or len(cached) != len(seeds):
                    yield where, None, [f"{where}: split {split}: no stored generated tasks"]
                    continue
            if cached is None and cached_only:
                raise NotCached(f"{where}: split {split} is not generated yet")
            if cached is None and generate is None:
                try:
                    module = _import(root, gen.module, f"gen_{gen_name}")
                except PackError as exc:
                    yield where, None, exc.problems
                    break
                generate = getattr(module, "generate", None)
                if not callable(generate):
                    yield (
                        where,
                        None,
                        [f"{root / gen.module}: needs `generate(seed, index, level) -> dict`"],
                    )
                    break
            results: list[str | None] = []  # each call's task as JSON, None if it failed
            for index, seed in enumerate(seeds):
                if progress is not None:
                    progress(done, total, "tasks")  # those done before this call
                done += 1
                level = levels[index]
                shown = "<sealed>" if sealed else seed
                at = f"{root / gen.module}: generate(seed={shown}, index={index}, level={level})"
                try:
                    raw = (
                        cached[index]
                        if cached is not None
                        else cast(Callable[..., Any], generate)(seed=seed, index=index, level=level)
                    )
                except Exception as exc:
                    why = "" if sealed else f": {exc}"
                    results.append(None)
                    yield at, None, [f"{at} raised {type(exc).__name__}{why}"]
                    continue
                results.append(as_json(raw))  # before anything below can change it
                if not isinstance(raw, dict):
                    yield at, None, [f"{at} returned {type(raw).__name__}, not a task dict"]
                    continue
                task = dict(raw)
                if sealed:
                    task["id"] = drawing.sealed_id(gen_name, split, index, draw)
                    if drawn is not None and secret is not None:
                        drawn[task["id"]] = draw
                task.setdefault("id", f"{gen_name}-{seed}")
                task.setdefault("family", gen.family)
                task.setdefault("domain", gen.domain)
                task.setdefault("difficulty", f"level-{level}")
                if gen.expected_reward is not None:
                    task.setdefault("expected_reward", gen.expected_reward)
                problems = []
                if task.setdefault("split", split) != split:
                    problems.append(f"{at}: returned split {task['split']!r}, not {split!r}")
                    task["split"] = split
                yield at, task, problems
            if cache is not None and entry and cached is None:
                cache.put(entry, results)


def _source_tasks(
    root: Path,
    manifest: PackManifest,
    secret: bytes | None = None,
    *,
    cached_only: bool = False,
    progress: Progress | None = None,
) -> Iterator[Found]:
    """`load_tasks()`, with what of these keywords it takes: `secret` (the server's
    held-out secret, to draw its sealed tasks from seeds nobody else can compute),
    `cached_only` (raise NotCached rather than generate: a slow source takes it, so a server
    starts at once and warms it in the background) and `progress(done, total, unit)`."""
    assert manifest.source is not None
    rel = manifest.source.python
    try:
        module = _import(root, rel, "source")
        loader = module.load_tasks
    except PackError as exc:
        yield f"{root / rel}", None, exc.problems
        return
    except AttributeError:
        yield (
            f"{root / rel}",
            None,
            [f"{root / rel}: needs a `load_tasks()` that yields task dicts"],
        )
        return
    try:
        takes = inspect.signature(loader).parameters
        given = {"secret": secret, "cached_only": cached_only, "progress": progress}
        kwargs = {name: value for name, value in given.items() if name in takes}
        for i, task in enumerate(loader(**kwargs)):
            yield f"{rel} task #{i}", task, []
    except NotCached:
        raise
    except Exception as exc:
        yield (
            f"{root / rel}",
            None,
            [f"{root / rel}: load_tasks() raised {type(exc).__name__}: {exc}"],
        )


def build_task(
    record: TaskRecord,
    manifest: PackManifest,
    secret: bytes | None,
    draw: int | None = None,
    blobs: BlobSource | None = None,
) -> Task:
    """The task `record` describes, with the pack's defaults and its digest (a sealed
    split's digest is keyed by the server's held-out secret, server/heldout.py); `draw`:
    the held-out draw a sealed generated task belongs to; `blobs`: where the bytes of the
    binary files it names are (its pack's, server/packs/blobs.py)."""
    split = manifest.splits.get(record.split)
    sealed = split is not None and split.sealed
    domain = record.domain or f"{manifest.name.split('/')[1]}/{record.family}"
    difficulty = record.difficulty if record.difficulty != "" else manifest.defaults.difficulty
    return Task(
        id=record.id,
        family=record.family,
        domain=domain,
        split=record.split,
        pack=manifest.name,
        version=manifest.version,
        public=record.public,
        private=record.private,
        difficulty=str(difficulty),
        sealed=sealed,
        draw=draw,
        blob_source=blobs,
        digest=heldout.task_digest(
            Task.compute_digest(record.family, domain, record.public, record.private),
            secret if sealed else None,
        ),
    )


def finalize_task(task: Task, policy: HostPolicy, family: TaskValidator | None = None) -> list[str]:
    """The one check every built task of a loaded pack passes before the pack holds it:
    its problems as 'field: what to fix' (the caller names the pack and the task); any
    problem refuses the pack. No field names a host path (server/packs/taskfields.py), and
    the fields fit the family's models (`validate_task`, server/packs/validator.py) where the
    family is known."""
    problems = task_field_problems(task.public, task.private, policy)
    if family is not None:
        try:
            family.validate_task(task)
        except ValueError as exc:
            problems.append(f"family {family.name}: {field_problem(exc)}")
    return problems


def inspect_pack(
    root: Path,
    known_families: Iterable[str | TaskValidator] | None = None,
    policy: HostPolicy | None = None,
    *,
    secret: bytes | None = None,
    cache: GeneratedTaskCache | None = None,
    generated: GeneratedSet | None = None,
    broken: Mapping[str, str] | None = None,
    cached_only: bool = False,
    progress: Progress | None = None,
    draws: drawing.Draws | None = None,
) -> tuple[Pack | None, list[str]]:
    """Load what can be loaded and list every problem; the pack is None if pack.toml is unusable.

    Tasks with problems are left out of the pack; `load_pack` refuses any problem. `policy`
    (default: Settings' defaults) is what a task's image, toolchain and paths may name.
    `secret` (a server's, server/heldout.py) seeds sealed generated tasks; without it they
    come from public seeds (local tools: `palaestra pack check`). `cache` keeps generated
    tasks between loads (server/packs/gencache.py); `generated` replaces running the
    generators (the tasks a sandbox made at publish: no generator is imported). `broken`
    (family name -> why it failed to import) turns its tasks into one problem per family
    (`Pack.unavailable`). `cached_only`: raise NotCached where tasks would be generated
    (server/packs/warming.py warms that pack); `progress` follows the generation.
    `draws`: the held-out draw of each rotated sealed generated split (with `secret`;
    absent: draw 0)."""
    root = Path(root)
    broken = broken or {}
    policy = policy or HostPolicy.default()
    try:
        manifest = read_manifest(root)
    except PackError as exc:
        return None, exc.problems
    problems: list[str] = []
    hashes = file_hashes(root)
    for path in pack_files(root).values():
        if path.is_symlink():
            problems.append(f"{path}: symlinks are not allowed in a pack; copy the file")
    problems.extend(verify_lock(root, hashes))
    blobs = BlobIndex(policy.max_blob_bytes, policy.max_blobs_bytes)
    problems.extend(blobs.scan(root, hashes))
    source = BlobSource(root)  # filled once every task's in-place blobs are known
    # A family (not only its name) also checks its tasks' fields (TaskValidator.validate_task).
    families = list(known_families) if known_families is not None else None
    checkers = {f.name: f for f in families or () if not isinstance(f, str)}
    known = (
        {f if isinstance(f, str) else f.name for f in families} if families is not None else None
    )
    sealed = {name: split.sealed for name, split in manifest.splits.items()}
    rotatable = drawing.rotatable_splits(manifest) if secret is not None else []
    split_draws = {s: (draws or {}).get((manifest.name, s), 0) for s in rotatable}
    drawn: dict[str, int] = {}  # a sealed generated task's id -> its draw
    found: list[Iterator[Found]] = []
    if (root / "tasks.jsonl").exists():
        found.append(_jsonl_tasks(root))
    if (root / "tasks").is_dir():
        found.append(directory_tasks(root, blobs))
    if manifest.generators:
        found.append(
            _generated_tasks(
                root,
                manifest,
                secret,
                cache,
                hashes,
                generated,
                cached_only=cached_only,
                progress=progress,
                draws=split_draws,
                drawn=drawn,
            )
        )
    if manifest.source is not None:
        found.append(
            _source_tasks(root, manifest, secret, cached_only=cached_only, progress=progress)
        )
    if not found:
        problems.append(
            f"{root}: no tasks: add tasks.jsonl, tasks/<id>/ folders, [generators.<name>] or "
            "[source] python in pack.toml"
        )
    tasks: dict[str, Task] = {}
    expected: dict[str, float] = {}
    seen: dict[str, str] = {}
    families_used: set[str] = set()
    unavailable: dict[str, int] = {}  # tasks of each broken family
    for where, raw, task_problems in (item for source in found for item in source):
        problems.extend(task_problems)
        if raw is None:
            continue
        try:
            record = TaskRecord.model_validate(raw)
        except ValidationError as exc:
            problems.extend(validation_problems(where, exc))
            continue
        if record.family in broken:
            unavailable[record.family] = unavailable.get(record.family, 0) + 1
            continue
        bad = len(task_problems) > 0
        refused = task_blob_problems(record.public, record.private, blobs)
        task = build_task(record, manifest, secret, drawn.get(record.id), source)
        refused += finalize_task(task, policy, checkers.get(record.family))
        if refused:
            problems.extend(f"{where}: pack {manifest.name}, task {task.id}: {p}" for p in refused)
            bad = True
        if record.split not in sealed:
            problems.append(
                f"{where}: split {record.split!r} is not declared; add [splits.{record.split}] "
                f"to pack.toml or use one of {sorted(sealed)}"
            )
            bad = True
        if known is not None and record.family not in known:
            problems.append(
                f"{where}: unknown family {record.family!r}; this server has "
                f"{', '.join(sorted(known))} (install the family's package)"
            )
            bad = True
        if manifest.families and record.family not in manifest.families:
            problems.append(
                f"{where}: family {record.family!r} is not listed in pack.toml's families "
                f"{manifest.families}; add it"
            )
            bad = True
        if record.id in seen:
            problems.append(
                f"{where}: duplicate task id {record.id!r} (first at {seen[record.id]}); "
                "task ids are unique in a pack"
            )
            continue
        seen[record.id] = where
        if bad:
            continue
        families_used.add(record.family)
        tasks[record.id] = task
        expected[record.id] = (
            record.expected_reward
            if record.expected_reward is not None
            else manifest.defaults.expected_reward
        )
    problems.extend(blobs.total_problems(root))
    source.files.update(blobs.relative_to(root))
    problems.extend(
        f"{root / 'pack.toml'}: {broken[name]}; {count} task(s) of this pack use it"
        for name, count in sorted(unavailable.items())
    )
    extra = [t.digest for t in tasks.values()] if manifest.source is not None else []
    pack = Pack(
        name=manifest.name,
        version=manifest.version,
        description=manifest.description,
        license=manifest.license,
        families=manifest.families or sorted(families_used),
        sealed=sealed,
        digest=files_digest(hashes, extra),
        root=root,
        tasks=tasks,
        expected=expected,
        manifest=manifest,
        files=hashes,
        unavailable={name: broken[name] for name in sorted(unavailable)},
        draws=split_draws,
        blobs=source,
    )
    return pack, problems


def load_pack(
    root: Path,
    known_families: Iterable[str | TaskValidator] | None = None,
    policy: HostPolicy | None = None,
    *,
    secret: bytes | None = None,
    cache: GeneratedTaskCache | None = None,
    generated: GeneratedSet | None = None,
    broken: Mapping[str, str] | None = None,
    cached_only: bool = False,
    draws: drawing.Draws | None = None,
) -> Pack:
    """Read and validate one pack directory; raises PackError listing what to fix
    (PackUnavailable where some of its tasks are of a family that failed to import;
    NotCached, with `cached_only`, where some of its tasks are not generated yet)."""
    pack, problems = inspect_pack(
        root,
        known_families,
        policy,
        secret=secret,
        cache=cache,
        generated=generated,
        broken=broken,
        cached_only=cached_only,
        draws=draws,
    )
    if pack is not None and pack.unavailable:
        raise PackUnavailable(pack.name, pack.version, pack.unavailable, problems)
    if problems or pack is None:
        raise PackError(problems)
    return pack


class PackUnavailable(PackError):
    """A pack not served because families its tasks use failed to import."""

    def __init__(
        self, name: str, version: str, families: dict[str, str], problems: list[str]
    ) -> None:
        super().__init__(problems)
        self.name = name
        self.version = version
        self.families = families  # {family: why}
