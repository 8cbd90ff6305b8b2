"""FinQA-style programs: parse and run `subtract(5829, 5735), divide(#0, 5735)`.

The language is FinQA's (Chen et al., 2021): a comma-separated list of steps, each an
operation on two arguments; `#k` is the result of step k; `const_100`, `const_1000`,
`const_m1` (−1) … are constants; the table operations take a row label and `none`
(FinQA's form) or, here, any number of numbers. A program that is a single number is a
lookup. Numbers are written without thousands separators; `12.5%` means 0.125.

Parsing and running never raise anything but `ProgramError`, whose message says which step
is wrong and how to fix it: the agent sees it as an observation and the episode goes on.
How a number literal turns into a value is the caller's (`resolve`), so the verifier can
re-run the same program with the numbers of a regenerated document.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

BINARY = ("add", "subtract", "multiply", "divide", "exp", "greater")
TABLE = ("table_sum", "table_average", "table_max", "table_min")
OPERATIONS = BINARY + TABLE
MAX_STEPS = 32
MAX_CHARS = 4000
# FinQA's constants and a few more counts; const_m1 is −1.
CONSTANTS: dict[str, float] = {
    **{f"const_{n}": float(n) for n in range(0, 13)},
    **{f"const_{n}": float(n) for n in (100, 1000, 10000, 100000, 1000000, 1000000000)},
    "const_m1": -1.0,
}
_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(%?)$")
_STEP_RE = re.compile(r"^([a-z_]+)\s*\((.*)\)$", re.S)


class ProgramError(ValueError):
    """A program that cannot be parsed or run; the message says what to fix."""


@dataclass(frozen=True)
class Literal:
    """A number written in the program: `text` as written, `value` its signed value."""

    text: str
    value: float
    percent: bool

    @property
    def magnitude(self) -> float:
        """The number as the document would show it (no sign, no percent scaling)."""
        number = abs(self.value)
        return number * 100 if self.percent else number


@dataclass(frozen=True)
class Arg:
    kind: str  # "num", "ref", "const", "none", "row"
    text: str
    literal: Literal | None = None
    ref: int = -1


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Program:
    steps: tuple[Step, ...]
    text: str

    @property
    def literals(self) -> list[Literal]:
        return [a.literal for s in self.steps for a in s.args if a.literal is not None]

    @property
    def rows(self) -> list[str]:
        return [a.text for s in self.steps for a in s.args if a.kind == "row"]


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ProgramError("unbalanced ')': every step is op(arg, arg)")
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ProgramError("unbalanced '(': every step is op(arg, arg)")
    parts.append("".join(current).strip())
    return parts


def _literal(text: str) -> Literal | None:
    match = _NUMBER_RE.match(text.replace(" ", ""))
    if not match:
        return None
    percent = match.group(3) == "%"
    value = float(text.replace(" ", "").rstrip("%"))
    return Literal(text=text, value=value / 100 if percent else value, percent=percent)


def _arg(text: str, index: int, op: str) -> Arg:
    raw = text.strip()
    low = raw.lower()
    if not raw:
        raise ProgramError(f"step {index} ({op}): an empty argument")
    if low.startswith("#"):
        try:
            ref = int(low[1:])
        except ValueError:
            raise ProgramError(
                f"step {index} ({op}): {raw!r} is not a step reference like #0"
            ) from None
        if not 0 <= ref < index:
            raise ProgramError(
                f"step {index} ({op}): {raw} refers to a step that has not run yet; "
                f"#k may name steps 0..{index - 1}"
            )
        return Arg("ref", raw, ref=ref)
    if low.startswith("const_"):
        if low not in CONSTANTS:
            known = ", ".join(sorted(CONSTANTS, key=lambda c: CONSTANTS[c]))
            raise ProgramError(f"step {index} ({op}): unknown constant {raw!r}; known: {known}")
        return Arg("const", low)
    if low == "none":
        return Arg("none", low)
    literal = _literal(raw.replace(",", ""))
    if literal is not None:
        return Arg("num", raw, literal=literal)
    if op in TABLE:
        return Arg("row", raw)
    raise ProgramError(
        f"step {index} ({op}): {raw!r} is not a number, #k or const_N; write numbers "
        "without thousands separators or currency signs (5829, -12.5, 3.4%)"
    )


def parse(text: str) -> Program:
    """Parse a program; raises ProgramError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ProgramError("the program is empty; write e.g. 'subtract(5829, 5735)'")
    if len(text) > MAX_CHARS:
        raise ProgramError(f"the program is longer than {MAX_CHARS} characters")
    source = text.strip()
    whole = _literal(source.replace(" ", ""))
    if whole is not None:  # a lookup: the program is one number
        return Program((Step("lookup", (Arg("num", source, literal=whole),)),), source)
    steps: list[Step] = []
    for index, part in enumerate(_split_top(source)):
        if len(steps) >= MAX_STEPS:
            raise ProgramError(f"more than {MAX_STEPS} steps")
        match = _STEP_RE.match(part)
        if not match:
            raise ProgramError(
                f"step {index}: {part[:60]!r} is not of the form op(arg, arg); "
                f"operations: {', '.join(OPERATIONS)}"
            )
        op = match.group(1)
        if op not in OPERATIONS:
            raise ProgramError(
                f"step {index}: unknown operation {op!r}; use one of {', '.join(OPERATIONS)}"
            )
        if "(" in match.group(2):
            raise ProgramError(
                f"step {index} ({op}): nested calls are not allowed; put the inner call in "
                "its own step and refer to it as #k"
            )
        args = tuple(_arg(a, index, op) for a in _split_top(match.group(2)))
        if op in BINARY and len(args) != 2:
            raise ProgramError(f"step {index}: {op} takes 2 arguments, got {len(args)}")
        if op in BINARY and any(a.kind in ("none", "row") for a in args):
            raise ProgramError(f"step {index}: {op} takes numbers, #k or const_N")
        if op in TABLE:
            rows = [a for a in args if a.kind == "row"]
            if rows and (len(args) != 2 or args[0].kind != "row" or args[1].kind != "none"):
                raise ProgramError(
                    f"step {index}: {op} takes a row label and none ({op}(revenue, none)) or "
                    "a list of numbers"
                )
            if not rows and not any(a.kind in ("num", "ref", "const") for a in args):
                raise ProgramError(f"step {index}: {op} needs numbers or a row label")
        steps.append(Step(op, args))
    return Program(tuple(steps), source)


Resolve = Callable[[Literal], float]
RowValues = Callable[[str], Sequence[float]]


def _no_rows(label: str) -> Sequence[float]:
    raise ProgramError(f"no table row is labelled {label!r}")


def run(
    program: Program,
    resolve: Resolve | None = None,
    rows: RowValues | None = None,
) -> list[float]:
    """Every step's value; the answer is the last. Raises ProgramError (e.g. a zero divisor)."""
    values: list[float] = []
    number = resolve or (lambda lit: lit.value)
    row_values = rows or _no_rows

    def value(arg: Arg) -> float:
        if arg.kind == "ref":
            return values[arg.ref]
        if arg.kind == "const":
            return CONSTANTS[arg.text]
        assert arg.literal is not None
        return number(arg.literal)

    for index, step in enumerate(program.steps):
        op = step.op
        if op == "lookup":
            result = value(step.args[0])
        elif op in TABLE:
            if step.args[0].kind == "row":
                items = list(row_values(step.args[0].text))
            else:
                items = [value(a) for a in step.args if a.kind != "none"]
            if not items:
                raise ProgramError(f"step {index} ({op}): the row has no numbers")
            if op == "table_sum":
                result = math.fsum(items)
            elif op == "table_average":
                result = math.fsum(items) / len(items)
            elif op == "table_max":
                result = max(items)
            else:
                result = min(items)
        else:
            a, b = value(step.args[0]), value(step.args[1])
            if op == "add":
                result = a + b
            elif op == "subtract":
                result = a - b
            elif op == "multiply":
                result = a * b
            elif op == "divide":
                if b == 0:
                    raise ProgramError(f"step {index} (divide): division by zero")
                result = a / b
            elif op == "exp":
                try:
                    result = a**b
                except (OverflowError, ZeroDivisionError) as exc:
                    raise ProgramError(f"step {index} (exp): {exc}") from None
                if isinstance(result, complex):
                    raise ProgramError(
                        f"step {index} (exp): a negative base with a fractional power"
                    )
            else:  # greater
                result = 1.0 if a > b else 0.0
        if not math.isfinite(result):
            raise ProgramError(f"step {index} ({op}): the result is not a finite number")
        values.append(float(result))
    return values


def evaluate(text: str, resolve: Resolve | None = None, rows: RowValues | None = None) -> float:
    """Parse and run; the program's answer."""
    return run(parse(text), resolve, rows)[-1]
