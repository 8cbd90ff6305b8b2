"""Null-information play: one answer, the domain's most common, submitted on every task.

A policy that has learnt a domain's answer distribution but reads no question earns, with a
constant answer, the share of tasks that answer is right on (plus any partial credit it
gets elsewhere). Issue 31, invariant 4, bounds that share; documented in
packs/reasoning-gym/README.md ("Balanced answers"):

- the constant is each of the COMMON most common answers of the domain's training tasks
  (answers compared by `answer_key`), and each label of a label dataset;
- k is the number of labels of a label dataset, else the number of distinct answer keys
  among the domain's tasks (so at most its n tasks);
- its mean reward over every task of the domain must stay ≤ `limit(k)` = 1/k + 0.05.

Where answers are open-ended (every task its own answer, k = n) that is 1/n + 0.05: a
constant taken from the domain's own answers is right on that one task, and may earn a
scorer's format credit (countdown's 0.05 for any expression) on the others; 0.106 for a
domain of 18 tasks. Two tasks with one answer in an open-ended domain (2/18 = 0.111) are
over it, so the tasks are drawn with their answers balanced (packs/reasoning-gym/source.py).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from palaestra.envs import Task
from palaestra.envs.reasoning import canon

COMMON = 3  # most common training answers played as constants (and kept on each task)
SKEW_MARGIN = 0.05
KEY_DIGITS = 3  # numbers that agree to this many significant digits are one answer


def answer_key(answer: str) -> str:
    """One key per answer a scorer is likely to accept for another: numbers to KEY_DIGITS
    significant digits (scorers take a relative tolerance), other text with its whitespace
    collapsed and its case folded."""
    text = " ".join(str(answer).split())
    value = canon._decimal(text.replace(",", "") if canon.GROUPED.match(text) else text)
    if value is not None:
        return f"{float(value):.{KEY_DIGITS}g}"
    return text.casefold()


def limit(k: int) -> float:
    """The most a constant may earn on average over a domain whose answers take k values."""
    return 1 / k + SKEW_MARGIN if k > 0 else 1.0


def distinct(dataset: str, answers: Iterable[str]) -> int:
    """k: a label dataset's labels, else the distinct answer keys among `answers`."""
    labels = canon.LABEL_SETS.get(dataset)
    if labels:
        return len(labels)
    return len({answer_key(a) for a in answers})


def common_answers(answers: Iterable[str], n: int = COMMON) -> list[str]:
    """The `n` most common answers (by key; ties in order of first appearance), each as the
    first answer written with that key, stripped."""
    first: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for answer in answers:
        key = answer_key(answer)
        first.setdefault(key, str(answer).strip())
        counts[key] += 1
    order = {key: i for i, key in enumerate(first)}
    ranked = sorted(counts, key=lambda key: (-counts[key], order[key]))
    return [first[key] for key in ranked[:n]]


def constants(dataset: str, train_answers: Iterable[str]) -> list[str]:
    """The constant answers null-information play tries on a domain: its most common
    training answers, then its labels (when a label dataset) not among them."""
    out = common_answers(train_answers)
    keys = {answer_key(a) for a in out}
    out += [lb for lb in canon.LABEL_SETS.get(dataset, ()) if answer_key(lb) not in keys]
    return out


@dataclass(frozen=True)
class Play:
    """The best constant on one domain: its mean reward over every task, per split too."""

    domain: str
    constant: str
    mean: float
    train: float
    heldout: float | None
    k: int
    limit: float
    tasks: int

    @property
    def over(self) -> bool:
        return self.mean > self.limit + 1e-9


def best_constant(tasks: Sequence[Task], score: Callable[[Task, str], float]) -> Play:
    """Each constant of `constants` scored on every task of one domain (`tasks`); the one
    with the highest mean. `score(task, answer)` is the family's reward."""
    dataset = str(tasks[0].private["dataset"])
    train = [str(t.private["answer"]) for t in tasks if t.split == "train"]
    k = distinct(dataset, (str(t.private["answer"]) for t in tasks))
    best: Play | None = None
    for constant in constants(dataset, train):
        got = {t.id: score(t, constant) for t in tasks}
        held = [got[t.id] for t in tasks if t.split != "train"]
        play = Play(
            domain=tasks[0].domain,
            constant=constant,
            mean=statistics.fmean(got.values()),
            train=statistics.fmean(got[t.id] for t in tasks if t.split == "train"),
            heldout=statistics.fmean(held) if held else None,
            k=k,
            limit=limit(k),
            tasks=len(tasks),
        )
        if best is None or play.mean > best.mean:
            best = play
    assert best is not None
    return best
