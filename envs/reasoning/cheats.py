"""Answer-form cheats: what a policy can submit without solving, in forms a scorer may misread.

Each is one `submit` answer built from the question (and, to stay off the right answer, the
expected answer): the family plays them as cheats (`ReasoningFamily.cheats`, so `palaestra
pack check` requires ≤ 0.1 on every task) and bench/reasoning_cheats.py measures them.

- `nonfinite-*`: NaN and infinities ("nan", "inf", "-inf", "1e999" that overflows);
- `label-markup-*`: a label that is not the answer, in markup or with punctuation
  (`**True**`, `\\boxed{yes}`, `True.`);
- `label-combo-*`: every label of the task at once ("True/False", "yes and no");
- `digits-*`: a number that is not the answer in another digit form (full-width,
  Arabic-Indic, thousands commas, underscores);
- `grid-const` / `grid-pattern`: a puzzle grid whose blanks are filled with one digit, or with
  a cyclic pattern that ignores the puzzle's rows, columns, boxes and inequalities;
- `common-answer-<i>`: null-information play, the domain's i-th most common training answer
  (the task's `common_answers`) wherever it is not the task's own answer: it must earn
  nothing there (no partial credit, no other task's plan accepted). Its mean over a domain,
  the right tasks included, is bounded by envs/reasoning/skew.py (bench and tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from palaestra.envs.reasoning import canon, guard, skew

NONFINITE = {
    "nonfinite-nan": "nan",
    "nonfinite-inf": "inf",
    "nonfinite-neg-inf": "-Infinity",
    "nonfinite-overflow": "1e999",
}
MARKUP = {
    "bold": "**{}**",
    "boxed": "\\boxed{{{}}}",
    "period": "{}.",
    "quoted": '"{}"',
}
COMBO = {"slash": "/", "and": " and ", "or": " or ", "comma": ", "}
GENERIC_LABEL_SETS = (("True", "False"), ("Yes", "No"), ("A", "B", "C", "D"))
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
BLANKS = frozenset({"_", "."})


def label_sets(dataset: str) -> tuple[tuple[str, ...], ...]:
    """The dataset's own labels when it is a label dataset, else the generic ones."""
    own = canon.LABEL_SETS.get(dataset)
    return (own,) if own else GENERIC_LABEL_SETS


def _grouped(digits: str) -> str:
    head, _, tail = digits.partition(".")
    sign = head[0] if head[:1] in "+-" else ""
    body = head[len(sign) :]
    groups: list[str] = []
    while len(body) > 3:
        groups.insert(0, body[-3:])
        body = body[:-3]
    return sign + ",".join([body, *groups]) + (f".{tail}" if tail else "")


def _wrong_number(answer: str) -> str | None:
    """A number close to (but not) the answer, written like it (ASCII), or None."""
    value = guard._number(answer)
    if value is None or not answer.strip().lstrip("+-").replace(".", "", 1).isdigit():
        return None
    return guard._format_like(value + 1001, answer.strip())


def digit_cheats(answer: str) -> list[tuple[str, str]]:
    wrong = _wrong_number(answer)
    if wrong is None:
        return []
    return [
        ("digits-fullwidth", wrong.translate(FULLWIDTH)),
        ("digits-arabic-indic", wrong.translate(ARABIC_INDIC)),
        ("digits-grouped", _grouped(wrong)),
        ("digits-underscore", _grouped(wrong).replace(",", "_")),
    ]


CELL = re.compile(r"^(\d+|[_.<>])$")
SPACER = re.compile(r"^[\s∧∨]*$")


def grid_lines(question: str) -> list[str] | None:
    """The puzzle grid of a question, as its lines: the last run of two or more rows of
    digits and blanks (`_` or `.`, with futoshiki's < and > between cells), with the
    spacer lines between them (blank, or futoshiki's ∧ and ∨), holding at least one blank."""
    best: list[str] | None = None
    run: list[str] = []
    for line in [*question.splitlines(), "x"]:
        toks = line.split()
        if len(toks) >= 2 and all(CELL.match(t) for t in toks):
            run.append(line)
            continue
        if run and SPACER.match(line):
            run.append(line)
            continue
        while run and SPACER.match(run[-1]):
            run.pop()
        rows = [r for r in run if not SPACER.match(r)]
        if len(rows) >= 2 and any(t in BLANKS for r in rows for t in r.split()):
            best = run
        run = []
    return best


def grid_cheats(question: str, answer: str) -> list[tuple[str, str]]:
    lines = grid_lines(question)
    if lines is None:
        return []
    size = max(sum(t not in "<>" for t in line.split()) for line in lines)

    def fill(value: Callable[[int, int], int]) -> str:
        out, i = [], 0
        for line in lines:
            if SPACER.match(line):
                out.append(line)
                continue
            toks, j = [], 0
            for tok in line.split():
                if tok in "<>":
                    toks.append(tok)
                    continue
                toks.append(str(value(i, j)) if tok in BLANKS else tok)
                j += 1
            out.append(" ".join(toks))
            i += 1
        return "\n".join(out)

    out = [
        ("grid-const", fill(lambda i, j: 1)),
        ("grid-pattern", fill(lambda i, j: (i + j) % size + 1)),
    ]
    return [(name, text) for name, text in out if guard._norm(text) != guard._norm(answer)]


def answer_cheats(dataset: str, question: str, answer: str) -> list[tuple[str, str]]:
    """(name, answer) of every answer-form cheat for one task, none the answer itself."""
    out = list(NONFINITE.items())
    expected = canon.fold(answer)
    for labels in label_sets(dataset):
        for label in labels:
            if canon.fold(label) == expected:
                continue
            for form, pattern in MARKUP.items():
                out.append((f"label-markup-{form}-{label}", pattern.format(label)))
        for form, sep in COMBO.items():
            out.append((f"label-combo-{form}-{'-'.join(labels)}", sep.join(labels)))
    out += digit_cheats(answer)
    out += grid_cheats(question, answer)
    return [(name, text) for name, text in out if canon.fold(text) != expected]


def common_answer_cheats(common: list[str], answer: str) -> list[tuple[str, str]]:
    """(name, answer) for each of the domain's most common answers that is not `answer`."""
    own = skew.answer_key(answer)
    return [
        (f"common-answer-{i}", text)
        for i, text in enumerate(common, 1)
        if skew.answer_key(text) != own
    ]
