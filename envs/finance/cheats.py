"""Programs that hit the right value without computing it from the question's quantities.

Each is a FinQA program that parses, runs, uses at least one number printed in the document
and no number that is not, and gives the gold value: what a policy finds once it learns that
the value is checked and the program only for being well-formed. The verifier must pay them
nothing for the program (`verifiers.finance`: re-run on a regenerated document, or with the
document's numbers perturbed, against the gold program).
"""

from __future__ import annotations

import math
from typing import Any

from palaestra.envs.finance.imported import imported_numbers
from palaestra.verifiers import finance as vf
from palaestra.verifiers import finance_program as fp
from palaestra.verifiers import finance_text as ft


def constant_expression(value: float, decimals: int, first_step: int) -> list[str]:
    """Steps that build `value` (rounded to `decimals`) from digit constants only: Horner's
    rule over its decimal digits, then a division by a power of ten and the sign."""
    digits = str(round(abs(value) * 10**decimals))
    steps = [f"add(const_{digits[0]}, const_0)"]
    for d in digits[1:]:
        k = first_step + len(steps) - 1
        steps.append(f"multiply(#{k}, const_10)")
        steps.append(f"add(#{k + 1}, const_{d})")
    for _ in range(decimals):
        k = first_step + len(steps) - 1
        steps.append(f"divide(#{k}, const_10)")
    if value < 0:
        steps.append(f"multiply(#{first_step + len(steps) - 1}, const_m1)")
    return steps


def _printed(figure: float) -> str:
    return f"{abs(figure):.10g}"


def constant_program(gold: vf.Gold, figure: float) -> str:
    """One printed figure times zero, plus the value built from constants."""
    asked = gold.asked_value
    steps = [f"multiply({_printed(figure)}, const_0)"]
    steps += constant_expression(asked, gold.decimals + 1, 1)
    steps.append(f"add(#0, #{len(steps) - 1})")
    return ", ".join(steps)


def figure_plus_constants(gold: vf.Gold, figure: float) -> str:
    """An unrelated printed figure, corrected to the value with constants."""
    asked = gold.asked_value
    steps = constant_expression(asked - abs(figure), gold.decimals + 1, 0)
    steps.append(f"add({_printed(figure)}, #{len(steps) - 1})")
    return ", ".join(steps)


def zeroed_gold_operands(gold: vf.Gold) -> str | None:
    """Every operand of the gold program, each times zero, plus the value from constants:
    uses exactly the question's cells and none of them matters."""
    try:
        literals = fp.parse(gold.program).literals
    except fp.ProgramError:
        return None
    if not literals:
        return None
    steps = [f"multiply({lit.text}, const_0)" for lit in literals]
    for _ in literals[1:]:
        steps.append(f"add(#{len(steps) - 1}, #{len(steps) - len(literals)})")
    total = len(steps) - 1
    steps += constant_expression(gold.asked_value, gold.decimals + 1, len(steps))
    steps.append(f"add(#{total}, #{len(steps) - 1})")
    return ", ".join(steps)


def unrelated_figure(gold: vf.Gold, numbers: vf.Numbers) -> float | None:
    """A printed figure the gold program does not use (the largest, for a visible misuse)."""
    try:
        used = {round(lit.magnitude, 6) for lit in fp.parse(gold.program).literals}
    except fp.ProgramError:
        used = set()
    others = [abs(v) for v in numbers.figures.values() if round(abs(v), 6) not in used and v != 0]
    return max(others) if others else None


def program_cheats(gold: vf.Gold, numbers: vf.Numbers) -> list[tuple[str, dict[str, Any]]]:
    """(name, submit arguments) of each program cheat that applies to this question."""
    if not math.isfinite(gold.asked_value):
        return []
    answer = {"value": gold.asked_value, "unit": gold.unit, "scale": gold.scale}
    out: list[tuple[str, dict[str, Any]]] = []
    figure = unrelated_figure(gold, numbers)
    if figure is not None:
        out.append(("constants-only", {**answer, "program": constant_program(gold, figure)}))
        out.append(
            ("figure-plus-constants", {**answer, "program": figure_plus_constants(gold, figure)})
        )
    zeroed = zeroed_gold_operands(gold)
    if zeroed is not None:
        out.append(("zeroed-operands", {**answer, "program": zeroed}))
    return [(n, a) for n, a in out if len(a["program"]) <= fp.MAX_CHARS]


def yes_no_cheats(gold: vf.Gold, numbers: vf.Numbers) -> list[tuple[str, dict[str, Any]]]:
    """A yes/no guess dressed as a comparison that is always true (or always false): the right
    answer from a program that does not compare the question's quantities."""
    if not gold.yes_no or not numbers.figures:
        return []
    figure = _printed(max(abs(v) for v in numbers.figures.values()))
    sides = (figure, "const_m1") if gold.value == 1 else ("const_m1", figure)
    program = f"greater({sides[0]}, {sides[1]})"
    return [("yes-no-guess", {"value": gold.value, "unit": "ratio", "program": program})]


def text_cheats(
    gold: dict[str, Any], table: list[list[str]], pre_text: list[str], post_text: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """Text answers that overlap the gold without being it: the passage that contains it,
    every row label, every number printed, the count alone, and the answer in another scale."""
    answers = [str(a) for a in gold["answers"]]
    scale = str(gold["scale"])
    out: list[tuple[str, dict[str, Any]]] = []
    passages = pre_text + post_text + [" ".join(row) for row in table]
    first = answers[0].strip().lower()
    around = next(
        (p for p in passages if first and first in p.lower() and p.strip() != first), None
    )
    if around is not None:
        out.append(("whole-passage", {"answers": [around[:2000]], "scale": scale}))
    labels = [row[0] for row in table if row and row[0].strip()]
    if len(labels) > len(answers):
        out.append(("every-row-label", {"answers": labels[:50], "scale": scale}))
    printed = [f"{v:g}" for v in list(numbers_of(table, pre_text, post_text))[:50]]
    if printed:
        out.append(("many-numbers", {"answers": printed, "scale": scale}))
    if gold.get("answer_type") == "count":
        out.append(("count-alone", {"answers": [str(len(answers))], "scale": scale}))
    other = "thousand" if scale != "thousand" else "million"
    out.append(("wrong-scale", {"answers": answers, "scale": other}))
    # one that happens to be the answer itself (a passage that is the span) is no cheat
    return [(n, a) for n, a in out if not ft.score(a["answers"], a["scale"], answers, scale).exact]


def numbers_of(table: list[list[str]], pre_text: list[str], post_text: list[str]) -> list[float]:
    return list(imported_numbers(table, pre_text, post_text).figures.values())
