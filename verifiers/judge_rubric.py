"""The rubric a judge grades against: criteria with weights and ordered choices, from TOML.

A criterion's choices run worst -> best and choice i of n is worth i / (n - 1), so a rubric
author writes words a judge can pick between ("wrong", "partly right", "right") and never
a number the judge would have to invent; the score is the weighted mean. Loading names the
file, the criterion and the field at fault (RubricError).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# A rubric is sent with every call and its criteria and choices become the reply schema's
# enums (which an endpoint compiles into a grammar): bounded, so one pack cannot make every
# call to an endpoint the whole server shares slow or refused.
MAX_CRITERIA = 32
MAX_CHOICES = 16
MAX_NAME = 200
MAX_TEXT = 4000
MAX_WEIGHT = 1e6


class RubricError(ValueError):
    """A rubric that cannot be used; the message names the file, criterion and field."""


class Criterion(BaseModel):
    """One thing the judge grades; choice i of n is worth i / (n - 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME)
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    # bounded: two weights of 1e308 sum to inf, and inf / inf made the score NaN
    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT, strict=True, allow_inf_nan=False)
    choices: list[Annotated[str, Field(max_length=MAX_NAME)]] = Field(
        min_length=2, max_length=MAX_CHOICES
    )

    @field_validator("choices")
    @classmethod
    def _distinct(cls, choices: list[str]) -> list[str]:
        if any(not c.strip() for c in choices):
            raise ValueError("a choice is empty")
        if len(set(choices)) != len(choices):
            raise ValueError("choices repeat (each must be distinct)")
        return choices

    def value(self, choice: str) -> float:
        return self.choices.index(choice) / (len(self.choices) - 1)


class Rubric(BaseModel):
    """Named, weighted criteria; the score of a verdict is their weighted mean."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME)
    criteria: list[Criterion] = Field(min_length=1, max_length=MAX_CRITERIA)

    @field_validator("criteria")
    @classmethod
    def _unique(cls, criteria: list[Criterion]) -> list[Criterion]:
        names = [c.name for c in criteria]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"criterion names repeat: {', '.join(twice)}")
        return criteria

    def digest(self) -> str:
        return digest_of(self.model_dump(mode="json"))

    def score(self, components: Mapping[str, float]) -> float:
        total = sum(c.weight for c in self.criteria)
        return sum(c.weight * components[c.name] for c in self.criteria) / total

    @classmethod
    def from_toml(cls, text: str, source: str = "<rubric>") -> Rubric:
        """A rubric from TOML: `name`, then `[[criteria]]` tables of name, text, weight
        (default 1) and choices (worst first)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RubricError(f"{source}: not valid TOML: {exc}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RubricError(f"{source}: {_rubric_problems(exc, data)}") from None

    @classmethod
    def load(cls, path: Path) -> Rubric:
        try:
            text = path.read_text()
        except OSError as exc:
            raise RubricError(f"{path}: cannot read the rubric: {exc.strerror}") from None
        return cls.from_toml(text, source=str(path))


def _rubric_problems(exc: ValidationError, data: Mapping[str, Any]) -> str:
    """Pydantic's errors said the way a rubric author reads them."""
    criteria = data.get("criteria")
    problems = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = "rubric"
        if loc[:1] == ["criteria"] and len(loc) > 1 and isinstance(loc[1], int):
            index = loc[1]
            entry = criteria[index] if isinstance(criteria, list) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            where = f"criteria #{index + 1}" + (f" ({name!r})" if name else "")
            loc = loc[2:]
        key = ".".join(str(p) for p in loc)
        kind = error["type"]
        if kind == "extra_forbidden":
            what = f"unknown key {key!r}"
        elif kind == "missing":
            what = f"missing field {key!r}"
        elif kind == "greater_than":
            what = f"{key} must be > 0"
        elif kind == "less_than_equal":
            what = f"{key} must be <= {MAX_WEIGHT:g}"
        elif kind == "too_short" and key == "choices":
            what = "choices needs at least 2 entries (worst first, best last)"
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            what = f"{key}: {message}" if key else message
        problems.append(f"{where}: {what}")
    return "; ".join(problems)


def digest_of(value: Any) -> str:
    """sha256 of `value` as canonical JSON, written `sha256:…`."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
