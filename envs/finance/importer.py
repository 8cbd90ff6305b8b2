"""`palaestra pack import finqa FILE OUT`: a FinQA or TAT-QA JSON file as a finance pack.

The file is a JSON list of FinQA entries (one question each) or TAT-QA entries (a table with
its questions); envs/finance/sources.py turns each question into a task. A question that
cannot be imported is named in OUT/import-report.json with its cause, as the terminal
importers write it; the rest of its table and of the file import. A file that is not such a
list is refused with the cause. OUT must be new or empty; `force` replaces it, atomically
(the pack is written beside it and renamed over it, so a failed import leaves OUT as it was).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from palaestra.envs.finance.sources import Skip, finqa_task, tatqa_tasks
from palaestra.sdk.packwriter import ImportReport, write_jsonl, write_manifest, write_report


class ImportProblem(ValueError):
    """The whole file cannot be imported (or OUT is taken); the message says why."""


def _entries(source: Path) -> list[Any]:
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ImportProblem(f"{source}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ImportProblem(f"{source}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ImportProblem(
            f"{source}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, list):
        raise ImportProblem(
            f"{source}: expected a JSON list of FinQA or TAT-QA entries, got {type(data).__name__}"
        )
    return data


def convert(entries: list[Any], split: str, report: ImportReport) -> list[dict[str, Any]]:
    """Every importable question as a task; each other one goes to `report.skipped`."""
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(tid: str, task: dict[str, Any] | Skip) -> None:
        if isinstance(task, Skip):
            report.skipped.setdefault(tid, []).append(str(task))
            return
        base, k = task["id"], 1
        while task["id"] in seen:
            k += 1
            task["id"] = f"{base}-{k}"
        seen.add(task["id"])
        tasks.append(task)
        notes = [] if task["id"] == base else [f"renamed from the duplicate id {base!r}"]
        report.imported[task["id"]] = notes

    for i, entry in enumerate(entries):
        where = f"entry-{i}"
        if not isinstance(entry, dict):
            add(where, Skip(f"entry {i} is a {type(entry).__name__}, not an object"))
        elif "questions" in entry:
            try:
                for tid, task in tatqa_tasks(entry, split):
                    add(tid, task)
            except Skip as exc:
                uid = (
                    (entry.get("table") or {}).get("uid")
                    if isinstance(entry.get("table"), dict)
                    else None
                )
                add(str(uid or where), Skip(f"entry {i}: {exc}"))
        else:
            tid = str(entry.get("id") or where)
            try:
                add(tid, finqa_task(entry, split))
            except Skip as exc:
                add(tid, exc)
    return tasks


def _write(
    out: Path, manifest: dict[str, Any], tasks: list[dict[str, Any]], report: ImportReport
) -> None:
    write_manifest(out, manifest)
    write_jsonl(out, tasks)
    write_report(out, report)


def import_file(
    source: Path, out: Path, name: str, split: str = "train", *, force: bool = False
) -> ImportReport:
    """Write a pack from FinQA or TAT-QA JSON (see the module doc)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ImportProblem(f"{out} exists and is not empty; choose a new folder or --force")
    entries = _entries(source)
    report = ImportReport(format="finqa", source=str(source), out=str(out))
    tasks = convert(entries, split, report)
    if not tasks:
        causes = "; ".join(f"{k}: {v[0]}" for k, v in list(report.skipped.items())[:3])
        raise ImportProblem(f"{source}: no importable question ({causes or 'the list is empty'})")
    manifest = {
        "name": name,
        "version": "1.0.0",
        "description": f"Imported from {source.name} (FinQA/TAT-QA format)",
        "families": ["finance"],
        "splits": {split: {"sealed": False}},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.import-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _write(staging, manifest, tasks, report)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(staging, out)
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        else:
            os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report
