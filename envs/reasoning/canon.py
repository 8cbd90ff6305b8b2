"""One canonical form of an answer, before any scorer sees it.

Documented in packs/reasoning-gym/README.md, "Answers".

reasoning-gym's scorers each read answers their own way: some `float()` them (which takes
"nan", "inf", "1e999", "1_000" and any script's digits), some compare strings, some pay for
an answer that merely contains the expected one. A policy learns whichever reading pays. So
every answer is brought to one form first, and only that form is scored:

1. Unicode: NFKC (full-width letters and digits become ASCII) unless the expected answer is
   itself not NFKC-stable; every other decimal digit (Arabic-Indic, Devanagari, …) becomes
   its ASCII digit and U+2212 becomes "-", unless the expected answer uses such characters.
2. Markup around the whole answer is dropped: `\\boxed{…}`, `\\text{…}`, `**…**`, `__…__`,
   `` `…` ``, `$…$`, unless the expected answer is itself written so.
3. Numbers: an answer Python's `float()` reads as NaN or an infinity ("nan", "inf",
   "-Infinity", "1e999") is wrong; one with `_` between digits (a Python-only form) is wrong;
   thousands commas ("1,000") are dropped when the expected answer has none; an answer equal
   in value to a numeric expected answer ("1000.0", "+1000", "1e3" for "1000") is scored as
   the expected answer itself.
4. Labels: on a label dataset (LABEL_SETS) the answer is folded (markup commands and every
   punctuation or symbol character but a number's sign become spaces, case is folded, spaces
   collapsed: "-1" is not the label "1") and must
   then equal exactly one label, which is what the scorer sees. An answer holding several
   labels ("True/False", "yes and no") or anything else is wrong.
5. Case: on CASELESS datasets an answer equal to the expected one but for case ("friday")
   is the expected answer (calendar_arithmetic's scorer paid it 0.05, format credit that
   is no longer paid).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

# Datasets whose every answer is one of a few labels (reasoning-gym 0.1.25's generators).
LABEL_SETS: dict[str, tuple[str, ...]] = {
    "acre": ("on", "off", "undetermined"),
    "circuit_logic": ("0", "1"),
    "course_schedule": ("True", "False"),
    "game_of_life_halting": ("True", "False"),
    "isomorphic_strings": ("True", "False"),
    "mahjong_puzzle": ("Peng", "Chi", "Pass"),
    "ransom_note": ("True", "False"),
    "syllogism": ("Yes", "No"),
}
# Datasets whose answer is right whatever its case (their scorers pay the exact case more).
CASELESS = frozenset({"calendar_arithmetic"})
WRAPPERS = (
    re.compile(r"^\\boxed\{(.*)\}$", re.S),
    re.compile(r"^\\text\{(.*)\}$", re.S),
    re.compile(r"^\*\*(.*)\*\*$", re.S),
    re.compile(r"^__(.*)__$", re.S),
    re.compile(r"^`(.*)`$", re.S),
    re.compile(r"^\$(.*)\$$", re.S),
)
LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
DECIMAL = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
GROUPED = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
UNDERSCORED = re.compile(r"\d_\d")


@dataclass(frozen=True)
class Canonical:
    """The answer the scorer sees, or why none does (then the reward is 0)."""

    text: str
    refused: str | None = None  # why no scorer sees it (feedback)
    failure: str | None = None  # its failure class (the family's own, beside FAILURE_CLASSES)


def _ascii_digits(text: str) -> str:
    out = []
    for ch in text:
        if ch == "\u2212":
            out.append("-")
        elif not ch.isascii() and unicodedata.category(ch) == "Nd":
            out.append(str(unicodedata.decimal(ch)))
        else:
            out.append(ch)
    return "".join(out)


def _plain_unicode(text: str, expected: str) -> str:
    if unicodedata.normalize("NFKC", expected) == expected:
        text = unicodedata.normalize("NFKC", text)
    if _ascii_digits(expected) == expected:
        text = _ascii_digits(text)
    return text


def unwrap(text: str, expected: str = "") -> str:
    """`text` without markup around the whole of it (repeatedly: `**\\boxed{x}**`)."""
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for pattern in WRAPPERS:
            m = pattern.match(text)
            if m and m.group(1).strip() and not pattern.match(expected.strip()):
                text, changed = m.group(1).strip(), True
    return text


# Signs are kept only where they sign a number; anywhere else they are punctuation.
SIGN_MARKS = frozenset("-+\u2212")
SIGNED_DIGIT = re.compile(r"(?<![\w.])([-+\u2212](?=\d))")
STRAY_SIGN = re.compile(r"(?<!\S)[-+\u2212](?!\d)|(?<=\S)[-+\u2212]")


def fold(text: str) -> str:
    """The label fold: NFKC, markup commands and punctuation/symbols to spaces, case folded."""
    text = unicodedata.normalize("NFKC", text)
    text = LATEX_COMMAND.sub(" ", text)
    text = SIGNED_DIGIT.sub(r" \1", text)  # a sign before a digit stays: "-1" is not "1"
    text = "".join(
        " " if unicodedata.category(ch)[0] in "PS" and ch not in SIGN_MARKS else ch for ch in text
    )
    text = STRAY_SIGN.sub(" ", text)
    return " ".join(text.casefold().split())


def _float(text: str) -> float | None:
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


def nonfinite(text: str) -> bool:
    """Python's `float()` reads `text` as NaN or an infinity ("nan", "-inf", "1e999")."""
    value = _float(text)
    return value is not None and not math.isfinite(value)


def _decimal(text: str) -> Decimal | None:
    if not DECIMAL.match(text):
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def label(dataset: str, answer: str) -> Canonical:
    """A label dataset's answer as exactly one of its labels, or refused (the reason names
    no label: feedback never shows the answer)."""
    labels = LABEL_SETS[dataset]
    folded = fold(answer)
    exact = [lb for lb in labels if fold(lb) == folded]
    if len(exact) == 1:
        return Canonical(exact[0])
    words = f" {folded} "
    held = [lb for lb in labels if f" {fold(lb)} " in words]
    if len(held) >= 2:
        return Canonical(answer, f"several labels at once ({len(held)})", "several_labels")
    return Canonical(answer, "not one of the task's labels", "not_a_label")


def number(text: str, expected: str) -> Canonical:
    """A numeric-looking answer in its one form (see the module's rule 3)."""
    value = _float(text)
    if UNDERSCORED.search(text) and not UNDERSCORED.search(expected) and value is not None:
        return Canonical(
            text, "a number in a non-canonical form (underscores)", "noncanonical_answer"
        )
    if GROUPED.match(text) and "," not in expected:
        text = text.replace(",", "")
    got, want = _decimal(text), _decimal(expected.strip())
    if got is not None and want is not None and got == want:
        return Canonical(expected)
    return Canonical(text)


def canonical(dataset: str, answer: str, expected: str) -> Canonical:
    """`answer` in the one form the scorer sees (the module's rules 1-5), or refused."""
    text = unwrap(_plain_unicode(answer, expected), expected)
    if nonfinite(text) and not nonfinite(expected.strip()):
        return Canonical(text, "not a finite number", "nonfinite_number")
    if dataset in LABEL_SETS:
        return label(dataset, text)
    if dataset in CASELESS and text.casefold() == expected.strip().casefold():
        return Canonical(expected)
    return number(text, expected)
