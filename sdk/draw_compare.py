"""Comparing eval runs of two held-out draws (server/draws.py): different tasks, one split.

Two draws share no task, so a per-task pairing is impossible: the difference of mean
reward (B − A) gets an unpaired percentile bootstrap (each run's task means resampled on
their own, seeded). A model that memorised draw A and meets draw B shows up as a drop
whose interval excludes 0. The reports come from sdk/report.py (`compare` sends runs of
different draws here)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

LEVEL = 0.95

# task -> (domain, mean reward over its non-void attempts), as sdk/report.py computes it
TaskMeans = dict[str, tuple[str, float]]


def draws_of(a: dict[str, Any], b: dict[str, Any]) -> tuple[int | None, int | None] | None:
    """The two runs' held-out draws when they differ (None: a run made before runs recorded
    their draw, taken as another draw when the two share no task), else None."""
    da, db = a["header"].get("heldout_draw"), b["header"].get("heldout_draw")
    if isinstance(da, int) and isinstance(db, int):
        return (da, db) if da != db else None
    if isinstance(da, int) or isinstance(db, int):
        ta = {x.get("task") for x in a.get("attempts", [])}
        tb = {x.get("task") for x in b.get("attempts", [])}
        if ta and tb and not ta & tb:
            return da, db
    return None


def bootstrap_unpaired(
    a: Sequence[float], b: Sequence[float], *, samples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(delta, low, high): mean(b) − mean(a) and its 95% percentile bootstrap interval,
    `a` and `b` resampled independently."""
    if not a or not b:
        return 0.0, 0.0, 0.0
    delta = statistics.fmean(b) - statistics.fmean(a)
    if len(a) == 1 and len(b) == 1:
        return delta, delta, delta
    rng = random.Random(seed)
    na, nb = len(a), len(b)
    diffs = sorted(
        statistics.fmean(rng.choices(b, k=nb)) - statistics.fmean(rng.choices(a, k=na))
        for _ in range(samples)
    )
    tail = (1 - LEVEL) / 2
    return delta, diffs[int(tail * (samples - 1))], diffs[int((1 - tail) * (samples - 1))]


def row(a: Sequence[float], b: Sequence[float], *, samples: int, seed: int) -> dict[str, Any]:
    delta, low, high = bootstrap_unpaired(a, b, samples=samples, seed=seed)
    return {
        "tasks": len(a) + len(b),
        "tasks_a": len(a),
        "tasks_b": len(b),
        "mean_a": statistics.fmean(a) if a else 0.0,
        "mean_b": statistics.fmean(b) if b else 0.0,
        "delta": delta,
        "ci_low": low,
        "ci_high": high,
        "significant": low > 0 or high < 0,
        "drop": high < 0,
    }


def compare_draws(
    a: dict[str, Any],
    b: dict[str, Any],
    means_a: TaskMeans,
    means_b: TaskMeans,
    *,
    samples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Per-domain (and overall) mean reward B − A of runs on two draws of one split."""
    ha, hb = a["header"], b["header"]
    for key in ("pack", "split"):
        if ha.get(key) != hb.get(key):
            raise ValueError(
                f"different {key}s: {ha.get(key)!r} vs {hb.get(key)!r}; compare two draws of "
                "one pack's split"
            )
    domains = sorted({d for d, _ in means_a.values()} | {d for d, _ in means_b.values()})
    rows: dict[str, dict[str, Any]] = {}
    for name in [*domains, "all"]:
        va = [m for d, m in means_a.values() if name in ("all", d)]
        vb = [m for d, m in means_b.values() if name in ("all", d)]
        rows[name] = row(va, vb, samples=samples, seed=seed)
    keys = ("run_id", "policy", "pack", "version", "split", "heldout_draw")
    return {
        "a": {k: ha.get(k) for k in keys},
        "b": {k: hb.get(k) for k in keys},
        "pack_digest": ha.get("pack_digest"),
        "tasks_digest": None,
        "draws": {"a": ha.get("heldout_draw"), "b": hb.get("heldout_draw")},
        "bootstrap": {
            "samples": samples,
            "seed": seed,
            "level": LEVEL,
            "paired_by": None,
            "method": "unpaired: each run's task means resampled on their own (the draws "
            "share no task)",
        },
        "domains": rows,
        "drop": rows["all"]["drop"],
    }
