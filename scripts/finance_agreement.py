"""Figures for the FinQA / TAT-QA importers: over a full data file, how many questions import,
why the others do not, and how often our gold answers agree with the official evaluators.

    .venv/bin/python scripts/finance_agreement.py --tatqa FILE.json [--finqa FILE.json]
        [--tatqa-repo GITDIR] [--finqa-repo GITDIR]

The official evaluators are the peers' own code (FinQA's code/evaluate/evaluate.py, TAT-QA's
tatqa_metric.py), taken from the fetched repositories (bare git dirs; defaults: the mirror
under /work/.mirror) and run in their own venv (scripts/finance-peer-venv.sh) through
scripts/finance_peer_eval.py. FinQA: their `eval_program` of each imported gold program
against our gold answer (equal at 5 decimals, or the same yes/no). TAT-QA: their metric's
exact match of (a) the answer our oracle submits and (b) our gold program's own result, in
the question's unit and scale, against the question's gold answer. Then, on every imported
question, what `pack check` plays: the oracle (1), the null attempt (0) and every cheat.
And the answers a model gives, judged by our verifier and by the benchmark's own rule
(FinQA: `round(v, 5)` equal to the gold; TAT-QA: its metric's exact match): the gold
program's unrounded result declared `currency` or `ratio` (`percent` for a percentage), the
benchmark's own rounding of the gold, a value 0.4 of the last decimal from it (still the gold
at that rounding, on the far side from the program's result), and a slightly wrong value
(one unit of the last decimal off; 0.01 % off above 10^6) — the share where the verdicts
agree.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from palaestra.envs.finance.family import FinanceFamily, FinancePublic
from palaestra.envs.finance.imported import imported_numbers
from palaestra.envs.finance.importer import convert, import_file
from palaestra.envs.finance.sources import task_id
from palaestra.sdk.models import Action
from palaestra.sdk.packwriter import ImportReport
from palaestra.sdk.task import Task
from palaestra.server.packs.loader import load_pack
from palaestra.verifiers import finance as vf
from palaestra.verifiers import finance_text as ft

HERE = Path(__file__).resolve().parent
MIRROR = Path("/work/.mirror")
CHEAT_MAX = 0.1  # `pack check`'s default checks.cheat_max_reward
_OUR_TO_TAT = {"units": "", "thousands": "thousand", "millions": "million", "billions": "billion"}


def checkout(git_dir: Path, paths: list[str], into: Path) -> Path:
    data = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "HEAD", *paths],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def peer(which: str, repo: Path, cases: list[dict[str, Any]]) -> list[Any]:
    python = subprocess.run(
        ["bash", str(HERE / "finance-peer-venv.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    run = subprocess.run(
        [python, str(HERE / "finance_peer_eval.py"), which, str(repo)],
        input=json.dumps(cases), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return list(json.loads(run.stdout))


def cause(reason: str) -> str:
    """A skip reason without its particulars (numbers, quoted text)."""
    text = re.sub(r"(?<![A-Za-z])'[^']*'|\"[^\"]*\"", "…", reason.split(": ")[0])
    return re.sub(r"-?\d[\d.,]*", "N", text)[:100]


def summary(name: str, entries: list[Any], questions: int) -> tuple[ImportReport, dict[str, Any]]:
    report = ImportReport(format="finqa", source=name, out="")
    tasks = {t["id"]: t for t in convert(entries, "train", report)}
    causes = collections.Counter(cause(r[0]) for r in report.skipped.values())
    print(f"{name}: {questions} questions, {len(tasks)} imported, {len(report.skipped)} skipped")
    for text, n in causes.most_common():
        print(f"  skipped {n}: {text}")
    return report, tasks


def _play(task: Task, family: FinanceFamily, action: Action) -> float:
    """An attempt's reward as the family's verifier gives it (the document's numbers from the
    task's table and text, as at episode time; no PDF is typeset)."""
    gold = task.private["gold"]
    public = FinancePublic.of(task)
    if gold.get("kind") == "text":
        if action.tool != "submit_text":
            return 0.0
        return ft.grade(ft.TextAnswer(**action.arguments), gold).reward
    if action.tool != "submit":
        return 0.0
    numbers = imported_numbers(*public.imported())
    answer = vf.Answer(**action.arguments)
    return vf.grade(answer, vf.Gold.from_json(gold), numbers, None, public.question).reward


def reference_plays(path: Path, work: Path) -> None:
    """Oracle, null and every cheat on every imported question (what `pack check` plays)."""
    out = work / f"pack-{path.stem}"
    import_file(path, out, "figures/finance", force=True)
    family = FinanceFamily()
    tasks = list(load_pack(out).tasks.values())
    oracle = sum(_play(t, family, family.oracle(t)[0]) == 1.0 for t in tasks)
    null = sum(_play(t, family, family.null(t)[0]) == 0.0 for t in tasks)
    worst: dict[str, float] = {}
    for task in tasks:
        for name, actions in family.cheats(task):
            worst[name] = max(worst.get(name, 0.0), _play(task, family, actions[0]))
    share("oracle 1", oracle, len(tasks))
    share("null 0", null, len(tasks))
    over = {n: r for n, r in worst.items() if r > CHEAT_MAX}
    print(f"  cheats: worst {max(worst.values(), default=0):.2f} over {len(worst)} kinds; "
          f"over {CHEAT_MAX}: {over or 'none'}")  # fmt: skip


def _forms(gold: vf.Gold, numbers: vf.Numbers) -> list[tuple[str, str, float]]:
    """(form, unit, value in the asked unit and scale) of the answers a model gives."""
    result = _program_result(gold, numbers)
    asked = round(gold.asked_value, gold.decimals)
    step = 10.0**-gold.decimals
    off = max(step, abs(asked) * 1e-4 if abs(asked) > 1e6 else 0.0)
    # Still the gold at the benchmark's rounding, on the far side from the program's result.
    edge = asked + (0.4 * step if result <= asked else -0.4 * step)
    units = ["percent"] if gold.unit == "percent" else ["currency", "ratio"]
    return [
        *((f"unrounded-{u}", u, result) for u in units),
        ("rounded", units[0], asked),
        ("edge-of-rounding", units[-1], edge),
        ("slightly-wrong", units[0], asked + off),
    ]


def play_forms(gold: vf.Gold, numbers: vf.Numbers, question: str) -> list[tuple[str, float, bool]]:
    """Each form's value and whether our verifier passes it (with the gold program)."""
    out = []
    for form, unit, value in _forms(gold, numbers):
        answer = vf.Answer.model_validate(
            {"value": value, "unit": unit, "scale": gold.scale, "program": gold.program}
        )
        out.append((form, value, vf.grade(answer, gold, numbers, None, question).passed))
    return out


def agreement(label: str, ours: list[tuple[str, bool]], theirs: list[bool]) -> None:
    """How often our verdict on each form is the benchmark's own."""
    by_form: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for (form, passed), official in zip(ours, theirs, strict=True):
        by_form[form][0] += passed == bool(official)
        by_form[form][1] += 1
    for form, (hits, total) in by_form.items():
        share(f"{label} {form}: verdict agrees with the benchmark's", hits, total)


def share(label: str, hits: int, total: int) -> None:
    print(f"  {label}: {hits}/{total} = {100 * hits / max(total, 1):.2f} %")


def finqa(path: Path, repo: Path, work: Path) -> None:
    entries = json.loads(path.read_text(encoding="utf-8"))
    _, tasks = summary(path.name, entries, len(entries))
    cases, ours = [], []
    for entry in entries:
        task = tasks.get(task_id(str(entry.get("id", ""))))
        if task is not None:
            cases.append({"program": entry["qa"]["program"], "table": entry["table"]})
            gold = vf.Gold.from_json(task["private"]["gold"])
            ours.append(("yes" if gold.value else "no") if gold.yes_no else round(gold.value, 5))
    theirs = peer("finqa", checkout(repo, ["code/evaluate/evaluate.py"], work / "finqa"), cases)
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True))
    share("gold agrees with FinQA's eval_program", agree, len(cases))
    verdicts: list[tuple[str, bool]] = []
    official: list[bool] = []
    for task in tasks.values():
        gold = vf.Gold.from_json(task["private"]["gold"])
        if gold.yes_no:
            continue
        public = task["public"]
        numbers = imported_numbers(public["table"], public["pre_text"], public["post_text"])
        for form, value, passed in play_forms(gold, numbers, public["question"]):
            verdicts.append((form, passed))
            official.append(round(value, 5) == gold.value)  # FinQA's rule
    agreement("answer", verdicts, official)
    reference_plays(path, work)


def _program_result(gold: vf.Gold, numbers: vf.Numbers) -> float:
    """Our gold program's own result in the question's unit and scale."""
    result = vf.rerun(gold.program, numbers, numbers)
    for factor in (1.0, 0.01, 1e3, 1e6, 1e9, 1e-3, 1e-6):
        if abs(result * factor - gold.value) <= gold.tolerance():
            return vf.to_unit(result * factor, gold.unit, gold.scale)
    return vf.to_unit(result, gold.unit, gold.scale)


def tatqa(path: Path, repo: Path, work: Path) -> None:
    entries = json.loads(path.read_text(encoding="utf-8"))
    questions = [q for e in entries for q in e.get("questions", [])]
    _, tasks = summary(path.name, entries, len(questions))
    oracle, program, forms = [], [], []
    verdicts: list[tuple[str, bool]] = []
    for q in questions:
        task = tasks.get(task_id(str(q.get("uid", ""))))
        if task is None:
            continue
        gold_json = task["private"]["gold"]
        if gold_json["kind"] == "text":
            # A count's oracle lists the items; TAT-QA's gold is their number.
            answers = gold_json["answers"]
            said = [str(len(answers))] if gold_json["answer_type"] == "count" else answers
            oracle.append({"question": q, "prediction": said, "scale": gold_json["scale"]})
            continue
        gold = vf.Gold.from_json(gold_json)
        scale = "percent" if gold.unit == "percent" else _OUR_TO_TAT[gold.scale]
        oracle.append({"question": q, "prediction": f"{gold.asked_value:.15g}", "scale": scale})
        public = task["public"]
        numbers = imported_numbers(public["table"], public["pre_text"], public["post_text"])
        result = _program_result(gold, numbers)
        program.append({"question": q, "prediction": f"{result:.15g}", "scale": scale})
        for form, value, passed in play_forms(gold, numbers, public["question"]):
            verdicts.append((form, passed))
            forms.append({"question": q, "prediction": f"{value:.15g}", "scale": scale})
    tat = checkout(repo, ["tatqa_metric.py", "tatqa_utils.py"], work / "tatqa")
    share("oracle answer, TAT-QA exact match", int(sum(peer("tatqa", tat, oracle))), len(oracle))
    share("arithmetic: gold program's result, TAT-QA exact match",
          int(sum(peer("tatqa", tat, program))), len(program))  # fmt: skip
    agreement("answer", verdicts, peer("tatqa", tat, forms))
    reference_plays(path, work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finqa", type=Path, action="append", default=[])
    parser.add_argument("--tatqa", type=Path, action="append", default=[])
    parser.add_argument("--finqa-repo", type=Path, default=MIRROR / "czyssrs+FinQA" / "repo")
    parser.add_argument("--tatqa-repo", type=Path, default=MIRROR / "NExTplusplus+TAT-QA" / "repo")
    args = parser.parse_args()
    if not args.finqa and not args.tatqa:
        parser.error("give --finqa FILE and/or --tatqa FILE")
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.finqa:
            finqa(path, args.finqa_repo, Path(tmp))
        for path in args.tatqa:
            tatqa(path, args.tatqa_repo, Path(tmp))
    sys.exit(0)


if __name__ == "__main__":
    main()
