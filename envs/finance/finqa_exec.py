"""FinQA's own execution of a gold program, reimplemented: what its `evaluate.py` computes.

FinQA's evaluator (github.com/czyssrs/FinQA, code/evaluate/evaluate.py, MIT) tokenises a
program on ", " into `op(`, arg, arg, `)` groups and runs each step: a number is read with
its separators dropped, `x%` as x/100, `const_N` as N and `const_m1` as −1; `#k` is step k's
result; `greater` gives "yes" or "no"; a table operation takes a row label (the first cell,
exactly as written; a later row with the same label wins) and reads every other cell of the
row with `$` dropped and everything from the first `(` cut. Any failure (an unknown
operation, a bad number, a zero divisor, arithmetic on "yes") makes the program invalid.
The result is rounded to 5 decimals; execution accuracy is equality with `exe_ans`.
The importer takes that result as the gold answer (`execute`), so its gold agrees with the
official evaluator by construction; scripts/finance_agreement.py measures it against theirs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

OPERATIONS = (
    "add", "subtract", "multiply", "divide", "exp", "greater",
    "table_max", "table_min", "table_sum", "table_average",
)  # fmt: skip
Result = float | str  # a number, or "yes" / "no"
_BINARY: dict[str, Callable[[float, float], float]] = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "divide": operator.truediv,
    "exp": operator.pow,
}
_TABLE: dict[str, Callable[[list[float]], float]] = {
    "table_max": max,
    "table_min": min,
    "table_sum": sum,
    "table_average": lambda row: sum(row) / len(row),
}


class InvalidProgram(ValueError):
    """FinQA's evaluator would call this program invalid; the message says why."""


def number(text: str) -> float | None:
    """A program argument or a cleaned cell as FinQA reads it (None: not a number)."""
    text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        pass
    if "%" in text:
        try:
            return float(text.replace("%", "")) / 100.0
        except ValueError:
            return None
    if "const" in text:
        body = text.replace("const_", "")
        try:
            return -1.0 if body == "m1" else float(body)
        except ValueError:
            return None
    return None


def cell_value(cell: str) -> float | None:
    """A table cell as FinQA's table operations read it: no `$`, nothing from `(` on."""
    return number(cell.replace("$", "").strip().split("(")[0].strip())


def steps(program: str) -> list[tuple[str, str, str]]:
    """(op, arg1, arg2) of each step, split as FinQA's tokeniser does."""
    out: list[tuple[str, str, str]] = []
    tokens: list[str] = []
    for piece in program.split(", "):
        current = ""
        for ch in piece:
            if ch == ")" and current:
                tokens.append(current)
                current = ""
            current += ch
            if ch in "()":
                tokens.append(current)
                current = ""
        if current:
            tokens.append(current)
    if not tokens or len(tokens) % 4:
        raise InvalidProgram(f"{program!r} is not a list of op(arg, arg) steps")
    for i in range(0, len(tokens), 4):
        op, a, b, close = tokens[i : i + 4]
        if op.strip("(") not in OPERATIONS or not op.endswith("(") or close != ")":
            raise InvalidProgram(f"step {i // 4}: {op}{a}, {b}{close} is not op(a, b)")
        out.append((op[:-1], a.strip(), b.strip()))
    return out


def _operand(arg: str, results: Sequence[Result], index: int) -> float:
    if "#" in arg:
        try:
            ref = int(arg.replace("#", ""))
            value = results[ref]
        except (ValueError, IndexError):
            raise InvalidProgram(f"step {index}: {arg!r} names no earlier step") from None
    else:
        parsed = number(arg)
        if parsed is None:
            raise InvalidProgram(f"step {index}: {arg!r} is not a number")
        value = parsed
    if isinstance(value, str):
        raise InvalidProgram(f"step {index}: arithmetic on the yes/no result {arg}")
    return value


def _row(label: str, table: Sequence[Sequence[str]], index: int) -> list[float]:
    rows = {str(r[0]): r[1:] for r in table if r}
    if label not in rows:
        raise InvalidProgram(f"step {index}: no table row is labelled {label!r}")
    values = [cell_value(str(c)) for c in rows[label]]
    if not values or any(v is None for v in values):
        raise InvalidProgram(f"step {index}: row {label!r} has a cell that is not a number")
    return [v for v in values if v is not None]


def execute(program: str, table: Sequence[Sequence[str]]) -> Result:
    """The program's result as FinQA's evaluator gives it (rounded to 5 decimals)."""
    results: list[Result] = []
    for index, (op, a, b) in enumerate(steps(program)):
        result: Result
        if op in _TABLE:
            result = _TABLE[op](_row(a, table, index))
        else:
            x, y = _operand(a, results, index), _operand(b, results, index)
            try:
                result = ("yes" if x > y else "no") if op == "greater" else _BINARY[op](x, y)
            except (ZeroDivisionError, OverflowError) as exc:
                raise InvalidProgram(f"step {index} ({op}): {exc}") from None
            if isinstance(result, complex):
                raise InvalidProgram(f"step {index} (exp): a complex result")
        results.append(result)
    last = results[-1]
    return last if isinstance(last, str) else round(last, 5)
