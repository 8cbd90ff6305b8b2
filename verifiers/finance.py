"""Checked numbers and checked logic for financial-document questions.

An answer is `{value, unit, scale, program}`. It earns reward only if both hold:

1. **The number is right.** `value × scale` in the declared `unit` is turned into the
   question's canonical quantity (base currency units, a plain ratio, currency per share,
   a count): `percent` divides by 100, `fraction` and `ratio` do not, so a fraction given
   for a percentage is right only when its unit says so. Where the question states the unit
   (generated reports) a unit of another dimension is wrong; where it does not (imported
   FinQA/TAT-QA questions, `Gold.unit_stated`) every unit but `percent` is the number itself,
   so an amount declared `currency` or `ratio` is judged on its value. It is right when it
   rounds, at the decimals asked in the unit and scale asked, to what the gold rounds to
   (FinQA: 5 decimals, TAT-QA: 2; on an exact tie either neighbour), as the benchmarks
   compare; the only slack is float noise, `FLOAT_REL` of the value, so above 10^6 a value
   a few units off is still wrong. Signs count: a decrease or an outflow is negative. A
   yes/no answer is exactly 1 or 0.
2. **The program is valid.** The FinQA-style program parses, runs (no zero divisor), uses
   only numbers that appear in the document (plus `const_N` constants and the years shown)
   and at least one of them, and its result, up to a unit or scale factor (a program may
   yield a fraction for a percent, or thousands for millions), rounds to the gold as the
   value must: FinQA judges a program by its rounded result, whatever its unrounded one.

The program must also compute the answer **from the question's quantities**: on a generated
document it is re-run with the same cells' values in a regenerated document (same layout,
other numbers) and must give that document's gold answer; on an imported document (FinQA,
TAT-QA), which cannot be regenerated, the document's numbers are perturbed (each printed
figure times its own factor) and the program must agree with the gold program on them. A
program that reaches the value from constants, from an unrelated printed figure, or from the
right cells times zero fails that check. Constants are FinQA's small set (`BASE_CONSTANTS`:
1, 2, −1 and the powers of ten) plus the counts the question states ("3-year" → const_3)
and those of the gold program.

reward = 1.0 when the value and the program are right; `VALUE_ONLY_REWARD` (0.05) when only
the value is: a value alone can be memorised, guessed or copied, so it must pay less than
the cheat floor (0.1), but a right number with a sloppy program is a near miss worth a
little signal. Otherwise 0.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from palaestra.verifiers import finance_program as fp

VERSION = "2.1.0"
VALUE_ONLY_REWARD = 0.05
# FinQA's small constant set: 1 (a change is a ratio minus one), 2 (an average of two years),
# -1, and the powers of ten (percentages and scales). Other counts only where the question
# states them.
BASE_CONSTANTS = frozenset(
    {"const_1", "const_2", "const_m1"} | {f"const_{10**k}" for k in (1, 2, 3, 4, 5, 6, 9)}
)
NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
PERTURB_SALTS = ("a", "b")
PERTURB_REL_TOL = 1e-6
# Float noise: an equivalent program (another order of operations) lands within this share of
# the value; a wrong value, at any size, lands far outside it (1,234,567 for 1,234,000 is
# 5e-4 off).
FLOAT_REL = 1e-12

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
    # Whether the instruction states the unit (generated questions: "Answer in percent");
    # imported FinQA/TAT-QA questions do not, so the unit's dimension is not checked there.
    unit_stated: bool = True

    @property
    def unit(self) -> str:
        return KIND_UNIT[self.kind]

    @functools.cached_property
    def yes_no(self) -> bool:
        """A yes/no question (FinQA's `greater`): 1 is yes, 0 is no."""
        try:
            return fp.parse(self.program).steps[-1].op == "greater"
        except fp.ProgramError:
            return False

    @property
    def asked_value(self) -> float:
        """The gold value in the unit and scale the question asks for."""
        return to_unit(self.value, self.unit, self.scale)

    def tolerance(self) -> float:
        """Half a unit of the last decimal asked, in canonical terms."""
        step = 0.5 * 10.0 ** (-self.decimals) * SCALES[self.scale]
        if self.unit == "percent":
            step /= 100
        return step * (1 + 1e-9) + FLOAT_REL * max(1.0, abs(self.value))

    def matches(self, value: float) -> bool:
        """Whether a canonical value is the gold at the benchmark's rounding: both round, at
        the decimals asked in the unit and scale asked, to the same number (FinQA's
        `round(x, 5)` equality, TAT-QA's 2 decimals); on a tie (12.35 to one decimal) either
        neighbour is the gold's rounding. Slack: float noise only (`FLOAT_REL`)."""
        if not math.isfinite(value):
            return False
        if self.yes_no:
            return abs(value - self.value) <= FLOAT_REL
        step = 10.0 ** (-self.decimals)
        gold, got = self.asked_value / step, to_unit(value, self.unit, self.scale) / step
        noise = FLOAT_REL * max(1.0, abs(self.asked_value)) / step
        low, high = math.ceil(gold - 0.5 - noise), math.floor(gold + 0.5 + noise)
        return low - 0.5 - noise <= got <= high + 0.5 + noise

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "value": self.value,
            "decimals": self.decimals,
            "scale": self.scale,
            "program": self.program,
            "keys_program": self.keys_program,
            "factor": self.factor,
            **({} if self.unit_stated else {"unit_stated": False}),
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
            unit_stated=bool(data.get("unit_stated", True)),
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


def measures(unit: str, gold: Gold) -> bool:
    """Whether an answer in `unit` can measure the gold: a unit of its dimension; where the
    instruction does not state the unit, also any unit but `percent` (the number itself) for
    a gold that is not a percentage, so an amount declared `currency` is judged on its value."""
    if UNIT_DIM[unit] == KIND_DIM[gold.kind]:
        return True
    return not gold.unit_stated and unit != "percent" and gold.kind != "percent"


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


def allowed_constants(question: str, gold: Gold) -> frozenset[str]:
    """FinQA's small set, the counts the question states, and the gold program's own."""
    stated = {int(n) for n in re.findall(r"(?<![\d.])(\d{1,2})(?![\d.])", question)}
    words = re.findall(r"[a-z]+", question.lower())
    stated |= {NUMBER_WORDS[w] for w in words if w in NUMBER_WORDS}
    out = set(BASE_CONSTANTS) | {f"const_{n}" for n in stated}
    with contextlib.suppress(fp.ProgramError):
        out |= constants_of(fp.parse(gold.program))
    return frozenset(out)


def constants_of(program: fp.Program) -> set[str]:
    return {a.text for s in program.steps for a in s.args if a.kind == "const"}


def perturbed(doc: Numbers, salt: str) -> Numbers:
    """The document's figures, each times its own factor in [1.1, 1.9) (sign kept): a
    stand-in for a regenerated document where none can be made."""

    def factor(key: str) -> float:
        digest = hashlib.sha256(f"{salt}/{key}".encode()).digest()
        return 1.1 + 0.8 * int.from_bytes(digest[:4], "big") / 2**32

    figures = {k: v * factor(k) for k, v in doc.figures.items()}
    return Numbers(figures=figures, labels=doc.labels, rows=doc.rows)


def _sides(program: fp.Program, resolve: fp.Resolve, rows: fp.RowValues) -> list[float]:
    """The two sides a program's final `greater` compares (its yes/no is their order)."""
    values = fp.run(program, resolve, rows)

    def value(arg: fp.Arg) -> float:
        if arg.kind == "ref":
            return values[arg.ref]
        if arg.kind == "const":
            return fp.CONSTANTS[arg.text]
        assert arg.literal is not None
        return resolve(arg.literal)

    return [value(a) for a in program.steps[-1].args]


def _same_comparison(program: fp.Program, gold: Gold, doc: Numbers) -> bool:
    """A yes/no answer: the program's final `greater` compares what the gold's does (both
    sides agree on perturbed documents), so a comparison that is always true does not pass."""
    try:
        gold_program = fp.parse(gold.program)
        if program.steps[-1].op != "greater":
            return False
        gold_binding, binding = _Binding(gold_program, doc), _Binding(program, doc)
        for salt in PERTURB_SALTS:
            target = perturbed(doc, salt)
            want = _sides(gold_program, _resolver(gold_binding, doc, target), _rows(target))
            got = _sides(program, _resolver(binding, doc, target), _rows(target))
            pairs = zip(got, want, strict=True)
            if not all(math.isclose(g, w, rel_tol=PERTURB_REL_TOL) for g, w in pairs):
                return False
    except (fp.ProgramError, KeyError):
        return False
    return True


def _same_function(program: fp.Program, factor: float, gold: Gold, doc: Numbers) -> bool:
    """Whether `program` agrees with the gold program on perturbed copies of `doc`."""
    if gold.yes_no:
        return _same_comparison(program, gold, doc)
    try:
        gold_program = fp.parse(gold.program)
        gold_binding = _Binding(gold_program, doc)
        binding = _Binding(program, doc)
        # The factor that turns the gold program's result into the canonical gold (a percent
        # program gives 12.5 for 0.125), found as the candidate's is.
        shown = fp.run(gold_program, _resolver(gold_binding, doc, doc), _rows(doc))[-1]
        gold_factor = next((f for f in _factors(gold.kind) if gold.matches(shown * f)), gold.factor)
        for salt in PERTURB_SALTS:
            target = perturbed(doc, salt)
            want = fp.run(gold_program, _resolver(gold_binding, doc, target), _rows(target))[-1]
            got = fp.run(program, _resolver(binding, doc, target), _rows(target))[-1]
            want *= gold_factor
            got *= factor
            if not math.isclose(got, want, rel_tol=PERTURB_REL_TOL, abs_tol=1e-12):
                return False
    except (fp.ProgramError, KeyError):
        return False
    return True


def grade(
    answer: Answer,
    gold: Gold,
    doc: Numbers,
    variant: tuple[Numbers, float] | None = None,
    question: str = "",
) -> Grade:
    """Score one answer (see the module docstring). `variant`: (numbers, canonical gold) of a
    regenerated document, or None where the document cannot be regenerated."""
    notes: list[str] = []
    value_ok = False
    if not measures(answer.unit, gold):
        notes.append(f"unit {answer.unit!r} does not measure what was asked ({gold.unit})")
    else:
        value_ok = gold.matches(canonical(answer.value, answer.unit, answer.scale))
        if not value_ok:
            notes.append("the value is wrong (check the figures, unit, scale, sign and rounding)")
    runs, grounded = False, False
    factor = 1.0
    try:
        program = fp.parse(answer.program)
        binding = _Binding(program, doc)
        if binding.invented:
            raise fp.ProgramError(
                "operands not in the document: " + ", ".join(binding.invented[:5])
            )
        if not binding.uses_document:
            raise fp.ProgramError("the program uses no number from the document")
        foreign = sorted(constants_of(program) - allowed_constants(question, gold))
        if foreign:
            raise fp.ProgramError(
                "constants outside FinQA's small set and the counts the question states: "
                + ", ".join(foreign[:5])
            )
        result = fp.run(program, _resolver(binding, doc, doc), _rows(doc))[-1]
        for f in _factors(gold.kind):
            if gold.matches(result * f):
                runs, factor = True, f
                break
        if not runs:
            notes.append(f"the program gives {result:.6g}, not the answer")
        elif variant is not None:
            numbers, expected = variant
            try:
                again = fp.run(program, _resolver(binding, doc, numbers), _rows(numbers))[-1]
                grounded = abs(again * factor - expected) <= gold.tolerance()
            except (fp.ProgramError, KeyError):
                grounded = False
        else:
            grounded = _same_function(program, factor, gold, doc)
        if runs and not grounded:
            notes.append(
                "the program does not compute the answer from the question's quantities: "
                "with other numbers in the document it no longer gives the right answer "
                "(constants, an unrelated figure or the wrong cells)"
            )
    except fp.ProgramError as exc:
        notes.append(f"program: {exc}")
    program_ok = runs and grounded
    correct = value_ok and program_ok
    reward = 1.0 if correct else (VALUE_ONLY_REWARD if value_ok else 0.0)
    feedback = "correct" if correct else "; ".join(notes)
    if value_ok and not program_ok:
        feedback = "the value is right but the program is not; " + feedback
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
