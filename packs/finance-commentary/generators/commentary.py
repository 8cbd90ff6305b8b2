"""palaestra/finance-commentary: one commentary question about one generated annual report."""

from __future__ import annotations

from typing import Any

from palaestra.envs.commentary.tasks import generate_task


def generate(seed: int, index: int, level: int) -> dict[str, Any]:
    return generate_task(seed, index, level)
