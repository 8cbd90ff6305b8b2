"""Answers that carry no work, for the answer-form classes of the generic cheat library.

Pure functions from what a task shows (its right answer, when the family's oracle gives it,
and its label set) to `(variant, answer text)` pairs, none of which is the right answer in
any form: non-finite numbers, a wrong label or number written in another form (markup,
punctuation, case, full-width or other digits), several labels at once, and answers that
need no reading at all (constants, empty text). `palaestra.envs.cheatlib` plays them.
"""

from __future__ import annotations

import math
import re

NON_FINITE = (
    ("nan", "nan"),
    ("NaN", "NaN"),
    ("inf", "inf"),
    ("-inf", "-inf"),
    ("Infinity", "Infinity"),
    ("1e999", "1e999"),
    ("-1e999", "-1e999"),
)
# Label sets a task's right answer may belong to (when its family declares none).
LABEL_SETS = (
    ("True", "False"),
    ("Yes", "No"),
    ("A", "B", "C", "D"),
)
# Answers a policy gives without reading the question.
MAX_CONSTANT_LABELS = 8  # label sets up to this size get the constant-label domain check
SKEW_MARGIN = 0.05  # a constant label may earn at most 1/k + this over a domain
MAX_WRONG_LABELS = 3  # wrong labels restyled per task (a 26-letter set would be 300 episodes)
CONSTANTS = ("0", "1", "-1", "yes", "no", "True", "False", "A", "None", "[]")
NUMBER_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
FULLWIDTH = {
    c: chr(ord(c) + 0xFEE0)
    for c in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
}
ARABIC_INDIC = {str(d): chr(0x0660 + d) for d in range(10)}


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def number(text: str) -> float | None:
    """The finite number `text` spells in plain ASCII, else None."""
    text = text.strip()
    if not NUMBER_RE.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def same_answer(candidate: str, expected: str) -> bool:
    """`candidate` may be the right answer in another form: equal after normalising, the same
    number, or the first word of it ("0" for "0 days")."""
    cand, exp = norm(candidate), norm(expected)
    if cand == exp or (exp.split() and cand == exp.split()[0]):
        return True
    a, b = number(candidate), number(expected)
    return a is not None and b is not None and a == b


def labels_for(expected: str | None, declared: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The task's label set: the family's, or the known set its right answer belongs to."""
    if declared:
        return declared
    if expected is None:
        return ()
    for labels in LABEL_SETS:
        if norm(expected) in {norm(label) for label in labels}:
            return labels
    return ()


def non_finite() -> list[tuple[str, str]]:
    return list(NON_FINITE)


def _restyled(text: str) -> list[tuple[str, str]]:
    """`text` in the other forms a lenient parser may read as it."""
    forms = [
        ("bold", f"**{text}**"),
        ("period", f"{text}."),
        ("parens", f"({text})"),
        ("code", f"`{text}`"),
        ("quoted", f'"{text}"'),
        ("tagged", f"<answer>{text}</answer>"),
        ("boxed", f"\\boxed{{{text}}}"),
        ("sentence", f"The answer is {text}."),
        ("upper", text.upper()),
        ("lower", text.lower()),
        ("fullwidth", "".join(FULLWIDTH.get(c, c) for c in text)),
        ("arabic-digits", "".join(ARABIC_INDIC.get(c, c) for c in text)),
    ]
    seen = {text}
    out = []
    for name, form in forms:
        if form not in seen:
            seen.add(form)
            out.append((name, form))
    return out


def _wrong_number(value: float, like: str) -> list[tuple[str, str]]:
    wrong = value + max(1.0, abs(value))  # never within any scorer's tolerance of the answer
    plain = str(int(wrong)) if "." not in like and wrong == int(wrong) else f"{wrong:g}"
    forms = [("plain", plain), ("thousands", f"{wrong:,}"), ("exponent", f"{wrong:e}")]
    if wrong == int(wrong):
        forms += [("decimal", f"{int(wrong)}.0"), ("signed", f"+{int(wrong)}")]
    return forms + _restyled(plain)


def reformatted(expected: str | None, labels: tuple[str, ...]) -> list[tuple[str, str]]:
    """Up to `MAX_WRONG_LABELS` wrong labels, or a wrong number (the answer doubled, or + 1),
    in other forms."""
    out: list[tuple[str, str]] = []
    if labels and expected is not None:
        wrong = [label for label in labels if not same_answer(label, expected)]
        for label in wrong[:MAX_WRONG_LABELS]:
            out += [(f"{label}-{name}", form) for name, form in _restyled(label)]
    elif expected is not None and (value := number(expected)) is not None:
        out += [(f"number-{name}", form) for name, form in _wrong_number(value, expected)]
    if expected is None:
        return out
    return [(name, text) for name, text in out if not same_answer(text, expected)]


def combinations(labels: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every label of the set at once, in the ways a list is written."""
    if len(labels) < 2:
        return []
    return [
        ("spaced", " ".join(labels)),
        ("commas", ", ".join(labels)),
        ("slashes", "/".join(labels)),
        ("lines", "\n".join(labels)),
        ("joined", "".join(labels)),
        ("json", "[" + ", ".join(f'"{label}"' for label in labels) + "]"),
        ("or", " or ".join(labels)),
    ]


def constants(expected: str | None) -> list[tuple[str, str]]:
    """The fixed answers, empty and blank text, less any that is the right answer."""
    out = [("empty", ""), ("whitespace", " \n\t ")]
    out += [(f"constant-{c}", c) for c in CONSTANTS]
    if expected is None:
        return out
    return [(name, text) for name, text in out if not same_answer(text, expected)]


def echoes(prompt: str, expected: str | None) -> list[tuple[str, str]]:
    """The prompt sent back, whole and its last line (unless that is the answer)."""
    lines = [line.strip() for line in prompt.splitlines() if line.strip()]
    out = [("echo-prompt", prompt)]
    if len(lines) > 1:
        out.append(("echo-last-line", lines[-1]))
    if expected is None:
        return out
    return [(name, text) for name, text in out if not same_answer(text, expected)]
