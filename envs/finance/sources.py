"""FinQA and TAT-QA entries as finance tasks, one question at a time.

FinQA (Chen et al., 2021): `{id, pre_text, post_text, table, qa: {question, program,
exe_ans}}`. The gold answer is the gold program's result as FinQA's evaluator computes it
(`finqa_exec`): a number (5 decimals, FinQA's execution accuracy) or, for `greater`, yes/no
(answered 1 or 0). TAT-QA (Zhu et al., 2021): `{table: {table}, paragraphs, questions:
[{uid, question, answer, derivation, answer_type, scale}]}`. An arithmetic question's gold is
its answer with its scale, to 2 decimals (TAT-QA's metric rounds to 2), and its program the
derivation's reading that reproduces it (`derivation`); spans, lists and counts are text
answers (`verifiers/finance_text.py`; a count is answered with the items counted).

Every numeric question is imported only if the verifier accepts its own gold answer on the
document as typeset (the oracle passes): a program literal that is not printed becomes
FinQA's constant of that value (`divide(#0, 3)` → `const_3`) or the question is skipped.
A gold program whose result does not depend on the document (`(0 - x) / x`) is skipped:
any program would pass its check. A skipped question raises `Skip` with its cause; nothing
else in the file is lost.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from palaestra.envs.finance import derivation as dv
from palaestra.envs.finance import finqa_exec
from palaestra.envs.finance.imported import imported_numbers
from palaestra.verifiers import finance as vf
from palaestra.verifiers import finance_program as fp
from palaestra.verifiers import finance_text as ft

FINQA_DECIMALS = 5  # FinQA's evaluator rounds to 5 decimals and compares exactly
TATQA_DECIMALS = 2  # TAT-QA's metric rounds numbers to 2 decimals
_TAT_SCALE: dict[str, tuple[vf.Kind, vf.Scale, float]] = {
    "": ("ratio", "units", 1.0),
    "thousand": ("money", "thousands", 1e3),
    "million": ("money", "millions", 1e6),
    "billion": ("money", "billions", 1e9),
    "percent": ("percent", "units", 0.01),
}
_CONSTANT_OF = {value: name for name, value in fp.CONSTANTS.items()}


class Skip(ValueError):
    """This question cannot be imported; the message says why."""


def task_id(raw: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-")


def _instruction(question: str, how: str) -> str:
    return (
        f"Read the document (a table and its text) with the tools.\n\nQuestion: {question}\n\n{how}"
    )


def _numeric(decimals: int) -> str:
    """How a numeric answer is given and checked: the unit is not stated, so every unit but
    percent is the number itself (verifiers/finance.py, `Gold.unit_stated`)."""
    return (
        "Submit {value, unit, scale, program}: the value in the unit and scale you declare "
        "(percent: 12.5 means 12.5%; any other unit, currency or ratio alike, is the number "
        f"itself), checked at {decimals} decimals, and the FinQA-style program over numbers "
        "printed in the document that computes it."
    )


_YES_NO = (
    "This is a yes/no question: submit {value: 1 for yes or 0 for no, unit: ratio, program} "
    "with a program whose last step is greater(a, b) comparing the document's quantities."
)
_TEXT = (
    "Submit_text {answers, scale}: the answer as printed in the document (a list for several "
    "items), and its scale (thousand, million, billion, percent) if it is a number with one."
)
_COUNT = (
    "This asks for a count: submit_text {answers} listing the items counted, as printed in "
    "the document (the count is their number)."
)


def _task(
    tid: str, question: str, how: str, doc: tuple[list[list[str]], list[str], list[str]],
    gold: dict[str, Any], split: str,
) -> dict[str, Any]:  # fmt: skip
    table, pre_text, post_text = doc
    return {
        "id": tid,
        "family": "finance",
        "domain": "finance/imported",
        "split": split,
        "difficulty": "imported",
        "public": {
            "instruction": _instruction(question, how),
            "question": question,
            "table": table,
            "pre_text": pre_text,
            "post_text": post_text,
        },
        "private": {"document": {"kind": "imported"}, "gold": gold},
    }


def _table(raw: object) -> list[list[str]]:
    if not isinstance(raw, list) or not all(isinstance(r, list) for r in raw):
        raise Skip("the table is not a list of rows")
    return [[str(c) for c in row] for row in raw]


def _paragraphs(raw: object) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        raise Skip("the text is not a list of paragraphs")
    return [str(p) for p in raw]


def grounded_program(program: str, numbers: vf.Numbers) -> str:
    """The program with each literal that is not printed written as the constant of its value
    (FinQA writes a count or a unit conversion as a number); unchanged otherwise."""
    parsed = fp.parse(program)
    if parsed.steps[0].op == "lookup":
        return program
    steps = []
    for step in parsed.steps:
        args = []
        for arg in step.args:
            lit = arg.literal
            if (
                lit is not None
                and not lit.percent
                and numbers.key_of(lit.magnitude) is None
                and lit.value in _CONSTANT_OF
            ):
                args.append(_CONSTANT_OF[lit.value])
            else:
                args.append(arg.text)
        steps.append(f"{step.op}({', '.join(args)})")
    return ", ".join(steps)


CONSTANT = (
    "the gold program's result does not depend on the document's numbers (x - x, "
    "(0 - x) / x), so no program for it can be checked"
)


def _constant(gold: vf.Gold, numbers: vf.Numbers) -> bool:
    """Whether the gold program gives the same result whatever the document's numbers
    (`(0 - x) / x`): its answer is well defined, but no program for it can be checked."""
    if gold.yes_no:  # the comparison's sides are checked instead
        return False
    try:
        base = vf.rerun(gold.program, numbers, numbers)
        return all(
            math.isclose(vf.rerun(gold.program, numbers, vf.perturbed(numbers, salt)), base,
                         rel_tol=1e-9, abs_tol=1e-12)
            for salt in vf.PERTURB_SALTS
        )  # fmt: skip
    except (fp.ProgramError, KeyError):
        return False


def _oracle_feedback(gold: vf.Gold, numbers: vf.Numbers, question: str) -> str | None:
    """None when the verifier accepts the gold answer and program; else its feedback."""
    answer = vf.Answer.model_validate(
        {"value": gold.asked_value, "unit": gold.unit, "scale": gold.scale,
         "program": gold.program}
    )  # fmt: skip
    graded = vf.grade(answer, gold, numbers, None, question)
    return None if graded.passed else graded.feedback


def finqa_task(entry: dict[str, Any], split: str) -> dict[str, Any]:
    """One FinQA entry (one question) as a task; raises Skip with the cause."""
    qa = entry.get("qa")
    if not isinstance(qa, dict):
        raise Skip("no qa object")
    question, program = qa.get("question"), qa.get("program")
    if not isinstance(question, str) or not question.strip():
        raise Skip("qa.question is missing")
    if not isinstance(program, str) or not program.strip():
        raise Skip("qa.program is missing")
    doc = (_table(entry.get("table")), _paragraphs(entry.get("pre_text")),
           _paragraphs(entry.get("post_text")))  # fmt: skip
    try:
        result = finqa_exec.execute(program, doc[0])
    except finqa_exec.InvalidProgram as exc:
        raise Skip(f"FinQA's evaluator finds the gold program invalid: {exc}") from None
    numbers = imported_numbers(*doc)
    try:
        ours = grounded_program(program, numbers)
    except fp.ProgramError as exc:
        raise Skip(f"the gold program does not parse: {exc}") from None
    yes_no = isinstance(result, str)
    value = (1.0 if result == "yes" else 0.0) if yes_no else float(result)
    decimals = 0 if yes_no else FINQA_DECIMALS
    gold = vf.Gold(kind="ratio", value=value, decimals=decimals, scale="units", program=ours,
                   unit_stated=False)  # fmt: skip
    problem = _oracle_feedback(gold, numbers, question)
    if problem is not None:
        raise Skip(f"the verifier cannot check the gold program on the document: {problem}")
    if _constant(gold, numbers):
        raise Skip(f"{CONSTANT}: {program!r}")
    tid = task_id(str(entry.get("id", ""))) or "finqa"
    how = _YES_NO if yes_no else _numeric(FINQA_DECIMALS)
    return _task(tid, question, how, doc, gold.to_json(), split)


def _tatqa_numeric(q: dict[str, Any], numbers: vf.Numbers) -> tuple[dict[str, Any], str]:
    answer, scale = q.get("answer"), str(q.get("scale") or "")
    if isinstance(answer, bool) or not isinstance(answer, int | float):
        raise Skip(f"an arithmetic answer must be a number, got {answer!r}")
    if scale not in _TAT_SCALE:
        raise Skip(f"unknown scale {scale!r}")
    kind, our_scale, factor = _TAT_SCALE[scale]
    derivation = str(q.get("derivation") or "")
    if not derivation.strip():
        raise Skip("an arithmetic question without a derivation")
    problem = "no reading"
    try:
        readings = list(dv.programs(derivation))
    except dv.DerivationError as exc:
        raise Skip(str(exc)) from None
    for _, program in readings:
        try:
            ours = grounded_program(program, numbers)
        except fp.ProgramError as exc:
            problem = f"program {program!r}: {exc}"
            continue
        gold = vf.Gold(kind=kind, value=float(answer) * factor, decimals=TATQA_DECIMALS,
                       scale=our_scale, program=ours, unit_stated=False)  # fmt: skip
        feedback = _oracle_feedback(gold, numbers, str(q.get("question", "")))
        if feedback is None:
            if _constant(gold, numbers):
                raise Skip(f"{CONSTANT}: {derivation!r}")
            return gold.to_json(), _numeric(TATQA_DECIMALS)
        problem = f"program {ours!r}: {feedback}"
    raise Skip(f"no reading of the derivation {derivation!r} reproduces {answer}: {problem}")


def _tatqa_text(q: dict[str, Any]) -> tuple[dict[str, Any], str]:
    answer, kind = q.get("answer"), q.get("answer_type")
    scale = str(q.get("scale") or "")
    if scale not in ft.SCALES:
        raise Skip(f"unknown scale {scale!r}")
    if kind == "count":
        items = [s.strip() for s in str(q.get("derivation") or "").split("##") if s.strip()]
        try:
            count = int(str(answer))
        except ValueError:
            raise Skip(f"a count must be a whole number, got {answer!r}") from None
        if len(items) != count:
            raise Skip(f"the derivation lists {len(items)} items, the answer counts {count}")
        answers, how = items, _COUNT
    else:
        if (
            not isinstance(answer, list)
            or not answer
            or not all(isinstance(a, str) for a in answer)
        ):
            raise Skip(f"a {kind} answer must be a list of texts, got {answer!r}")
        if not any(a.strip() for a in answer):
            raise Skip("the answer is empty")
        answers, how = answer, _TEXT
    gold = {"kind": "text", "answer_type": kind, "answers": answers, "scale": scale}
    return gold, how


def tatqa_tasks(entry: dict[str, Any], split: str) -> Iterator[tuple[str, dict[str, Any] | Skip]]:
    """(question id, task or the Skip that says why not) for each question of a TAT-QA table."""
    questions = entry.get("questions")
    if not isinstance(questions, list):
        raise Skip("questions is not a list")
    try:
        table = _table((entry.get("table") or {}).get("table"))
        paragraphs = sorted(entry.get("paragraphs") or [], key=lambda p: p.get("order", 0))
        doc: tuple[list[list[str]], list[str], list[str]] = (
            table, [str(p.get("text", "")) for p in paragraphs], []
        )  # fmt: skip
    except (Skip, AttributeError, TypeError) as exc:
        raise Skip(f"the table or its paragraphs are malformed: {exc}") from None
    numbers = imported_numbers(*doc)
    for i, q in enumerate(questions):
        tid = task_id(str(q.get("uid", ""))) if isinstance(q, dict) else ""
        tid = tid or f"question-{i}"
        try:
            if not isinstance(q, dict):
                raise Skip("the question is not an object")
            question = q.get("question")
            if not isinstance(question, str) or not question.strip():
                raise Skip("the question text is missing")
            kind = q.get("answer_type")
            if kind == "arithmetic":
                gold, how = _tatqa_numeric(q, numbers)
            elif kind in ("span", "multi-span", "count"):
                gold, how = _tatqa_text(q)
            else:
                raise Skip(f"unknown answer_type {kind!r}")
            yield tid, _task(tid, question, how, doc, gold, split)
        except Skip as exc:
            yield tid, exc
