"""TAT-QA's infix `derivation` strings as FinQA-style programs.

A derivation is arithmetic as an annotator wrote it: `(5,829 - 5,735) / 5,735 * 100%`,
`[(166+178)/2] - [(57+44)/2]`, `-114 - (71)`, `$2.2/15%`, `60.3 million + 32,137 thousand`.
Numbers carry thousands separators, a currency sign, a trailing `%` or a scale word;
brackets are parentheses; a minus may be unary. Two readings are ambiguous and the
annotator's answer decides between them (the importer tries each, `readings`):

- `(71)`: an accounting negative (−71), or a number in grouping parentheses (71);
- `15%`: the fraction 0.15, or a percent figure written with its unit (15).

A program's steps are FinQA's binary operations; a negated sub-expression is multiplied
by `const_m1`, a scale word by `const_1000` etc., and a factor 100 (a conversion to percent,
not a figure) is `const_100` (`100%` is `const_1`). Numbers are written as printed (no
separators) so the verifier binds each to its figure in the document.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d[\d,]*(?:\.\d+)?|\.\d+)(?P<pct>\s*%)?(?:\s*(?P<word>thousand|million|billion)\b)?"
    r"|(?P<op>[-+*/()\[\]]))"
)
_OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
_UNIT_CONVERSION = {"100": "const_100", "100%": "const_1"}
_SCALE_WORDS = {"thousand": "const_1000", "million": "const_1000000", "billion": "const_1000000000"}


class DerivationError(ValueError):
    """A derivation that is not arithmetic this parser reads; the message says what."""


@dataclass(frozen=True)
class Reading:
    """How the two ambiguous forms are read."""

    accounting_negative: bool  # (71) is −71
    percent_fraction: bool  # 15% is 0.15


def readings(derivation: str) -> list[Reading]:
    """The readings worth trying: only the ambiguities the derivation has."""
    has_paren_number = bool(re.search(r"\(\s*\$?\s*\d[\d,]*(\.\d+)?\s*\)", derivation))
    has_percent = "%" in derivation
    out = []
    for neg, frac in itertools.product((False, True), (True, False)):
        if (neg and not has_paren_number) or (not frac and not has_percent):
            continue
        out.append(Reading(neg, frac))
    return out


def _tokens(text: str) -> list[tuple[str, str, bool, str]]:
    """(kind, text, percent, scale word) tokens; kind is 'num' or the operator."""
    out: list[tuple[str, str, bool, str]] = []
    pos = 0
    text = text.replace("$", "").rstrip()  # a currency sign is not arithmetic
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise DerivationError(f"derivation {text!r}: cannot read {text[pos : pos + 12]!r}")
        pos = match.end()
        if match.group("num"):
            number = match.group("num").replace(",", "")
            out.append(("num", number, bool(match.group("pct")), match.group("word") or ""))
        else:
            op = match.group("op")
            out.append(({"[": "(", "]": ")"}.get(op, op), "", False, ""))
    if not out:
        raise DerivationError("the derivation is empty")
    return out


class _Parser:
    def __init__(self, text: str, reading: Reading) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.reading = reading
        self.steps: list[str] = []
        self.text = text

    def peek(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def emit(self, op: str, a: str, b: str) -> str:
        if op in ("multiply", "divide"):  # `* 100` converts to percent: not a figure
            a, b = (_UNIT_CONVERSION.get(x, x) for x in (a, b))
        self.steps.append(f"{op}({a}, {b})")
        return f"#{len(self.steps) - 1}"

    def binary(self, ops: str, operand: Callable[[], str]) -> str:
        """Operands joined left to right by operators of one precedence."""
        left = operand()
        while (op := self.peek()) is not None and op in ops:
            self.pos += 1
            left = self.emit(_OPS[op], left, operand())
        return left

    def expression(self) -> str:
        return self.binary("+-", self.term)

    def term(self) -> str:
        return self.binary("*/", self.unary)

    def unary(self) -> str:
        if self.peek() == "-":
            self.pos += 1
            return self.negate(self.unary())
        if self.peek() == "+":
            self.pos += 1
            return self.unary()
        return self.atom()

    def negate(self, operand: str) -> str:
        if operand.startswith("#") or operand.startswith("const_"):
            return self.emit("multiply", operand, "const_m1")
        return operand[1:] if operand.startswith("-") else f"-{operand}"

    def atom(self) -> str:
        kind = self.peek()
        if kind == "num":
            _, number, percent, word = self.tokens[self.pos]
            self.pos += 1
            literal = f"{number}%" if percent and self.reading.percent_fraction else number
            return self.emit("multiply", literal, _SCALE_WORDS[word]) if word else literal
        if kind == "(":
            self.pos += 1
            lone_number = (
                self.pos + 1 < len(self.tokens)
                and self.tokens[self.pos][0] == "num"
                and self.tokens[self.pos + 1][0] == ")"
            )
            inner = self.expression()
            if self.peek() != ")":
                raise DerivationError(f"derivation {self.text!r}: a '(' is not closed")
            self.pos += 1
            if lone_number and self.reading.accounting_negative:
                return self.negate(inner)
            return inner
        raise DerivationError(f"derivation {self.text!r}: expected a number or '('")


def to_program(derivation: str, reading: Reading) -> str:
    """The derivation as a FinQA-style program under one reading."""
    parser = _Parser(derivation, reading)
    last = parser.expression()
    if parser.pos != len(parser.tokens):
        raise DerivationError(f"derivation {derivation!r}: unexpected {parser.peek()!r}")
    return ", ".join(parser.steps) if parser.steps else last


def programs(derivation: str) -> Iterator[tuple[Reading, str]]:
    """Each reading's program (the first that reproduces the answer is the gold)."""
    for reading in readings(derivation):
        yield reading, to_program(derivation, reading)
