"""Task packs on disk (DESIGN §6): `pack.toml`, `pack.lock` and tasks in three forms.

A pack directory holds `pack.toml` (validated against `PackManifest`, whose JSON Schema is
docs/pack.schema.json), an optional `pack.lock` (the sha256 of every file and the pack
digest) and its tasks, in any mix of:

- `tasks.jsonl` (compact): one task a line, `{id, family, domain, split, difficulty,
  expected_reward, public{}, private{}}`;
- `tasks/<id>/` (directory): `task.toml` (the same keys, `[public]`/`[private]` tables),
  `instruction.md` (→ `public.instruction`), and file maps `{relative path: text}`:
  `environment/` and `assets/` (public), `verifier/` and `solution/` (private);
- `[generators.<name>]` (procedural): a Python file with `generate(seed, index, level) ->
  dict`, called for each split's seeds (drawn from the split's declared seed range);
- `[source] python = "file.py"` (a variant): `load_tasks()` yields task dicts, for data
  sets that ship in a Python package (HumanEval).

The loader collects every problem it can find (not just the first) and raises one
`PackError` whose `problems` list says, for each, what to fix.

The pack digest (`files_digest`, the one place it is computed) is sha256 over the sorted
(path, sha256(bytes)) of the pack's files — pack.lock, `__pycache__` and dotfiles excluded —
so it can be recomputed from the lock; a `[source]` pack also mixes in its tasks' digests,
since its data lives outside the directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import itertools
import json
import logging
import random
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from palaestra.envs.base import Family, TaskFieldsError
from palaestra.sdk.errors import BadRequestError, NotFoundError
from palaestra.sdk.models import PackInfo, SplitInfo
from palaestra.sdk.task import Task
from palaestra.server import heldout
from palaestra.server.taskfields import HostPolicy, task_field_problems

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*/[a-z0-9][a-z0-9_.-]*$"
NAME_RE = re.compile(NAME_PATTERN)
# semver.org's own regular expression: MAJOR.MINOR.PATCH[-prerelease][+build], no leading zeros.
SEMVER_PATTERN = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
SEMVER_RE = re.compile(SEMVER_PATTERN)
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
TASK_ID_RE = re.compile(TASK_ID_PATTERN)
SPLIT_PATTERN = r"^[a-z][a-z0-9_-]*$"
REF_RE = re.compile(r"^(?P<pack>[^@:\s]+/[^@:\s]+)(?:@(?P<version>[^:\s]+))?:(?P<task>\S+)$")
TASK_KEYS = {
    "id",
    "family",
    "domain",
    "split",
    "difficulty",
    "expected_reward",
    "public",
    "private",
}
LOCK_FILE = "pack.lock"
LOCK_VERSION = 1
# Directory form: the folders of tasks/<id>/ and where their file maps land.
TASK_DIRS: dict[str, tuple[str, str]] = {
    "environment": ("public", "environment"),
    "assets": ("public", "assets"),
    "verifier": ("private", "verifier"),
    "solution": ("private", "solution"),
}

SplitName = Annotated[str, StringConstraints(pattern=SPLIT_PATTERN)]
GeneratorName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]


class PackError(ValueError):
    """A pack on disk is malformed; `problems` lists each problem and what to fix."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


# -- pack.toml: the model is the schema (docs/pack.schema.json is generated from it) -----------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SplitConfig(_Strict):
    """A named subset of the pack's tasks."""

    sealed: bool = Field(
        default=False,
        description="private fields, verifier files and solutions never leave the server",
    )
    description: str = ""


class Defaults(_Strict):
    """Values a task takes when it does not set them."""

    expected_reward: float = Field(
        default=1.0, ge=0.0, le=1.0, description="the least reward the oracle must score"
    )
    difficulty: str = ""


class Checks(_Strict):
    """How `palaestra pack check` proves the pack."""

    timeout_s: float = Field(default=60.0, gt=0, description="per episode; a hang is a failure")
    cheat_max_reward: float = Field(
        default=0.1, ge=0.0, le=1.0, description="the most a known cheat may score"
    )
    allow_cheats: dict[str, str] = Field(
        default_factory=dict,
        description="known cheats this pack cannot stop, each with the reason (reported, not "
        "failed)",
    )


class SourceConfig(_Strict):
    """A Python file whose `load_tasks()` yields task dicts (data from an installed package)."""

    python: str = Field(description="path of the file, relative to the pack directory")

    @field_validator("python")
    @classmethod
    def _relative(cls, value: str) -> str:
        return _relative_py(value)


class GeneratorSplit(_Strict):
    """The seed range `[first, end)` of one split and how many tasks to draw from it."""

    seeds: tuple[int, int] = Field(description="[first, end): the seeds reserved for this split")
    count: int = Field(ge=1, description="tasks generated for this split")

    @model_validator(mode="after")
    def _fits(self) -> GeneratorSplit:
        first, end = self.seeds
        if first < 0 or end <= first:
            raise ValueError(
                f"seeds must be [first, end) with 0 <= first < end, got {[first, end]}"
            )
        if self.count > end - first:
            raise ValueError(
                f"count {self.count} is more than the {end - first} seeds in {[first, end]}"
            )
        return self


class GeneratorConfig(_Strict):
    """A procedural task source: `generate(seed: int, index: int, level: int) -> dict`."""

    module: str = Field(description="the generator's .py file, relative to the pack directory")
    family: str
    domain: str = Field(description="pack/category, e.g. 'arith/add'")
    levels: list[int] = Field(
        default_factory=lambda: [1], min_length=1, description="difficulty levels, cycled"
    )
    expected_reward: float | None = Field(default=None, ge=0.0, le=1.0)
    splits: dict[SplitName, GeneratorSplit] = Field(min_length=1)

    @field_validator("module")
    @classmethod
    def _relative(cls, value: str) -> str:
        return _relative_py(value)

    @model_validator(mode="after")
    def _disjoint(self) -> GeneratorConfig:
        ranges = sorted((s.seeds, name) for name, s in self.splits.items())
        for (a, name_a), (b, name_b) in itertools.pairwise(ranges):
            if b[0] < a[1]:
                raise ValueError(
                    f"the seed ranges of splits {name_a!r} {list(a)} and {name_b!r} {list(b)} "
                    "overlap; give every split its own range so held-out seeds never appear "
                    "in training"
                )
        return self


class PackManifest(_Strict):
    """pack.toml: a versioned bundle of tasks of one or more families, with splits."""

    model_config = ConfigDict(extra="forbid", title="pack.toml")

    name: str = Field(
        description="org/name, lowercase", json_schema_extra={"pattern": NAME_PATTERN}
    )
    version: str = Field(
        description="semver: MAJOR.MINOR.PATCH[-prerelease][+build]",
        json_schema_extra={"pattern": SEMVER_PATTERN},
    )
    description: str = ""
    license: str = ""
    families: list[str] = Field(default_factory=list, description="families the tasks use")
    splits: dict[SplitName, SplitConfig] = Field(min_length=1)
    defaults: Defaults = Field(default_factory=Defaults)
    checks: Checks = Field(default_factory=Checks)
    source: SourceConfig | None = None
    generators: dict[GeneratorName, GeneratorConfig] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(
                f"name must look like 'org/name' (lowercase letters, digits, '.', '_', '-'), "
                f"got {value!r}"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not SEMVER_RE.match(value):
            raise ValueError(
                "version must be semver MAJOR.MINOR.PATCH with optional -prerelease and "
                f"+build, no leading zeros (e.g. '1.0.0', '2.1.0-rc.1'), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _generator_splits(self) -> PackManifest:
        for gen_name, gen in self.generators.items():
            for split in gen.splits:
                if split not in self.splits:
                    raise ValueError(
                        f"generators.{gen_name}.splits.{split}: split {split!r} is not declared; "
                        f"add [splits.{split}] or use one of {sorted(self.splits)}"
                    )
        return self


class TaskRecord(_Strict):
    """One task as the three forms write it."""

    id: str = Field(json_schema_extra={"pattern": TASK_ID_PATTERN})
    family: str
    domain: str | None = None
    split: str
    difficulty: str | int | float = ""
    expected_reward: float | None = Field(default=None, ge=0.0, le=1.0)
    public: dict[str, Any]
    private: dict[str, Any]

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not TASK_ID_RE.match(value):
            raise ValueError(
                f"task id {value!r} must start with a letter or digit and use only letters, "
                "digits, '.', '_' and '-'"
            )
        return value


def manifest_schema() -> dict[str, Any]:
    """The JSON Schema of pack.toml (docs/pack.schema.json)."""
    schema = PackManifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://palaestra.dev/schemas/pack.schema.json"
    return schema


def _relative_py(value: str) -> str:
    parts = Path(value).parts
    if not value.endswith(".py") or value.startswith("/") or ".." in parts:
        raise ValueError(f"must be a .py file inside the pack directory, got {value!r}")
    return value


_HINTS = {
    "missing": "required: add it",
    "extra_forbidden": "unknown key: remove it or fix its spelling",
}


def _validation_problems(where: str, exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = _HINTS.get(error["type"], error["msg"])
        message = message.removeprefix("Value error, ")
        problems.append(f"{where}: {loc}: {message}")
    return problems


# -- files, lock and digest ---------------------------------------------------------------------
def _skipped(rel: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in rel.parts)


def pack_files(root: Path) -> dict[str, Path]:
    """The files a pack is made of, by relative POSIX path: no pack.lock, __pycache__, dotfiles."""
    found: dict[str, Path] = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if _skipped(rel) or rel.as_posix() == LOCK_FILE or path.is_dir():
            continue
        found[rel.as_posix()] = path
    return dict(sorted(found.items()))


def file_hashes(root: Path) -> dict[str, str]:
    """`{path: "sha256:<hex>"}` for every file of the pack, sorted by path."""
    return {
        rel: "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        for rel, path in pack_files(root).items()
        if not path.is_symlink()
    }


def files_digest(hashes: Mapping[str, str], task_digests: Iterable[str] = ()) -> str:
    """The pack digest: sha256 over sorted (path, sha256(bytes)); the one place it is computed.

    `task_digests` (a `[source]` pack's tasks, whose data is outside the directory) are
    mixed in after the files."""
    h = hashlib.sha256()
    for rel in sorted(hashes):
        h.update(rel.encode() + b"\0")
        h.update(bytes.fromhex(hashes[rel].removeprefix("sha256:")))
    for digest in task_digests:
        h.update(digest.encode())
    return "sha256:" + h.hexdigest()


def pack_digest(root: Path) -> str:
    """The digest of a pack directory's files (what pack.lock records)."""
    return files_digest(file_hashes(root))


def lock_text(root: Path) -> str:
    hashes = file_hashes(root)
    body = {"lock_version": LOCK_VERSION, "digest": files_digest(hashes), "files": hashes}
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def write_lock(root: Path) -> str:
    """Write (or refresh) `pack.lock`; returns the pack digest."""
    text = lock_text(root)
    (root / LOCK_FILE).write_text(text, encoding="utf-8")
    digest: str = json.loads(text)["digest"]
    return digest


def verify_lock(root: Path, hashes: Mapping[str, str] | None = None) -> list[str]:
    """Problems with `pack.lock` (none if it is absent or right): one per file that differs."""
    path = root / LOCK_FILE
    if not path.exists():
        return []
    fix = "run `palaestra pack build` to refresh the lock if the change is intended"
    try:
        lock = json.loads(path.read_text(encoding="utf-8"))
        locked = lock["files"]
        if not isinstance(locked, dict):
            raise TypeError("files is not a table")
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path}: not a pack lock ({exc}); {fix}"]
    hashes = file_hashes(root) if hashes is None else hashes
    problems = []
    for rel in sorted(locked.keys() | hashes.keys()):
        if rel not in hashes:
            problems.append(
                f"{path}: {rel} is locked but missing from the pack; restore it or {fix}"
            )
        elif rel not in locked:
            problems.append(f"{path}: {rel} is in the pack but not in the lock; remove it or {fix}")
        elif locked[rel] != hashes[rel]:
            problems.append(f"{path}: {rel} differs from its locked sha256; {fix}")
    if not problems and lock.get("digest") != files_digest(locked):
        problems.append(f"{path}: its digest does not match its file list; {fix}")
    return problems


# -- the pack -----------------------------------------------------------------------------------
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
    expected: dict[str, float] = field(default_factory=dict)
    manifest: PackManifest | None = None
    files: dict[str, str] = field(default_factory=dict)

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


Found = tuple[str, dict[str, Any] | None, list[str]]  # where, the task dict or None, problems


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


def _file_map(folder: Path) -> tuple[dict[str, str], list[str]]:
    files: dict[str, str] = {}
    problems: list[str] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if _skipped(rel) or path.is_dir():
            continue
        if path.is_symlink():
            problems.append(f"{path}: symlinks are not allowed in a pack; copy the file")
            continue
        try:
            files[rel.as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            problems.append(f"{path}: not UTF-8 text; task files are text (encode binary data)")
    return files, problems


def _dir_task(task_dir: Path) -> Found:
    toml_path = task_dir / "task.toml"
    where = str(toml_path)
    problems: list[str] = []
    try:
        raw: dict[str, Any] = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return where, None, [f"{task_dir}: no task.toml; every tasks/<id>/ needs one"]
    except tomllib.TOMLDecodeError as exc:
        return where, None, [f"{where}: invalid TOML ({exc})"]
    raw.setdefault("id", task_dir.name)
    if raw["id"] != task_dir.name:
        problems.append(
            f"{where}: id {raw['id']!r} differs from its folder name {task_dir.name!r}; "
            "make them equal (or drop `id`)"
        )
    public = raw.setdefault("public", {})
    private = raw.setdefault("private", {})
    if not isinstance(public, dict) or not isinstance(private, dict):
        return where, None, [*problems, f"{where}: [public] and [private] must be tables"]
    instruction = task_dir / "instruction.md"
    if instruction.exists():
        if "instruction" in public:
            problems.append(
                f"{where}: public.instruction is set and instruction.md exists; keep one"
            )
        public["instruction"] = instruction.read_text(encoding="utf-8")
    for folder, (side, key) in TASK_DIRS.items():
        if not (task_dir / folder).is_dir():
            continue
        target = public if side == "public" else private
        if key in target:
            problems.append(f"{where}: {side}.{key} is set and {folder}/ exists; keep one")
            continue
        files, bad = _file_map(task_dir / folder)
        target[key] = files
        problems.extend(bad)
    for path in sorted(task_dir.iterdir()):
        if path.name.startswith(".") or path.name == "__pycache__":
            continue
        if path.name not in {"task.toml", "instruction.md", *TASK_DIRS}:
            problems.append(
                f"{path}: not part of the directory form; put it under environment/, assets/ "
                "(public) or verifier/, solution/ (private)"
            )
    return where, raw, problems


def _directory_tasks(root: Path) -> Iterator[Found]:
    for task_dir in sorted(p for p in (root / "tasks").iterdir() if not p.name.startswith(".")):
        if task_dir.name == "__pycache__":
            continue
        if not task_dir.is_dir():
            yield str(task_dir), None, [f"{task_dir}: tasks/ holds one folder per task"]
            continue
        yield _dir_task(task_dir)


def generator_seeds(
    pack: str, generator: str, split: str, spec: GeneratorSplit, secret: bytes | None = None
) -> list[int]:
    """The seeds a split draws: `count` distinct seeds of its range, fixed by the names, or
    (a sealed split on a server: `secret`) by an HMAC of the server's held-out secret."""
    first, end = spec.seeds
    label = f"{pack}/{generator}/{split}"
    rng = random.Random(label) if secret is None else heldout.seeded(secret, label)
    return sorted(rng.sample(range(first, end), spec.count))


def _generated_tasks(
    root: Path, manifest: PackManifest, secret: bytes | None = None
) -> Iterator[Found]:
    """A sealed split's tasks get secret seeds (with `secret`) and ids that name no seed
    (`<generator>-<split>-<index>`, whatever the generator says), and their problems quote
    neither the seed nor the generator's error text (pack errors are shown by /readyz)."""
    for gen_name, gen in manifest.generators.items():
        where = f"{root / 'pack.toml'}: generators.{gen_name}"
        try:
            module = _import(root, gen.module, f"gen_{gen_name}")
        except PackError as exc:
            yield where, None, exc.problems
            continue
        generate: Callable[..., Any] | None = getattr(module, "generate", None)
        if not callable(generate):
            yield (
                where,
                None,
                [f"{root / gen.module}: needs `generate(seed, index, level) -> dict`"],
            )
            continue
        for split, spec in gen.splits.items():
            sealed = manifest.splits[split].sealed
            key = secret if sealed else None
            seeds = generator_seeds(manifest.name, gen_name, split, spec, key)
            for index, seed in enumerate(seeds):
                level = gen.levels[index % len(gen.levels)]
                shown = "<sealed>" if sealed else seed
                at = f"{root / gen.module}: generate(seed={shown}, index={index}, level={level})"
                try:
                    raw = generate(seed=seed, index=index, level=level)
                except Exception as exc:
                    why = "" if sealed else f": {exc}"
                    yield at, None, [f"{at} raised {type(exc).__name__}{why}"]
                    continue
                if not isinstance(raw, dict):
                    yield at, None, [f"{at} returned {type(raw).__name__}, not a task dict"]
                    continue
                task = dict(raw)
                if sealed:
                    task["id"] = f"{gen_name}-{split}-{index}"
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


def _source_tasks(
    root: Path, manifest: PackManifest, secret: bytes | None = None
) -> Iterator[Found]:
    """`load_tasks()`, or `load_tasks(secret=...)` where the source takes the server's
    held-out secret (to draw its sealed tasks from seeds nobody else can compute)."""
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
        wants = "secret" in inspect.signature(loader).parameters
        for i, task in enumerate(loader(secret=secret) if wants else loader()):
            yield f"{rel} task #{i}", task, []
    except Exception as exc:
        yield (
            f"{root / rel}",
            None,
            [f"{root / rel}: load_tasks() raised {type(exc).__name__}: {exc}"],
        )


def read_manifest(root: Path) -> PackManifest:
    """Parse and validate pack.toml; raises PackError listing every problem."""
    toml_path = root / "pack.toml"
    try:
        meta = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackError(f"{root}: no pack.toml; `palaestra pack init` writes one") from None
    except tomllib.TOMLDecodeError as exc:
        raise PackError(f"{toml_path}: invalid TOML ({exc})") from None
    try:
        return PackManifest.model_validate(meta)
    except ValidationError as exc:
        raise PackError(_validation_problems(str(toml_path), exc)) from None


def inspect_pack(
    root: Path,
    known_families: Iterable[str | Family] | None = None,
    policy: HostPolicy | None = None,
    *,
    secret: bytes | None = None,
) -> tuple[Pack | None, list[str]]:
    """Load what can be loaded and list every problem; the pack is None if pack.toml is unusable.

    Tasks with problems are left out of the pack; `load_pack` refuses any problem. `policy`
    (default: Settings' defaults) is what a task's image, toolchain and paths may name.
    `secret` (a server's, server/heldout.py) seeds sealed generated tasks; without it they
    come from public seeds (local tools: `palaestra pack check`)."""
    root = Path(root)
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
    # A Family (not only its name) also checks its tasks' fields (Family.validate_task).
    checkers = {f.name: f for f in known_families or () if not isinstance(f, str)}
    known = (
        {f if isinstance(f, str) else f.name for f in known_families}
        if known_families is not None
        else None
    )
    sealed = {name: split.sealed for name, split in manifest.splits.items()}
    pack_short = manifest.name.split("/")[1]
    found: list[Iterator[Found]] = []
    if (root / "tasks.jsonl").exists():
        found.append(_jsonl_tasks(root))
    if (root / "tasks").is_dir():
        found.append(_directory_tasks(root))
    if manifest.generators:
        found.append(_generated_tasks(root, manifest, secret))
    if manifest.source is not None:
        found.append(_source_tasks(root, manifest, secret))
    if not found:
        problems.append(
            f"{root}: no tasks: add tasks.jsonl, tasks/<id>/ folders, [generators.<name>] or "
            "[source] python in pack.toml"
        )
    tasks: dict[str, Task] = {}
    expected: dict[str, float] = {}
    seen: dict[str, str] = {}
    families_used: set[str] = set()
    for where, raw, task_problems in (item for source in found for item in source):
        problems.extend(task_problems)
        if raw is None:
            continue
        try:
            record = TaskRecord.model_validate(raw)
        except ValidationError as exc:
            problems.extend(_validation_problems(where, exc))
            continue
        bad = len(task_problems) > 0
        host = task_field_problems(record.public, record.private, policy)
        if host:
            problems.extend(f"{where}: pack {manifest.name}, task {record.id}: {p}" for p in host)
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
        domain = record.domain or f"{pack_short}/{record.family}"
        difficulty = record.difficulty if record.difficulty != "" else manifest.defaults.difficulty
        tasks[record.id] = Task(
            id=record.id,
            family=record.family,
            domain=domain,
            split=record.split,
            pack=manifest.name,
            version=manifest.version,
            public=record.public,
            private=record.private,
            difficulty=str(difficulty),
            sealed=sealed[record.split],
            digest=heldout.task_digest(
                Task.compute_digest(record.family, domain, record.public, record.private),
                secret if sealed[record.split] else None,
            ),
        )
        try:
            if record.family in checkers:
                checkers[record.family].validate_task(tasks[record.id])
        except TaskFieldsError as exc:
            problems.append(f"{where}: pack {manifest.name}, {exc}")
            del tasks[record.id]
            continue
        expected[record.id] = (
            record.expected_reward
            if record.expected_reward is not None
            else manifest.defaults.expected_reward
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
    )
    return pack, problems


def load_pack(
    root: Path,
    known_families: Iterable[str | Family] | None = None,
    policy: HostPolicy | None = None,
    *,
    secret: bytes | None = None,
) -> Pack:
    """Read and validate one pack directory; raises PackError listing what to fix."""
    pack, problems = inspect_pack(root, known_families, policy, secret=secret)
    if problems or pack is None:
        raise PackError(problems)
    return pack


class PackRegistry:
    """The packs the server serves, by name and version."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._packs: dict[str, dict[str, Pack]] = {}
        self.errors: dict[str, str] = {}
        self.secret = secret  # the held-out secret packs load with (server/heldout.py)
        # Published packs an admin has not enabled: served by explicit ref or `pack=`, never
        # drawn by the sampler's unfiltered mode (DESIGN §5b).
        self._held: set[str] = set()

    def add(self, pack: Pack, *, held: bool = False) -> None:
        self._packs.setdefault(pack.name, {})[pack.version] = pack
        if held:
            self._held.add(pack.name)

    def enable(self, name: str) -> None:
        """Let the sampler draw `name` with no pack filter (an admin's decision)."""
        self._held.discard(name)

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def sampled(self, name: str) -> bool:
        """Whether unfiltered sampling may draw this pack."""
        return name not in self._held

    def load_dirs(
        self,
        dirs: Iterable[Path],
        known_families: Iterable[str | Family],
        policy: HostPolicy | None = None,
    ) -> None:
        """Load every pack under `dirs`; a broken pack is recorded in `errors`, never fatal."""
        families = list(known_families)
        for base in dirs:
            for root in sorted(p.parent for p in Path(base).glob("*/pack.toml")):
                try:
                    self.add(load_pack(root, families, policy, secret=self.secret))
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
            return versions[max(versions, key=semver_key)]
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


def semver_key(version: str) -> tuple[Any, ...]:
    """Semver precedence: a release sorts after its prereleases; build metadata is ignored."""
    match = SEMVER_RE.match(version)
    if not match:
        return (tuple(int(x) for x in re.findall(r"\d+", version)[:3]), 0, ())
    core = (int(match[1]), int(match[2]), int(match[3]))
    if match[4] is None:
        return (core, 1, ())
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in match[4].split("."))
    return (core, 0, ids)


_semver_key = semver_key  # the first version's name
