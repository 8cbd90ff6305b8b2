"""Tasks of the finance family: a question about one generated annual report.

`generate_task(seed, index, level)` is what the pack's generator calls. It builds the
accounts (milliseconds), not the PDF: the family renders the PDF at reset, from the private
`document` fields, and caches it. The public side is the question and what the report is;
the private side holds the seeds, the gold answer and program, and a prior-year value for
the cheat checks.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from palaestra.envs.finance.accounts import (
    Accounts,
    Structure,
    build_accounts,
    sub_seed,
    variant_seed,
)
from palaestra.envs.finance.layout import Layout, build_layout
from palaestra.envs.finance.questions import (
    DOMAINS,
    Question,
    make_question,
    numbers_of,
    numbers_program,
)
from palaestra.verifiers.finance import (
    VALUE_ONLY_REWARD,
    Gold,
    Numbers,
    rerun,
    run_keys,
    to_unit,
)
from palaestra.verifiers.finance_program import ProgramError

MAX_TRIES = 40

ANSWER_HELP = (
    'Submit with the `submit` tool: {"value": number, "unit": one of currency, percent, '
    'fraction, ratio, currency_per_share, shares, count, "scale": one of units, thousands, '
    'millions, billions, "program": a FinQA-style program over numbers printed in the report '
    'that computes the value, e.g. "subtract(5829, 5735), divide(#0, 5735)"}. Operations: '
    "add, subtract, multiply, divide, exp, greater, table_sum, table_average, table_max, "
    "table_min; #k is the result of step k; constants are const_1, const_2, const_100, "
    "const_1000, const_m1 and so on. Write numbers without thousands separators, as printed "
    "(a figure printed in thousands is used in thousands). The reward is 1 for the right value "
    "with a program that computes it from the question's figures in the report (it is re-run "
    f"on other numbers), {VALUE_ONLY_REWARD} for the right value alone, else 0."
)


@dataclass
class Built:
    accounts: Accounts
    layout: Layout
    numbers: Numbers


@functools.lru_cache(maxsize=64)
def build_document(structure_seed: int, value_seed: int, level: int, text: bool = False) -> Built:
    """Accounts, layout and figures of one report (`text`: with the prose, for rendering).

    Cached: the verifier and the generator ask for the same few documents again and again.
    Treat the result as read-only."""
    accounts = build_accounts(structure_seed, value_seed, level)
    layout = build_layout(accounts, text=text)
    return Built(accounts, layout, numbers_of(layout))


def _asked(gold: Gold, canonical: float) -> float:
    return to_unit(canonical, gold.unit, gold.scale)


def prior_value(question: Question, built: Built, gold: Gold) -> tuple[float, str]:
    """The answer a reader gets by taking the prior year (the cheat), with its program."""
    keys = question.prior_keys_program
    if not keys:
        first = re.search(r"\{=?([^{}]+)\.0\}", question.keys_program)
        if first is None or f"{first.group(1)}.1" not in built.numbers.figures:
            first = re.search(r"\{=?([^{}]+)\}", question.keys_program)
            assert first is not None
            keys = "{" + first.group(1) + "}"
        else:
            keys = "{" + first.group(1) + ".1}"
    value = run_keys(keys, built.numbers) * gold.factor
    return _asked(gold, value), numbers_program(keys, built.numbers)


def _usable(question: Question, built: Built, gold: Gold) -> bool:
    """Reject questions whose answer sits too near a cheat's (zero, the prior year)."""
    asked = gold.asked_value
    step = 10.0 ** (-gold.decimals)
    if abs(asked) < 10 * step:
        return False
    prior, _ = prior_value(question, built, gold)
    if abs(prior - asked) <= 4 * step:
        return False
    # The variant document must give a usable answer too (the grounding re-run).
    variant = build_document(
        built.accounts.structure.seed,
        variant_seed(built.accounts.value_seed),
        built.accounts.structure.level,
    )
    try:
        again = rerun(gold.program, built.numbers, variant.numbers) * gold.factor
    except (ProgramError, KeyError):
        return False
    return abs(_asked(gold, again) - asked) > 4 * step


def generate_task(seed: int, index: int, level: int, domain: str | None = None) -> dict[str, Any]:
    """One task: a question of `domain` (default: by index) on the report of `seed`; a pure
    function of its arguments (the pack loader caches generated tasks, server/packs/gencache.py)."""
    domain = domain or DOMAINS[(index // 3) % len(DOMAINS)]
    return _generate(seed, level, domain)


def _generate(seed: int, level: int, domain: str) -> dict[str, Any]:
    for attempt in range(MAX_TRIES):
        value_seed = sub_seed("task-values", seed, attempt)
        built = build_document(seed, value_seed, level)
        question = make_question(domain, level, built.accounts, seed)
        try:
            gold = question.gold(built.accounts, built.numbers)
        except ProgramError:
            continue
        if _usable(question, built, gold):
            break
    else:
        raise RuntimeError(f"no usable {domain} question for seed {seed}")
    prior, prior_program = prior_value(question, built, gold)
    task = report_task(
        built.accounts.structure,
        value_seed,
        level,
        question=question.text,
        asked=f"Question: {question.text}",
        answer_help=ANSWER_HELP,
    )
    task["private"]["gold"] = gold.to_json()
    task["private"]["prior"] = {"value": prior, "program": prior_program}
    return {"id": f"{domain}-{level}-{seed}", "domain": f"finance/{domain}", **task}


def report_task(
    s: Structure, value_seed: int, level: int, *, question: str, asked: str, answer_help: str
) -> dict[str, Any]:
    """The fields of a task over a generated report that every family reading one shares
    (this one and finance-commentary): the difficulty, the public fields with the
    instruction (`asked`: the question as the instruction puts it) and the private
    `document` the report is rebuilt from; the caller adds the id, the domain and its gold."""
    instruction = (
        f"You have the {s.year} annual report of {s.company} as a PDF. Use the tools to read "
        f"it (list_pages, read_page, extract_tables, search, page_image, calculate).\n\n"
        f"{asked}\n\n{answer_help}"
    )
    return {
        "difficulty": f"level-{level}",
        "public": {
            "instruction": instruction,
            "question": question,
            "company": s.company,
            "fiscal_year": s.year,
            "currency": s.currency,
            "document": "annual-report.pdf",
        },
        "private": {
            "document": {
                "kind": "generated",
                "structure_seed": s.seed,
                "value_seed": value_seed,
                "level": level,
            },
        },
    }
