"""The puzzle's own rules, checked before partial credit is paid.

sudoku, mini_sudoku and futoshiki pay the share of cells that match the solution; a grid
filled with one digit, or with a cyclic pattern, keeps the givens and so earns 0.3-0.8
without solving anything. game_of_life pays the share of matching cells of the next board,
so a dead board earns most of a sparse one. A candidate that breaks the puzzle's rules is
not partly right: `breaks(dataset, answer, metadata)` says which rule it breaks, and the
family then pays 0 (a candidate that keeps every rule is a solution, and is paid what the
scorer says).

The grid is read as those scorers read it: every line with exactly n digits 1-9 (other
characters ignored) is the next row.

Some rules bind full credit too (`FULL`): puzzle24's scorer checks that the expression makes
24 from four numbers in range, not that they are the puzzle's numbers, so one expression
("5*5 + 4 - 5") scored 1.0 on every task; an expression must use exactly the puzzle's
numbers. time_intervals pays closeness (1 - diff / a day, or / a month), so one constant
duration earned 0.3 a task: a duration is exact or wrong. spell_backward pays the share of
letters in place, so another task's word earned 0.33: the word is exact or wrong. Scorers
that pay format credit for any answer of the right kind are exact or wrong too (issue 31,
invariant 4: a constant must not beat chance): calendar_arithmetic (0.1 for any weekday,
closeness for a count), figlet_font (0.1 a letter in place), color_cube_rotation (0.01 for
any other answer). polynomial_equations pays each root by closeness less a penalty per
missing or extra one, so "0.0, x" earned on every equation with the root 0: partial credit
needs every root (as many as the equation has, each within the tolerance of a distinct one).
"""

from __future__ import annotations

import math
import re
from typing import Any

from palaestra.envs.reasoning import guard

# Latin-square puzzles: rows and columns hold 1..n once each, the givens are kept.
BOX = {"sudoku": True, "mini_sudoku": True, "futoshiki": False}
# One right answer, closeness not paid: anything else is wrong (the reason says why).
ALL_OR_NOTHING = {
    "game_of_life": "not the board the rules give",
    "time_intervals": "not the exact duration",
    "spell_backward": "not the word spelled backward",
    "calendar_arithmetic": "not the exact day, count or answer",
    "figlet_font": "not the word the font draws",
    "color_cube_rotation": "not the colour of that side",
}
# Answers that list a polynomial's real roots (metadata key of the expected roots).
ROOTS = {"polynomial_equations": "real_solutions"}
# Expressions that must use exactly the puzzle's numbers (metadata "numbers"), however the
# scorer pays them.
GIVEN_NUMBERS = frozenset({"puzzle24"})
# Words judged as the scorer judges equality (spaces dropped, lower case) whatever it pays:
# figlet_font's 0.1 a letter in place reaches 1.0 for a wrong word of 10 letters or more.
SAME_WORD = frozenset({"figlet_font"})
# Datasets whose rules bind full credit as well as partial credit.
FULL = GIVEN_NUMBERS | SAME_WORD
CHECKED = frozenset(BOX) | frozenset(ALL_OR_NOTHING) | GIVEN_NUMBERS | frozenset(ROOTS)
INTEGER = re.compile(r"\b\d+\b")


def read_grid(answer: str, n: int) -> list[list[int]]:
    rows = []
    for line in answer.split("\n"):
        digits = [int(c) for c in line if c in "123456789"]
        if len(digits) == n:
            rows.append(digits)
        if len(rows) == n:
            break
    return rows


def _latin(grid: list[list[int]], n: int) -> str | None:
    want = list(range(1, n + 1))
    if any(sorted(row) != want for row in grid):
        return "a row does not hold each number once"
    if any(sorted(col) != want for col in zip(*grid, strict=True)):
        return "a column does not hold each number once"
    return None


def _boxes(grid: list[list[int]], n: int) -> str | None:
    side = math.isqrt(n)
    if side * side != n:
        return None
    want = list(range(1, n + 1))
    for r in range(0, n, side):
        for c in range(0, n, side):
            box = [grid[r + i][c + j] for i in range(side) for j in range(side)]
            if sorted(box) != want:
                return "a box does not hold each number once"
    return None


def _inequalities(grid: list[list[int]], constraints: list[Any]) -> str | None:
    for r1, c1, r2, c2, op in constraints:
        a, b = grid[r1][c1], grid[r2][c2]
        if (op == "<" and not a < b) or (op == ">" and not a > b):
            return "an inequality does not hold"
    return None


def _given_numbers(answer: str, metadata: dict[str, Any]) -> str | None:
    given = metadata.get("numbers")
    if not isinstance(given, list):
        return None
    used = sorted(int(n) for n in INTEGER.findall(answer))
    if used != sorted(int(n) for n in given):
        return "the expression does not use exactly the puzzle's numbers"
    return None


def _roots(answer: str, expected: Any) -> str | None:
    """Every root once, none else: as many values (read as the scorer reads them, comma-
    separated, the unreadable ignored) as the equation has roots, each within the guard's
    tolerance of its own root (sorted, the closest pairing on a line)."""
    if not isinstance(expected, list):
        return None
    got = []
    for piece in answer.split(","):
        try:
            got.append(float(piece.strip()))
        except ValueError:
            continue
    if len(got) != len(expected):
        return "not as many roots as the equation has"
    for value, root in zip(sorted(got), sorted(float(r) for r in expected), strict=True):
        if not abs(value - root) <= guard.NUMBER_REL_TOL * max(1.0, abs(root)):
            return "a root that is not one of the equation's"
    return None


def _word(text: str) -> str:
    return text.replace(" ", "").strip().lower()  # as figlet_font's scorer compares


def breaks(dataset: str, answer: str, metadata: dict[str, Any], expected: str = "") -> str | None:
    """Which of the puzzle's rules `answer` breaks, or None (also for datasets not checked)."""
    if dataset in SAME_WORD and _word(answer) == _word(expected):
        return None
    if dataset in ALL_OR_NOTHING:
        return ALL_OR_NOTHING[dataset]
    if dataset in GIVEN_NUMBERS:
        return _given_numbers(answer, metadata)
    if dataset in ROOTS:
        return _roots(answer, metadata.get(ROOTS[dataset]))
    if dataset not in BOX:
        return None
    puzzle = metadata.get("puzzle")
    if not isinstance(puzzle, list) or not puzzle:
        return None
    n = len(puzzle)
    grid = read_grid(answer, n)
    if len(grid) != n:
        return f"not a {n}x{n} grid"
    for r in range(n):
        for c in range(n):
            if puzzle[r][c] and grid[r][c] != puzzle[r][c]:
                return "a given number was changed"
    broken = _latin(grid, n)
    if broken is None and BOX[dataset]:
        broken = _boxes(grid, n)
    if broken is None and dataset == "futoshiki":
        broken = _inequalities(grid, metadata.get("constraints") or [])
    return broken
