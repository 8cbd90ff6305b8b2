"""Degenerate answers, and the guard that pays nothing for them.

reasoning-gym's scorers are written for honest answers; several pay partial credit for
answers that carry no work: a fixed label, a piece of the expected word, the input grid or
list sent back, a number one off the answer, or the question itself. RL finds those within
a run. `degenerate_answers(question, answer)` is one set of such answers for any task (the
family plays it as cheats); `is_degenerate(answer, question, expected)` recognises the same
kinds in any submitted answer, and `score_task` scores those 0 unless reasoning-gym's scorer
calls them fully correct *and* they are not an echo of the question.
"""

from __future__ import annotations

import math
import re

from palaestra.envs.reasoning import canon

# Answers a policy can give without reading the question.
LABELS = ("0", "1", "-1", "2", "yes", "no", "True", "False", "A", "B", "C", "D", "None", "[]", "")
CONNECTIVES = frozenset({"and", "or"})  # "yes and no" holds two labels
NUMBER_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
MIN_ECHO = 12  # characters of the question an answer must repeat to be an echo
NUMBER_REL_TOL = 1e-3  # two numbers closer than this (relative) are the same answer
# Scorers that pay for anything of the right type: their answer must be the label itself.
# game_of_life_halting: `bool(answer) == bool(entry["answer"])` is True for every non-empty
# string, so "no" scores 1.0 where the answer is "False".
EXACT_LABEL = frozenset({"game_of_life_halting"})
# Scorers that read only some characters of the answer: it must hold nothing else.
# sokoban plays every character as a move and ignores the rest, so the question sent back
# (which spells the moves) can solve the puzzle.
ALPHABET = {"sokoban": re.compile(r"^[UDLR]+$")}


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _number(text: str) -> float | None:
    text = text.strip()
    if not NUMBER_RE.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def _format_like(value: float, like: str) -> str:
    if "." not in like and "e" not in like.lower() and value == int(value):
        return str(int(value))
    decimals = len(like.split(".", 1)[1]) if "." in like else 0
    return f"{value:.{decimals}f}"


def grid_blocks(question: str) -> list[str]:
    """Blocks of two or more consecutive lines with the same number (≥ 2) of tokens: the
    grids, matrices and boards a question shows."""
    blocks: list[str] = []
    run: list[str] = []
    for line in [*question.splitlines(), ""]:
        tokens = line.split()
        if len(tokens) >= 2 and (not run or len(run[-1].split()) == len(tokens)):
            run.append(line.strip())
            continue
        if len(run) >= 2:
            blocks.append("\n".join(run))
        run = [line.strip()] if len(tokens) >= 2 else []
    return blocks


def bracketed_lists(question: str) -> list[str]:
    return re.findall(r"\[[^\[\]]{3,}\]", question)


def degenerate_answers(question: str, answer: str) -> list[tuple[str, str]]:
    """(name, answer) of every degenerate answer for a task, none equal to its answer."""
    out: list[tuple[str, str]] = [(f"label-{label or 'empty'}", label) for label in LABELS]
    answer = answer.strip()
    if len(answer) >= 2:
        out += [
            ("prefix", answer[:-1]),
            ("suffix", answer[1:]),
            ("half", answer[: len(answer) // 2]),
        ]
        words = answer.split()
        if len(words) > 1:
            out.append(("first-word", words[0]))
    value = _number(answer)
    if value is not None:
        out += [
            ("near-plus-1", _format_like(value + 1, answer)),
            ("near-minus-1", _format_like(value - 1, answer)),
            ("near-1pct", _format_like(value * 1.01 if value else 0.01, answer)),
        ]
    lines = [ln.strip() for ln in question.splitlines() if ln.strip()]
    out.append(("echo-question", question))
    if lines:
        out.append(("echo-last-line", lines[-1]))
    grids = grid_blocks(question)
    if grids:
        out.append(("echo-grid", grids[-1]))
    lists = bracketed_lists(question)
    if lists:
        out.append(("echo-list", lists[0]))
    seen: set[tuple[str, str]] = set()
    unique = []
    for name, text in out:
        if _norm(text) == _norm(answer) or (name, text) in seen:
            continue
        seen.add((name, text))
        unique.append((name, text))
    return unique


def is_echo(candidate: str, question: str, expected: str) -> bool:
    """The answer repeats a grid, a list or a long stretch of the question that the expected
    answer does not contain."""
    cand = _norm(candidate)
    if not cand:
        return False
    exp = _norm(expected)
    q = _norm(question)
    pieces = [_norm(g) for g in grid_blocks(question)] + [
        _norm(x) for x in bracketed_lists(question)
    ]
    for piece in pieces:
        if len(piece) >= 3 and piece in cand and piece not in exp:
            return True
    return len(cand) >= MIN_ECHO and cand in q and cand not in exp


def _only_labels(candidate: str) -> bool:
    """Fixed labels in any markup or punctuation, alone or several at once ("**A**",
    "True.", "A/B/C/D", "yes and no"), each at most once (a row of 0s and 1s is not one)."""
    words = [w for w in canon.fold(candidate).split() if w not in CONNECTIVES]
    labels = {canon.fold(label) for label in LABELS} - {""}
    return bool(words) and len(set(words)) == len(words) and set(words) <= labels


def is_degenerate(candidate: str, question: str, expected: str) -> str | None:
    """Which kind of degenerate answer `candidate` is for this task, or None."""
    cand, exp = _norm(candidate), _norm(expected)
    if cand == exp:
        return None
    if cand in {_norm(label) for label in LABELS} or _only_labels(candidate):
        return "a fixed label"
    if cand and cand in exp:
        return "a piece of the expected answer"
    if is_echo(candidate, question, expected):
        return "the question's input sent back"
    got, want = _number(candidate), _number(expected)
    if got is not None and want is not None and got != want:
        return "a number that is not the answer"
    return None


def guarded(
    dataset: str, score: float, candidate: str, question: str, expected: str
) -> tuple[float, str | None]:
    """reasoning-gym's `score` for `candidate`, or 0 with the reason when the guard refuses it.

    Full credit stands unless the answer is an echo of the question's input, a number that is
    not the answer (coin_flip's prefix rule pays 1.0 for "0" against 0.375), or fails the
    dataset's own guard above; partial credit stands unless the answer is degenerate."""
    if score <= 0.0 or _norm(candidate) == _norm(expected):
        return score, None
    if dataset in EXACT_LABEL:
        return 0.0, "the answer must be the label itself"
    pattern = ALPHABET.get(dataset)
    if pattern is not None and not pattern.match(re.sub(r"\s+", "", candidate)):
        return 0.0, "the answer holds characters the task does not use"
    if is_echo(candidate, question, expected):
        return 0.0, "the question's input sent back"
    got, want = _number(candidate), _number(expected)
    if (
        got is not None
        and want is not None
        and abs(got - want) > NUMBER_REL_TOL * max(1.0, abs(want))
    ):
        return 0.0, "a number that is not the answer"
    if score < 1.0:
        kind = is_degenerate(candidate, question, expected)
        if kind is not None:
            return 0.0, kind
    return score, None
