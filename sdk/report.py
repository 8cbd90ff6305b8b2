"""The evaluation report of DESIGN §8 as JSON, and the comparison of two runs.

Means are over non-void attempts (a policy error counts as reward 0; an infrastructure
void is counted apart, never as 0). pass@k is the unbiased estimator over the tasks with at
least k scored attempts. Breakdowns by family, domain and difficulty give mean ± stderr.
`hacks` is the reward-hack monitor's flagged share per domain (sdk/hack_monitor.py).
`compare` refuses runs of different packs or task digests: a delta between different
tasks would be meaningless.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import time
from collections.abc import Iterable, Sequence
from typing import Any

from palaestra.sdk.draw_compare import compare_draws, draws_of
from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.hack_monitor import MONITOR, HackFlag, HackMonitor, HackTally

REPORT_FORMAT = "palaestra-report/1"
BINS = 10  # reward histogram: [0, 0.1), …, [0.9, 1.0]
PHASES = ("reset_s", "policy_s", "env_s", "verify_s")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class CompareError(Exception):
    """Two runs that cannot be compared; the message says why."""


def _as_attempts(items: Iterable[Attempt | dict[str, Any]]) -> list[Attempt]:
    return [a if isinstance(a, Attempt) else Attempt.from_json(a) for a in items]


def failure_class(a: Attempt) -> str:
    """Why an attempt did not pass ('' when it passed)."""
    if a.status in ("void", "error"):
        return a.error_class or a.status
    if a.passed:
        return ""
    if a.error_class:  # timeout, token_limit
        return a.error_class
    if a.stop == "truncated":
        return "step_limit"
    return "partial" if a.reward > 0 else "incorrect"


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _stderr(values: Sequence[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _count(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def pass_curve(attempts: Sequence[Attempt], k: int) -> dict[str, float]:
    """Unbiased pass@j for j = 1..k, over the tasks with at least j scored attempts."""
    by_task: dict[str, list[Attempt]] = {}
    for a in attempts:
        if a.status != "void":
            by_task.setdefault(a.task, []).append(a)
    curve: dict[str, float] = {}
    for j in range(1, k + 1):
        eligible = [v for v in by_task.values() if len(v) >= j]
        if eligible:
            curve[str(j)] = statistics.fmean(
                pass_at_k(len(v), sum(a.passed for a in v), j) for v in eligible
            )
    return curve


def summarize(attempts: Sequence[Attempt], k: int) -> dict[str, Any]:
    scored = [a for a in attempts if a.status != "void"]
    rewards = [a.reward for a in scored]
    calls = sum(a.tool_calls for a in attempts)
    return {
        "attempts": len(attempts),
        "tasks": len({a.task for a in attempts}),
        "scored": len(scored),
        "void": sum(a.status == "void" for a in attempts),
        "errors": sum(a.status == "error" for a in attempts),
        "mean_reward": _mean(rewards),
        "stderr": _stderr(rewards),
        "passed": sum(a.passed for a in scored),
        "pass_rate": _mean([float(a.passed) for a in scored]),
        "pass_at_k": pass_curve(attempts, k),
        "mean_steps": _mean([a.steps for a in attempts]),
        "tool_call_success": 1 - sum(a.tool_errors for a in attempts) / calls if calls else 1.0,
        "mean_tokens": _mean([a.tokens for a in attempts]),
        "error_classes": _count(a.error_class for a in attempts if a.error_class),
    }


def histogram(values: Sequence[float], bins: int = BINS) -> dict[str, Any]:
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v * bins)))] += 1
    return {"edges": [round(i / bins, 6) for i in range(bins + 1)], "counts": counts}


def _int_histogram(values: Sequence[int]) -> dict[str, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return {str(k): counts[k] for k in sorted(counts)}


def _stat(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": _mean(values),
        "p50": _quantile(values, 0.5),
        "p90": _quantile(values, 0.9),
        "max": max(values) if values else 0.0,
        "total": float(sum(values)),
    }


def process_metrics(attempts: Sequence[Attempt]) -> dict[str, Any]:
    """Steps, tool-call success, tokens, time per phase, failure classes, voids.

    The server's own per-episode metrics (when it reports them) are totalled under
    `server` (rates averaged); everything else is computed from the client's trajectories."""
    calls = sum(a.tool_calls for a in attempts)
    errors = sum(a.tool_errors for a in attempts)
    server: dict[str, float] = {}
    seen: dict[str, int] = {}
    for a in attempts:
        for key, value in a.process.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                server[key] = server.get(key, 0.0) + float(value)
                seen[key] = seen.get(key, 0) + 1
    for key in server:  # counts are totals; rates and ratios are means over the attempts
        if "rate" in key or "ratio" in key or key.startswith("mean"):
            server[key] /= seen[key]
    phases = {p: _stat([a.phases.get(p, 0.0) for a in attempts]) for p in PHASES}
    return {
        "steps": _stat([float(a.steps) for a in attempts]),
        "steps_histogram": _int_histogram([a.steps for a in attempts]),
        "tool_calls": calls,
        "tool_errors": errors,
        "tool_call_success": 1 - errors / calls if calls else 1.0,
        "tokens": {
            "prompt": _stat([float(a.tokens_prompt) for a in attempts]),
            "completion": _stat([float(a.tokens_completion) for a in attempts]),
            "total": _stat([float(a.tokens) for a in attempts]),
        },
        "phases": phases,
        "duration_s": _stat([a.duration_s for a in attempts]),
        "failure_classes": _count(c for a in attempts if (c := failure_class(a))),
        "stop_reasons": _count(a.stop or "-" for a in attempts),
        "void": sum(a.status == "void" for a in attempts),
        "void_reasons": _count(a.error or a.error_class for a in attempts if a.status == "void"),
        "server": server,
    }


def hack_flags(attempt: Attempt, monitor: HackMonitor = MONITOR) -> list[HackFlag]:
    """The monitor's flags on an attempt's actions (each one the policy chose, refused
    ones too: they show what it tried); the flag's index is the trajectory step."""
    steps = [s for s in attempt.trajectory if isinstance(s.get("action"), dict)]
    flags = monitor.scan(s["action"] for s in steps)
    return [HackFlag(f.rule, int(steps[f.index].get("index", f.index)), f.excerpt, f.note)
            for f in flags]  # fmt: skip


def hack_report(
    attempts: Sequence[Attempt], flags: Sequence[Sequence[HackFlag]], monitor: HackMonitor
) -> dict[str, Any]:
    """The reward-hack monitor's section: per domain, the share of attempts flagged and the
    attempts each rule flagged (every attempt counts, void ones too)."""
    tally = HackTally()
    for attempt, found in zip(attempts, flags, strict=True):
        tally.add(attempt.domain, found)
    return {"descriptions": monitor.descriptions, **tally.summary()}


def task_digests(attempts: Sequence[Attempt]) -> dict[str, str]:
    return {a.task: a.task_digest for a in sorted(attempts, key=lambda a: a.task) if a.task_digest}


def tasks_digest(digests: dict[str, str]) -> str:
    """One digest over the (task, task digest) pairs: equal ones mean the same tasks."""
    h = hashlib.sha256()
    for task in sorted(digests):
        h.update(f"{task}\0{digests[task]}\n".encode())
    return "sha256:" + h.hexdigest()


def build_report(
    attempts: Iterable[Attempt | dict[str, Any]],
    *,
    k: int,
    header: dict[str, Any],
    monitor: HackMonitor = MONITOR,
) -> dict[str, Any]:
    chosen = _as_attempts(attempts)
    chosen.sort(key=lambda a: (a.task, a.attempt))
    flags = [hack_flags(a, monitor) for a in chosen]
    digests = task_digests(chosen)
    head = {**header, "k": k}
    head.setdefault("task_digests", digests)
    head.setdefault("tasks_digest", tasks_digest(head["task_digests"]))
    head.setdefault("generated_at", time.time())
    groups: dict[str, dict[str, list[Attempt]]] = {"family": {}, "domain": {}, "difficulty": {}}
    for a in chosen:
        for key in groups:
            groups[key].setdefault(getattr(a, key) or "-", []).append(a)
    scored = [a.reward for a in chosen if a.status != "void"]
    return {
        "format": REPORT_FORMAT,
        "header": head,
        "summary": summarize(chosen, k),
        "by": {
            key: {name: summarize(v, k) for name, v in sorted(g.items())}
            for key, g in groups.items()
        },
        "reward_histogram": histogram(scored),
        "process": process_metrics(chosen),
        "hacks": hack_report(chosen, flags, monitor),
        "attempts": [
            {**a.to_json(), "failure": failure_class(a), "hack_flags": [f.to_json() for f in fl]}
            for a, fl in zip(chosen, flags, strict=True)
        ],
    }


# -- comparing two runs ---------------------------------------------------------------------------


def check_comparable(a: dict[str, Any], b: dict[str, Any]) -> None:
    ha, hb = a["header"], b["header"]
    if ha.get("pack_digest") != hb.get("pack_digest"):
        raise CompareError(
            f"different packs: {ha.get('pack')}@{ha.get('version')} ({ha.get('pack_digest')}) "
            f"vs {hb.get('pack')}@{hb.get('version')} ({hb.get('pack_digest')}); "
            "compare runs of the same pack version"
        )
    if ha.get("split") != hb.get("split"):
        raise CompareError(f"different splits: {ha.get('split')!r} vs {hb.get('split')!r}")
    da, db = ha.get("task_digests") or {}, hb.get("task_digests") or {}
    differ = sorted(t for t in set(da) & set(db) if da[t] != db[t])
    if differ:
        raise CompareError(
            f"{len(differ)} task(s) have different digests (e.g. {differ[0]}): the runs did "
            "not see the same tasks"
        )
    only = sorted(set(da) ^ set(db))
    if only:
        raise CompareError(
            f"the runs cover different tasks ({len(only)} in only one of them, e.g. {only[0]}); "
            "compare runs of the same split (resume the shorter one first)"
        )


def _task_means(report: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """task → (domain, mean reward over its non-void attempts)."""
    per: dict[str, list[float]] = {}
    domain: dict[str, str] = {}
    for a in report["attempts"]:
        if a.get("status") == "void":
            continue
        per.setdefault(a["task"], []).append(float(a.get("reward", 0.0)))
        domain[a["task"]] = a.get("domain") or "-"
    return {t: (domain[t], statistics.fmean(v)) for t, v in per.items()}


def bootstrap_delta(
    pairs: Sequence[tuple[float, float]], *, samples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(delta, low, high): mean(b - a) over paired tasks, 95% percentile bootstrap CI."""
    if not pairs:
        return 0.0, 0.0, 0.0
    diffs = [b - a for a, b in pairs]
    delta = statistics.fmean(diffs)
    if len(diffs) == 1:
        return delta, delta, delta
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(samples))
    return delta, means[int(0.025 * (samples - 1))], means[int(0.975 * (samples - 1))]


HEADER_KEYS = ("run_id", "policy", "pack", "version", "split", "heldout_draw")


def compare(
    a: dict[str, Any], b: dict[str, Any], *, samples: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """Per-domain (and overall) delta of mean reward B − A, paired by task, with bootstrap CIs;
    runs of two held-out draws (no task in common) get an unpaired bootstrap instead."""
    if draws_of(a, b) is not None:
        try:
            return compare_draws(a, b, _task_means(a), _task_means(b), samples=samples, seed=seed)
        except ValueError as exc:
            raise CompareError(str(exc)) from None
    check_comparable(a, b)
    ta, tb = _task_means(a), _task_means(b)
    common = sorted(set(ta) & set(tb))
    domains: dict[str, list[tuple[float, float]]] = {}
    for task in common:
        domains.setdefault(ta[task][0], []).append((ta[task][1], tb[task][1]))
    rows: dict[str, dict[str, Any]] = {}
    for name, pairs in [*sorted(domains.items()), ("all", [(ta[t][1], tb[t][1]) for t in common])]:
        delta, low, high = bootstrap_delta(pairs, samples=samples, seed=seed)
        rows[name] = {
            "tasks": len(pairs),
            "mean_a": statistics.fmean(p[0] for p in pairs) if pairs else 0.0,
            "mean_b": statistics.fmean(p[1] for p in pairs) if pairs else 0.0,
            "delta": delta,
            "ci_low": low,
            "ci_high": high,
            "significant": low > 0 or high < 0,
            "drop": high < 0,
        }
    return {
        "a": {k: a["header"].get(k) for k in HEADER_KEYS},
        "b": {k: b["header"].get(k) for k in HEADER_KEYS},
        "pack_digest": a["header"].get("pack_digest"),
        "tasks_digest": a["header"].get("tasks_digest"),
        "bootstrap": {"samples": samples, "seed": seed, "level": 0.95, "paired_by": "task"},
        "domains": rows,
        "drop": rows["all"]["drop"],
    }
