"""palaestra/finance: one question about one generated annual report per task."""

from __future__ import annotations

from typing import Any

from palaestra.envs.finance.tasks import generate_task


def generate(seed: int, index: int, level: int) -> dict[str, Any]:
    return generate_task(seed, index, level)
