"""Answer-form cheats on every domain of the reasoning/gym pack (issue 31, invariant 4).

Plays, in-process through the family's `score_task` (reasoning-gym's scorer behind the
family's canonical form and guards), on N tasks a domain:

- the answer-form cheats of envs/reasoning/cheats.py, grouped by kind: `nonfinite` (nan,
  inf, 1e999), `label-markup` (a wrong label as **x**, \\boxed{x}, "x."), `label-combo` (every
  label at once), `digits` (a wrong number in full-width, Arabic-Indic, grouped or
  underscored digits), `grid-const` / `grid-pattern` (a puzzle grid filled by a rule);
- `constant-label`: on every task of each label dataset (both splits), each label submitted
  every time; its mean per domain must stay ≤ 1/k + 0.05 for k labels;
- `null-information`: on every domain (both splits), each of its most common training
  answers (and each label) submitted on every task; the best one's mean must stay ≤ 1/k +
  0.05 for k distinct answers, ≤ 0.1 where answers are open-ended (envs/reasoning/skew.py);
- the oracle answer in documented forms (`oracle-forms`: **x**, \\boxed{x}, "x.", full-width
  digits), which must stay 1.0.

    .venv/bin/python bench/reasoning_cheats.py               # 3 tasks a domain
    .venv/bin/python bench/reasoning_cheats.py --per-domain 6 --json out.json
    .venv/bin/python bench/reasoning_cheats.py --null-only   # null-information play only

Prints per cheat kind the worst domains (max and mean reward), then one summary line per
kind; the last line of stdout is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from palaestra.envs.reasoning import canon, cheats, skew
from palaestra.envs.reasoning.family import score_task
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.loader import load_pack

KINDS = ("nonfinite", "label-markup", "label-combo", "digits", "grid-const", "grid-pattern")


def kind_of(name: str) -> str:
    return next(k for k in KINDS if name.startswith(k))


def oracle_forms(dataset: str, answer: str) -> list[str]:
    """The answer in the documented forms (packs/reasoning-gym/README.md, "Answers")."""
    forms = [f"**{answer}**", f"\\boxed{{{answer}}}"]
    if dataset in canon.LABEL_SETS:
        forms += [f"{answer}.", f"'{answer.upper()}'"]
    if any(ch.isdigit() for ch in answer):
        forms.append(answer.translate(cheats.FULLWIDTH))
    return forms


def measure(tasks: list[Task], per_domain: int) -> dict[str, Any]:
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.id):
        by_domain[task.domain].append(task)
    rewards: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for domain, all_tasks in sorted(by_domain.items()):
        sample = [t for t in all_tasks if t.split == "train"][:per_domain]
        sample += [t for t in all_tasks if t.split == "heldout"][:1]
        for task in sample:
            p, question = task.private, task.public["question"]
            answer = str(p["answer"])
            for name, text in cheats.answer_cheats(p["dataset"], question, answer):
                rewards[kind_of(name)][domain].append(score_task(task, text)[0])
            for text in oracle_forms(p["dataset"], answer):
                rewards["oracle-forms"][domain].append(score_task(task, text)[0])
        dataset = all_tasks[0].private["dataset"]
        for label in canon.LABEL_SETS.get(dataset, ()):
            got = [score_task(t, label)[0] for t in all_tasks]
            rewards["constant-label"][f"{domain}={label}"].append(statistics.fmean(got))
    out: dict[str, Any] = {}
    for kind, per in rewards.items():
        rows = {
            d: {"max": max(xs), "mean": statistics.fmean(xs), "min": min(xs), "n": len(xs)}
            for d, xs in per.items()
        }
        if kind == "oracle-forms":  # worst: the lowest reward of a correct answer
            worst = sorted(rows.items(), key=lambda kv: kv[1]["min"])
        else:
            key = "mean" if kind == "constant-label" else "max"
            worst = sorted(rows.items(), key=lambda kv: -kv[1][key])
        out[kind] = {
            "max": max(r["max"] for r in rows.values()),
            "mean": statistics.fmean(r["mean"] for r in rows.values()),
            "min": min(r["min"] for r in rows.values()),
            "domains": len(rows),
            "worst": [{"domain": d, **r} for d, r in worst[:8]],
        }
    return out


def null_information(tasks: list[Task]) -> dict[str, Any]:
    """The best constant of every domain (skew.best_constant), the worst first."""
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.id):
        by_domain[task.domain].append(task)
    plays = [
        skew.best_constant(ts, lambda t, text: score_task(t, text)[0])
        for _, ts in sorted(by_domain.items())
    ]
    plays.sort(key=lambda p: (p.limit - p.mean, p.domain))
    return {
        "max": max(p.mean for p in plays),
        "mean": statistics.fmean(p.mean for p in plays),
        "domains": len(plays),
        "over": [p.domain for p in plays if p.over],
        "worst": [
            {
                "domain": p.domain,
                "constant": p.constant[:40],
                "mean": p.mean,
                "train": p.train,
                "heldout": p.heldout,
                "k": p.k,
                "limit": p.limit,
                "tasks": p.tasks,
            }
            for p in plays[:16]
        ],
    }


def print_null(f: dict[str, Any]) -> None:
    print(
        f"== null-information: max {f['max']:.3f} mean {f['mean']:.3f} over {f['domains']} "
        f"domains; {len(f['over'])} over their limit"
    )
    for row in f["worst"]:
        held = "-" if row["heldout"] is None else f"{row['heldout']:.3f}"
        print(
            f"   {row['domain']:<36} mean {row['mean']:.3f} (train {row['train']:.3f}, "
            f"held {held}) limit {row['limit']:.3f} k={row['k']:<2} n={row['tasks']:<2} "
            f"{row['constant']!r}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-domain", type=int, default=3, help="train tasks a domain (+1 held out)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--null-only", action="store_true", help="null-information play only")
    args = ap.parse_args()
    tasks = list(load_pack(REPO_PACKS / "reasoning-gym").tasks.values())
    figures = {} if args.null_only else measure(tasks, args.per_domain)
    for kind, f in figures.items():
        print(f"== {kind}: max {f['max']:.3f} mean {f['mean']:.3f} over {f['domains']} domains")
        for row in f["worst"]:
            print(
                f"   {row['domain']:<44} max {row['max']:.3f} mean {row['mean']:.3f} "
                f"min {row['min']:.3f} (n={row['n']})"
            )
    figures["null-information"] = null = null_information(tasks)
    print_null(null)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    summary = {
        k: {x: round(f[x], 4) for x in ("max", "mean", "min") if x in f} for k, f in figures.items()
    }
    summary["null-information"]["over"] = len(null["over"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
