"""Checked numbers and checked logic for financial-document questions.

An answer is `{value, unit, scale, program}`. It earns reward only if both hold:

1. **The number is right.** `value × scale` in the declared `unit` is turned into the
   question's canonical quantity (base currency units, a plain ratio, currency per share,
   a count): `percent` divides by 100, `fraction` and `ratio` do not, so a fraction given
   for a percentage is right only when its unit says so. It must equal the gold value within
   half a unit of the last decimal asked, in the unit and scale asked. Signs count: a
   decrease or an outflow is negative.
2. **The program is valid.** The FinQA-style program parses, runs (no zero divisor), uses
   only numbers that appear in the document (plus `const_N` constants and the years shown)
   and at least one of them, and its result is the submitted answer up to a unit or scale
   factor (a program may yield a fraction for a percent, or thousands for millions).

A correct answer scores `1 − GROUNDED_BONUS` (0.8). The bonus (0.2, so at most 1.0) is paid
only on top of a correct answer, when the program is **grounded**: every operand traces to
one cell of the document, and re-running the program with those cells' values in a
regenerated document (same layout, other numbers) gives that document's gold answer. A
program made of memorised constants, or of cells that only happen to give the right number,
fails that re-run. Imported documents (FinQA/TAT-QA) cannot be regenerated: there the
bonus is paid when every operand is present in the document.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from palaestra.verifiers import finance_program as fp

VERSION = "1.0.0"
GROUNDED_BONUS = 0.2

Unit = Literal["currency", "percent", "fraction", "ratio", "currency_per_share", "shares", "count"]
Scale = Literal["units", "thousands", "millions", "billions"]
Kind = Literal["money", "percent", "ratio", "per_share", "count"]

SCALES: dict[str, float] = {
    "units": 1.0,
    "thousands": 1e3,
    "millions": 1e6,
    "billions": 1e9,
}
# The dimension of each unit and of each gold kind; percent and ratio are one dimension.
UNIT_DIM: dict[str, str] = {
    "currency": "money",
    "percent": "ratio",
    "fraction": "ratio",
    "ratio": "ratio",
    "currency_per_share": "per_share",
    "shares": "count",
    "count": "count",
}
KIND_DIM: dict[str, str] = {
    "money": "money",
    "percent": "ratio",
    "ratio": "ratio",
    "per_share": "per_share",
    "count": "count",
}
KIND_UNIT: dict[str, str] = {
    "money": "currency",
    "percent": "percent",
    "ratio": "ratio",
    "per_share": "currency_per_share",
    "count": "count",
}


class Answer(BaseModel):
    """What `submit` takes; its JSON Schema is what agents see."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(description="the number, in the unit and scale you declare")
    unit: Unit = Field(
        description="currency | percent (12.5 means 12.5%) | fraction or ratio (0.125) | "
        "currency_per_share | shares | count"
    )
    scale: Scale = Field(default="units", description="units | thousands | millions | billions")
    program: str = Field(
        max_length=fp.MAX_CHARS,
        description="FinQA-style program over the document's numbers that computes the value, "
        "e.g. 'subtract(5829, 5735), divide(#0, 5735)'",
    )


@dataclass(frozen=True)
class Gold:
    """The private answer of a question."""

    kind: Kind
    value: float  # canonical: base currency units, a plain ratio, per share, a count
    decimals: int  # asked
    scale: Scale  # asked (money); "units" otherwise
    program: str  # over the document's numbers
    keys_program: str = ""  # over fact keys: {key} magnitude, {=key} signed
    factor: float = 1.0  # canonical = result of keys_program × factor

    @property
    def unit(self) -> str:
        return KIND_UNIT[self.kind]

    @property
    def asked_value(self) -> float:
        """The gold value in the unit and scale the question asks for."""
        return to_unit(self.value, self.unit, self.scale)

    def tolerance(self) -> float:
        """Half a unit of the last decimal asked, in canonical terms."""
        step = 0.5 * 10.0 ** (-self.decimals) * SCALES[self.scale]
        if self.unit == "percent":
            step /= 100
        return step * (1 + 1e-9) + 1e-12 * max(1.0, abs(self.value))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "value": self.value,
            "decimals": self.decimals,
            "scale": self.scale,
            "program": self.program,
            "keys_program": self.keys_program,
            "factor": self.factor,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gold:
        return cls(
            kind=data["kind"],
            value=float(data["value"]),
            decimals=int(data["decimals"]),
            scale=data.get("scale", "units"),
            program=str(data["program"]),
            keys_program=str(data.get("keys_program", "")),
            factor=float(data.get("factor", 1.0)),
        )


def canonical(value: float, unit: str, scale: str) -> float:
    """An answer's value as the canonical quantity of its dimension."""
    number = value * SCALES[scale]
    return number / 100 if unit == "percent" else number


def to_unit(value: float, unit: str, scale: str) -> float:
    """The inverse of `canonical`."""
    number = value * 100 if unit == "percent" else value
    return number / SCALES[scale]


@dataclass
class Numbers:
    """The numbers a document shows: figures by key (signed, as printed), and labels."""

    figures: dict[str, float]
    labels: frozenset[float] = frozenset()
    rows: dict[str, list[list[str]]] = field(default_factory=dict)  # label -> rows of keys
    _index: dict[float, str] | None = None

    @staticmethod
    def magnitude(value: float) -> float:
        return round(abs(value), 6)

    def key_of(self, magnitude: float) -> str | None:
        if self._index is None:
            index: dict[float, str] = {}
            for key, value in self.figures.items():
                index.setdefault(self.magnitude(value), key)
            self._index = index
        return self._index.get(round(magnitude, 6))

    def row_keys(self, label: str) -> list[str]:
        found = self.rows.get(normalize_label(label))
        if not found:
            raise fp.ProgramError(f"no table row is labelled {label!r}")
        if len(found) > 1:
            raise fp.ProgramError(
                f"{len(found)} table rows are labelled {label!r}; write the numbers instead"
            )
        return found[0]


def normalize_label(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", label.lower()).strip()


class _Binding:
    """How a program's literals map to cells: magnitude → key, and the sign the agent wrote."""

    def __init__(self, program: fp.Program, doc: Numbers) -> None:
        self.keys: dict[fp.Literal, str] = {}
        self.labels: list[fp.Literal] = []
        self.invented: list[str] = []
        for lit in program.literals:
            key = doc.key_of(lit.magnitude)
            if key is not None:
                self.keys[lit] = key
            elif round(lit.magnitude, 6) in doc.labels:
                self.labels.append(lit)
            else:
                self.invented.append(lit.text)
        self.rows = [doc.row_keys(label) for label in program.rows]

    @property
    def uses_document(self) -> bool:
        return bool(self.keys) or bool(self.rows)


def _resolver(binding: _Binding, doc: Numbers, target: Numbers) -> fp.Resolve:
    """Literal → value in `target`: same cell, same sign relation as written against `doc`."""

    def resolve(lit: fp.Literal) -> float:
        key = binding.keys.get(lit)
        if key is None:
            return lit.value
        shown = doc.figures[key]
        value = target.figures[key]
        sign = 1.0 if (lit.value >= 0) == (shown >= 0) else -1.0
        number = abs(value) * (1 if value >= 0 else -1) * sign
        return number / 100 if lit.percent else number

    return resolve


def _rows(target: Numbers) -> fp.RowValues:
    def values(label: str) -> list[float]:
        return [abs(target.figures[k]) for k in target.row_keys(label)]

    return values


def run_keys(keys_program: str, doc: Numbers) -> float:
    """Run a gold program written over fact keys ({key}: magnitude, {=key}: signed)."""

    def sub(match: re.Match[str]) -> str:
        signed, key = match.group(1) == "=", match.group(2)
        value = doc.figures[key]
        return repr(value if signed else abs(value))

    text = re.sub(r"\{(=?)([^{}]+)\}", sub, keys_program)
    return fp.evaluate(text)


def rerun(program: str, doc: Numbers, target: Numbers) -> float:
    """A program written against `doc`, run with the same cells' values in `target`."""
    parsed = fp.parse(program)
    binding = _Binding(parsed, doc)
    return fp.run(parsed, _resolver(binding, doc, target), _rows(target))[-1]


def _factors(kind: str) -> tuple[float, ...]:
    if KIND_DIM[kind] == "ratio":
        return (1.0, 0.01)
    return (1.0, 1e3, 1e6, 1e9, 1e-3, 1e-6)


@dataclass
class Grade:
    reward: float
    passed: bool
    components: dict[str, float]
    feedback: str


def grade(
    answer: Answer,
    gold: Gold,
    doc: Numbers,
    variant: tuple[Numbers, float] | None = None,
) -> Grade:
    """Score one answer (see the module docstring). `variant`: (numbers, canonical gold)."""
    notes: list[str] = []
    tol = gold.tolerance()
    value_ok = False
    if UNIT_DIM[answer.unit] != KIND_DIM[gold.kind]:
        notes.append(f"unit {answer.unit!r} does not measure what was asked ({gold.unit})")
        submitted = math.nan
    else:
        submitted = canonical(answer.value, answer.unit, answer.scale)
        value_ok = math.isfinite(submitted) and abs(submitted - gold.value) <= tol
        if not value_ok:
            notes.append("the value is wrong (check the figures, unit, scale and sign)")
    program_ok, grounded = False, False
    factor = 1.0
    binding: _Binding | None = None
    result = math.nan
    try:
        program = fp.parse(answer.program)
        binding = _Binding(program, doc)
        if binding.invented:
            raise fp.ProgramError(
                "operands not in the document: " + ", ".join(binding.invented[:5])
            )
        if not binding.uses_document:
            raise fp.ProgramError("the program uses no number from the document")
        result = fp.run(program, _resolver(binding, doc, doc), _rows(doc))[-1]
        if math.isfinite(submitted):
            for f in _factors(gold.kind):
                if abs(result * f - submitted) <= tol:
                    program_ok, factor = True, f
                    break
        if not program_ok:
            notes.append(f"the program gives {result:.6g}, not the submitted value")
    except fp.ProgramError as exc:
        notes.append(f"program: {exc}")
    correct = value_ok and program_ok
    if correct and binding is not None:
        if variant is None:
            grounded = True
        else:
            numbers, expected = variant
            try:
                again = fp.run(
                    fp.parse(answer.program), _resolver(binding, doc, numbers), _rows(numbers)
                )[-1]
                grounded = abs(again * factor - expected) <= tol
            except (fp.ProgramError, KeyError):
                grounded = False
            if not grounded:
                notes.append(
                    "the program does not reproduce the answer on a regenerated document with "
                    "other numbers (memorised constants or the wrong cells)"
                )
    reward = (1.0 - GROUNDED_BONUS) * correct + GROUNDED_BONUS * (correct and grounded)
    feedback = "correct" + (" and grounded" if grounded else "") if correct else "; ".join(notes)
    if correct and not grounded:
        feedback += "; " + "; ".join(notes)
    return Grade(
        reward=round(reward, 6),
        passed=correct,
        components={
            "value": float(value_ok),
            "program": float(program_ok),
            "grounded": float(grounded),
        },
        feedback=feedback,
    )
