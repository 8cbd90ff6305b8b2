"""pack.toml (DESIGN §6): its model, which is the schema (docs/pack.schema.json), and parsing.

`read_manifest` validates a pack's pack.toml and raises one `PackError` whose `problems`
list says, for each problem, what to fix; `TaskRecord` is one task as the three forms write
it. Names (`org/name`), versions (semver) and task ids are checked here.
"""

from __future__ import annotations

import itertools
import re
import tomllib
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


def validation_problems(where: str, exc: ValidationError) -> list[str]:
    """One 'where: field: what to fix' line per error of a pydantic validation."""
    problems = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = _HINTS.get(error["type"], error["msg"])
        message = message.removeprefix("Value error, ")
        problems.append(f"{where}: {loc}: {message}")
    return problems


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
        raise PackError(validation_problems(str(toml_path), exc)) from None


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
