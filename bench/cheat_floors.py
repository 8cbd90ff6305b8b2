"""Cheat floors: every family's known cheats played against its verifier, in-process.

For N tasks a domain of the built-in packs, each cheat of the family's `cheats(task)` (the
same list `palaestra pack check` plays through real sandboxes) is scored by the family's own
scoring function, without sandboxes, so that the whole pack can be measured on a shared
machine:

- **cad**: each cheat's script runs with this interpreter (manifold3d, trimesh) in a
  temporary directory, once with the task's parameters and, for a parametric task, once
  more with the hidden ones (the lower reward counts, as in `verify`); the mesh is scored
  by `score_mesh`. The oracle is played too (it must stay 1.0).
- **finance**: each cheat's `submit` is graded by `verifiers.finance.grade` on the task's
  document numbers and its regenerated variant (what `verify` does), the gold too.
- **reasoning**: each cheat's answer is scored by `score_task` (reasoning-gym's scorer behind
  the family's guard); the oracle too.

    .venv/bin/python bench/cheat_floors.py cad --per-domain 2
    .venv/bin/python bench/cheat_floors.py finance --per-domain 6
    .venv/bin/python bench/cheat_floors.py reasoning --per-domain 3
    .venv/bin/python bench/cheat_floors.py cad --per-domain 3 --by-domain --cheats needle-part

Prints, per cheat, its max and mean reward and the task of its max, then the worst cheat
(highest max); the last line of stdout is the figures as JSON (`--json PATH` writes it too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from palaestra.sdk.models import Action
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.loader import load_pack

Scorer = Callable[[Task, list[Action]], float]


def tasks_by_domain(pack_dir: str, per_domain: int, split: str) -> list[Task]:
    pack = load_pack(REPO_PACKS / pack_dir)
    chosen: dict[str, list[Task]] = {}
    for task in sorted(pack.tasks.values(), key=lambda t: t.id):
        if task.split == split and len(chosen.setdefault(task.domain, [])) < per_domain:
            chosen[task.domain].append(task)
    return [t for ts in chosen.values() for t in ts]


# -- cad ----------------------------------------------------------------------------------------
def cad_score(task: Task, actions: list[Action]) -> float:
    from palaestra.envs.cad.family import score_mesh
    from palaestra.envs.cad.tasks import OUTPUT, PARAMS_FILE

    runs = [task.private["params"]]
    if task.public.get("parametric"):
        runs.append(task.private["hidden_params"])
    rewards = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = None
        for action in actions:
            if action.tool == "write_file":
                (work / action.arguments["path"]).write_text(action.arguments["content"])
            elif action.tool == "run_script":
                script = action.arguments.get("path", "part.py")
        for params in runs:
            (work / PARAMS_FILE).write_text(json.dumps(params))
            (work / OUTPUT).unlink(missing_ok=True)
            assert script is not None
            done = subprocess.run(
                [sys.executable, script], cwd=work, capture_output=True, timeout=300, check=False
            )
            out = work / OUTPUT
            if done.returncode != 0 or not out.exists():
                rewards.append(0.0)
                continue
            rewards.append(score_mesh(task.private["domain"], params, out.read_bytes()).reward)
    return min(rewards)


# -- finance ------------------------------------------------------------------------------------
def finance_score(task: Task, actions: list[Action]) -> float:
    from palaestra.envs.finance.family import variant_of
    from palaestra.verifiers import finance as vf

    numbers = _finance_numbers(task)
    gold = vf.Gold.from_json(task.private["gold"])
    try:
        answer = vf.Answer.model_validate(actions[-1].arguments)
    except ValueError:
        return 0.0
    question = str(task.public.get("question", ""))
    return vf.grade(answer, gold, numbers, variant_of(task, gold), question).reward


def _finance_numbers(task: Task) -> Any:
    from palaestra.envs.finance.family import FinanceFamily

    family = _FAMILIES.setdefault("finance", FinanceFamily())
    return family._numbers(task)


_FAMILIES: dict[str, Any] = {}


# -- reasoning ----------------------------------------------------------------------------------
def reasoning_score(task: Task, actions: list[Action]) -> float:
    from palaestra.envs.reasoning.family import score_task

    return score_task(task, actions[-1].arguments.get("answer"))[0]


FAMILIES: dict[str, tuple[str, str, Scorer]] = {
    "cad": ("cad", "palaestra.envs.cad.family:CadFamily", cad_score),
    "finance": ("finance", "palaestra.envs.finance.family:FinanceFamily", finance_score),
    "reasoning": (
        "reasoning-gym",
        "palaestra.envs.reasoning.family:ReasoningFamily",
        reasoning_score,
    ),
}


def _table(rewards: dict[str, list[tuple[float, str]]]) -> dict[str, dict[str, Any]]:
    table = {}
    for name, got in rewards.items():
        values = [r for r, _ in got]
        top = max(got)
        table[name] = {
            "max": round(top[0], 4),
            "mean": round(statistics.fmean(values), 4),
            "n": len(values),
            "max_task": top[1],
            "over_0.1": sum(v > 0.1 for v in values),
        }
    return table


def measure(
    family_name: str,
    per_domain: int,
    split: str,
    pack: str | None = None,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """Every cheat (or those in `only`, and the oracle) on `per_domain` tasks a domain."""
    import importlib

    pack_dir, path, score = FAMILIES[family_name]
    pack_dir = pack or pack_dir
    module, cls = path.split(":")
    family = _FAMILIES.setdefault(family_name, getattr(importlib.import_module(module), cls)())
    rewards: dict[str, list[tuple[float, str]]] = {}
    by_domain: dict[str, dict[str, list[tuple[float, str]]]] = {}
    for task in tasks_by_domain(pack_dir, per_domain, split):
        plays = [("oracle", family.oracle(task)), *family.cheats(task)]
        for name, actions in plays:
            if only and name != "oracle" and name not in only:
                continue
            got = (score(task, actions), task.id)
            rewards.setdefault(name, []).append(got)
            by_domain.setdefault(task.domain, {}).setdefault(name, []).append(got)
    table = _table(rewards)
    cheats = {k: v for k, v in table.items() if k != "oracle"}
    worst = max(cheats, key=lambda k: (cheats[k]["max"], cheats[k]["mean"]))
    return {
        "family": family_name,
        "pack": pack_dir,
        "per_domain": per_domain,
        "cheats": table,
        "by_domain": {d: _table(r) for d, r in sorted(by_domain.items())},
        "worst": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--per-domain", type=int, default=2)
    parser.add_argument("--split", default="train")
    parser.add_argument("--pack", help="another pack directory of the family (an import)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cheats", help="comma-separated cheat names to play (default all)")
    parser.add_argument(
        "--by-domain", action="store_true", help="also print each domain's worst cheat"
    )
    args = parser.parse_args()
    only = set(args.cheats.split(",")) if args.cheats else None
    result = measure(args.family, args.per_domain, args.split, args.pack, only)
    if args.by_domain:
        print(f"{'domain':22} {'worst cheat':18} {'max':>7} {'mean':>7}  oracle")
        for domain, table in result["by_domain"].items():
            cheats = {k: v for k, v in table.items() if k != "oracle"}
            w = max(cheats, key=lambda k: (cheats[k]["max"], cheats[k]["mean"]))
            mean_all = statistics.fmean(v["mean"] for v in cheats.values())
            oracle = table.get("oracle", {}).get("mean", float("nan"))
            print(
                f"{domain:22} {w:18} {cheats[w]['max']:7.4f} {cheats[w]['mean']:7.4f}"
                f"  (all cheats' mean {mean_all:.4f}; oracle mean {oracle})"
            )
    print(f"{'cheat':28} {'max':>7} {'mean':>7} {'>0.1':>5} {'n':>5}  task of max")
    for name, row in sorted(result["cheats"].items(), key=lambda kv: -kv[1]["max"]):
        print(
            f"{name:28} {row['max']:7.4f} {row['mean']:7.4f} {row['over_0.1']:5d} {row['n']:5d}"
            f"  {row['max_task']}"
        )
    w = result["worst"]
    print(f"worst cheat: {w} max {result['cheats'][w]['max']} mean {result['cheats'][w]['mean']}")
    line = json.dumps(result, sort_keys=True)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
