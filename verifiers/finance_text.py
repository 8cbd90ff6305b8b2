"""Text answers (TAT-QA spans, lists and counts), scored with TAT-QA's normalisation.

TAT-QA's metric (github.com/NExTplusplus/TAT-QA, tatqa_metric.py and tatqa_utils.py, MIT),
reimplemented: each answer is lower-cased, stripped of punctuation (unless it is a number)
and of articles; a number is read with its scale word, `(134)` as −134 and `12%` as 0.12;
the answers, sorted, are joined into one string in which a number is written `%.4f` of
its value rounded to 2 decimals times the scale (thousand, million, billion, percent)
and any other text is followed by the scale's name. Exact match is equality of those
strings; F1 is the bag-of-tokens F1 between them.

What passes, for a verifiable reward: **exact match** (TAT-QA's EM). F1 is reported as a
component but pays nothing: a longer answer that contains the span, or a list with extra
items, earns F1 without being right. One deviation from TAT-QA's scorer: its strings make a
bare 0.5 equal to 50 with the scale percent (and 2,000 equal to 2 thousand); here the
declared scale must also be the gold's, as the unit must be for a numeric answer. A count
is answered with the items counted (the annotators' list), not the number alone, which a
guess would hit.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from palaestra.verifiers.finance import Grade

Scale = Literal["", "thousand", "million", "billion", "percent"]
SCALES: tuple[str, ...] = ("", "thousand", "million", "billion", "percent")
MAX_ANSWERS = 50
MAX_ANSWER_CHARS = 2000
_EXCLUDE_IN_NUM = set("'\"\\$€£¥%(),[]")
_PUNCTUATION = set(string.punctuation)


def scale_factor(scale: str) -> float:
    low = scale.lower()
    for word, factor in (
        ("hundred", 100.0), ("thousand", 1e3), ("million", 1e6), ("billion", 1e9),
        ("percent", 0.01),
    ):  # fmt: skip
        if word in low:
            return factor
    return 1.0


def _clean(text: str) -> str:
    return "".join(ch for ch in text if ch not in _EXCLUDE_IN_NUM)


def is_number(text: str) -> bool:
    words = " ".join(_clean(w) for w in text.split()).split()
    if not words:
        return False
    try:
        value = float(words[0])
    except ValueError:
        return False
    if math.isnan(value):
        return False
    return not (len(words) >= 2 and scale_factor(words[1]) == 1.0)


def to_number(text: str) -> float | None:
    """The first number of a text with its scale word, accounting sign and percent."""
    found = re.findall(r"([+-]?\d+(\.\d+)?)|([+-]?\.\d+)", _clean(text))
    if not found or not found[0][0]:
        return None
    number = float(found[0][0])
    word = re.search(r"[\d.]+\s?[a-zA-Z]+", text)
    factor = scale_factor(word.group(0)) if word else 1.0
    sign = -1.0 if re.search(r"\([\d.\s]+\)", text.strip()) else 1.0
    percent = 0.01 if re.search(r"[\d.\s]+%", text.strip()) else 1.0
    return round(number * factor * sign * percent, 4)


def _normalize_token(token: str) -> str:
    token = token.lower()
    if not is_number(token):
        token = "".join(ch for ch in token if ch not in _PUNCTUATION)
    if is_number(token):
        token = str(to_number(token))
    token = re.sub(r"\b(a|an|the)\b", " ", token)
    return " ".join(token.split())


def normalize(text: str) -> str:
    parts = [_normalize_token(t) for t in text.split(" ")]
    return " ".join(p for p in parts if p.strip()).strip()


def answer_string(answers: list[str], scale: str) -> str:
    """The answers, sorted and joined, numbers written with their scale (TAT-QA's form)."""
    out = []
    for answer in sorted(answers):
        text = str(answer)
        number = to_number(text) if is_number(text) else None
        if number is None:
            out.append(f"{text} {scale}" if scale else text)
        elif "%" in text:
            out.append(f"{number:.4f}")
        else:
            out.append(f"{round(number, 2) * scale_factor(scale):.4f}")
    return " ".join(out)


def _f1(predicted: set[str], gold: set[str]) -> float:
    common = len(gold & predicted)
    precision = common / len(predicted) if predicted else 1.0
    recall = common / len(gold) if gold else 1.0
    return 0.0 if precision == recall == 0 else 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class TextScore:
    exact: bool
    f1: float


def score(answers: list[str], scale: str, gold: list[str], gold_scale: str) -> TextScore:
    """TAT-QA's exact match and F1 of `answers` (with their scale) against the gold."""
    predicted = normalize(answer_string(answers, scale))
    expected = normalize(answer_string(gold, gold_scale))
    f1 = round(_f1(set(predicted.split()), set(expected.split())), 2)
    return TextScore(predicted == expected and scale == gold_scale, f1)


class TextAnswer(BaseModel):
    """What `submit_text` takes."""

    model_config = ConfigDict(extra="forbid")

    answers: list[Annotated[str, Field(max_length=MAX_ANSWER_CHARS)]] = Field(
        min_length=1,
        max_length=MAX_ANSWERS,
        description="the answer as printed in the document; several items as a list",
    )
    scale: Scale = Field(default="", description="'', thousand, million, billion or percent")


def grade(answer: TextAnswer, gold: dict[str, Any]) -> Grade:
    """Reward 1 for TAT-QA's exact match, else 0 (F1 is a component only)."""
    result = score(answer.answers, answer.scale, list(gold["answers"]), str(gold["scale"]))
    return Grade(
        reward=1.0 if result.exact else 0.0,
        passed=result.exact,
        components={"exact": float(result.exact), "f1": result.f1},
        feedback="correct" if result.exact else "the answer does not match (TAT-QA exact match)",
    )
