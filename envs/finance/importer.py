"""FinQA/TAT-QA-style JSON as a pack of `finance` tasks (`palaestra pack import finqa`).

FinQA (Chen et al., 2021) entries: `{id, pre_text: [..], post_text: [..], table: [[..]],
qa: {question, program, exe_ans, answer}}`. TAT-QA (Zhu et al., 2021) entries: `{table:
{uid, table: [[..]]}, paragraphs: [{uid, order, text}], questions: [{uid, question, answer,
derivation, answer_type, scale}]}`; its arithmetic questions are imported, their infix
`derivation` ("(5,829 - 5,735) / 5,735") turned into a FinQA program. The pack written to
OUT has pack.toml and tasks.jsonl (compact form); each task's document is typeset from its
table and text by the finance family (envs/finance/imported.py).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from palaestra.sdk.packwriter import write_jsonl, write_manifest
from palaestra.verifiers import finance_program as fp

_OPS = {
    ast.Add: "add",
    ast.Sub: "subtract",
    ast.Mult: "multiply",
    ast.Div: "divide",
    ast.Pow: "exp",
}


class ImportProblem(ValueError):
    """An entry (or the whole file) cannot be imported; the message says why."""


def derivation_program(derivation: str) -> str:
    """An infix arithmetic derivation as a FinQA program (numbers as written, no commas)."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", derivation).replace("%", "").replace("$", "")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ImportProblem(f"derivation {derivation!r} is not arithmetic") from None
    steps: list[str] = []

    def walk(node: ast.expr) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            if node.value in (100, 1000, 1000000):  # a unit conversion, not a figure
                return f"const_{int(node.value)}"
            return f"{node.value}"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return inner[1:] if inner.startswith("-") else f"-{inner}"
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            steps.append(f"{_OPS[type(node.op)]}({left}, {right})")
            return f"#{len(steps) - 1}"
        raise ImportProblem(f"derivation {derivation!r} has an unsupported part")

    last = walk(tree)
    return ", ".join(steps) if steps else last


def _decimals(answer: str) -> int:
    match = re.search(r"\.(\d+)", answer)
    return len(match.group(1)) if match else 0


def _gold(kind: str, value: float, decimals: int, scale: str, program: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "value": value,
        "decimals": decimals,
        "scale": scale,
        "program": program,
        "keys_program": "",
        "factor": 1.0,
    }


def _instruction(question: str, kind: str) -> str:
    unit = (
        "Answer in percent"
        if kind == "percent"
        else "Answer as the number in the document's units (unit ratio)"
    )
    return (
        f"Read the document (a table and its text) with the tools.\n\nQuestion: {question}\n\n"
        f"{unit}. Submit {{value, unit, scale, program}}: the program is FinQA-style over "
        "numbers printed in the document."
    )


def finqa_task(entry: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    qa = entry.get("qa") or {}
    question, program = str(qa.get("question", "")), str(qa.get("program", ""))
    if not question or not program or "exe_ans" not in qa:
        raise ImportProblem("needs qa.question, qa.program and qa.exe_ans")
    fp.parse(program)
    answer = str(qa.get("answer", ""))
    value = float(qa["exe_ans"])
    percent = answer.strip().endswith("%")
    kind = "percent" if percent else "ratio"
    decimals = _decimals(answer) if answer else 2
    if not percent:
        decimals = max(decimals, 2) if abs(value) < 100 else decimals
    task_id = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(entry.get("id", f"finqa-{index}"))).strip("-")
    public = {
        "instruction": _instruction(question, kind),
        "question": question,
        "table": entry.get("table") or entry.get("table_ori") or [],
        "pre_text": entry.get("pre_text") or [],
        "post_text": entry.get("post_text") or [],
    }
    return {
        "id": task_id or f"finqa-{index}",
        "family": "finance",
        "domain": "finance/imported",
        "split": split,
        "difficulty": "imported",
        "public": public,
        "private": {
            "document": {"kind": "imported"},
            "gold": _gold(kind, value, decimals, "units", program),
        },
    }


_TAT_SCALE = {
    "": ("ratio", "units", 1.0),
    "thousand": ("money", "thousands", 1e3),
    "million": ("money", "millions", 1e6),
    "billion": ("money", "billions", 1e9),
    "percent": ("percent", "units", 0.01),
}


def tatqa_tasks(entry: dict[str, Any], index: int, split: str) -> list[dict[str, Any]]:
    table = (entry.get("table") or {}).get("table") or []
    paragraphs = sorted(entry.get("paragraphs") or [], key=lambda p: p.get("order", 0))
    tasks = []
    for q in entry.get("questions") or []:
        if q.get("answer_type") != "arithmetic" or not q.get("derivation"):
            continue
        program = derivation_program(str(q["derivation"]))
        fp.parse(program)
        kind, scale, factor = _TAT_SCALE.get(str(q.get("scale", "")), _TAT_SCALE[""])
        value = float(q["answer"])
        decimals = _decimals(str(q["answer"])) or 2
        public = {
            "instruction": _instruction(str(q["question"]), kind),
            "question": str(q["question"]),
            "table": table,
            "pre_text": [str(p.get("text", "")) for p in paragraphs],
            "post_text": [],
        }
        gold = _gold(kind, value * factor, decimals, scale, program)
        tasks.append(
            {
                "id": re.sub(r"[^A-Za-z0-9_.-]+", "-", str(q.get("uid", f"tatqa-{index}"))),
                "family": "finance",
                "domain": "finance/imported",
                "split": split,
                "difficulty": "imported",
                "public": public,
                "private": {"document": {"kind": "imported"}, "gold": gold},
            }
        )
    return tasks


def import_file(source: Path, out: Path, name: str, split: str) -> tuple[int, list[str]]:
    """Write a pack from FinQA or TAT-QA JSON; (tasks written, problems skipped)."""
    data = json.loads(source.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ImportProblem(f"{source}: expected a JSON list of entries")
    tasks: list[dict[str, Any]] = []
    problems: list[str] = []
    for i, entry in enumerate(data):
        try:
            if isinstance(entry, dict) and "questions" in entry:
                tasks.extend(tatqa_tasks(entry, i, split))
            elif isinstance(entry, dict):
                tasks.append(finqa_task(entry, i, split))
            else:
                raise ImportProblem("not an object")
        except (ImportProblem, fp.ProgramError, ValueError, TypeError) as exc:
            problems.append(f"entry {i}: {exc}")
    if not tasks:
        raise ImportProblem(f"{source}: no importable entries ({'; '.join(problems[:3])})")
    seen: set[str] = set()
    for task in tasks:
        base, k = task["id"], 1
        while task["id"] in seen:
            k += 1
            task["id"] = f"{base}-{k}"
        seen.add(task["id"])
    manifest = {
        "name": name,
        "version": "1.0.0",
        "description": f"Imported from {source.name} (FinQA/TAT-QA format)",
        "families": ["finance"],
        "splits": {split: {"sealed": False}},
    }
    write_manifest(out, manifest)
    write_jsonl(out, tasks)
    return len(tasks), problems
