"""Tasks of the finance-commentary family: comment on two metrics of one generated report.

`generate_task(seed, index, level)` is what the pack's generator calls. It draws the
accounts (milliseconds; the family renders the PDF at reset, as the finance family does)
and the question: level 1 compares two amounts over the last year, level 2 an amount and a
margin, level 3 two metrics over three or four years (the five-year summary). Metrics whose
change is too small to call a direction are redrawn. The private side is the document's
seeds and what was asked; the figures are recomputed from the seeds when verifying.
"""

from __future__ import annotations

import random
from typing import Any

from palaestra.envs.commentary.truth import Truth, truth_of
from palaestra.envs.finance.accounts import build_accounts, sub_seed
from palaestra.envs.finance.tasks import report_task

MAX_TRIES = 40
MAX_CHARS = 4000

_LEVEL_METRICS: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # (first metric from, second metric from)
    1: (
        ("revenue", "gross profit", "operating income"),
        ("net income", "net cash from operating activities", "total assets"),
    ),
    2: (
        ("revenue", "operating income", "net income"),
        ("gross margin", "operating margin", "net margin"),
    ),
    3: (("revenue", "total assets"), ("operating income", "operating margin", "net margin")),
}
DOMAINS = {1: "amounts", 2: "margins", 3: "multi-year"}

ANSWER_HELP = (
    'Submit with the `submit` tool: {"commentary": text of at most '
    f"{MAX_CHARS} characters}}. A good commentary states each metric's figure in both years "
    "(amounts with their currency and scale, margins in percent), the direction of each "
    "change and its size (percent for an amount, percentage points for a margin), and "
    "answers only what is asked. A judge grades it against the report's figures."
)


def question_text(truth: Truth) -> str:
    names = truth.metrics
    joined = " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]
    c = truth.changes[0]
    return f"Comment on the change in {joined} from FY{c.year_from} to FY{c.year_to}."


def generate_task(seed: int, index: int, level: int) -> dict[str, Any]:
    """One task; a pure function of its arguments (the pack loader caches generated tasks)."""
    rng = random.Random(sub_seed("commentary", seed, index, level))
    firsts, seconds = _LEVEL_METRICS[level]
    for attempt in range(MAX_TRIES):
        value_seed = sub_seed("commentary-values", seed, attempt)
        accounts = build_accounts(seed, value_seed, level)
        metrics = [rng.choice(firsts), rng.choice(seconds)]
        offset_from = rng.choice((2, 3)) if level == 3 else 1
        truth = truth_of(accounts, metrics, offset_from, 0)
        if all(c.clear() for c in truth.changes):
            break
    else:
        raise RuntimeError(f"no commentary question with clear changes for seed {seed}")
    question = question_text(truth)
    task = report_task(
        accounts.structure,
        value_seed,
        level,
        question=question,
        asked=question,
        answer_help=ANSWER_HELP,
    )
    task["private"]["gold"] = {"metrics": metrics, "offset_from": offset_from, "offset_to": 0}
    domain = f"finance-commentary/{DOMAINS[level]}"
    return {"id": f"commentary-{level}-{seed}", "domain": domain, **task}
