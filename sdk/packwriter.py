"""Writing task packs in the forms the server loads (DESIGN §6): pack.toml, tasks.jsonl and
tasks/<id>/ folders.

For importers and authors' scripts that produce packs; the server validates what they
write when it loads the pack, and `palaestra pack check` proves it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.sdk.blobs import BLOBS_DIR, sha256_file

REPORT_FILE = "import-report.json"


@dataclass
class ImportReport:
    """What an importer did with each task or question: imported (with notes) or skipped
    (with the reasons); written as OUT/import-report.json (`write_report`)."""

    format: str
    source: str
    out: str
    imported: dict[str, list[str]] = field(default_factory=dict)  # id -> notes
    skipped: dict[str, list[str]] = field(default_factory=dict)  # id -> reasons

    def as_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "source": self.source,
            "imported": [{"id": k, "notes": v} for k, v in sorted(self.imported.items())],
            "skipped": [{"id": k, "reasons": v} for k, v in sorted(self.skipped.items())],
        }


def write_report(out: Path, report: ImportReport) -> Path:
    """Write `out/import-report.json`."""
    path = out / REPORT_FILE
    path.write_text(json.dumps(report.as_json(), indent=2, ensure_ascii=False) + "\n", "utf-8")
    return path


def toml_value(value: Any) -> str:
    """`value` as a TOML value (tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def toml_text(data: Mapping[str, Any]) -> str:
    """A small TOML writer: top-level scalars, then one level of tables (deeper ones inline)."""
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    for key, table in data.items():
        if isinstance(table, Mapping):
            lines.append(f"\n[{key}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_manifest(out: Path, manifest: Mapping[str, Any]) -> Path:
    """Write `out/pack.toml` from its keys (docs/writing-a-pack.md)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pack.toml"
    path.write_text(toml_text(manifest), encoding="utf-8")
    return path


def write_jsonl(out: Path, tasks: Iterable[Mapping[str, Any]]) -> Path:
    """Write the compact form, `out/tasks.jsonl`: one task dict a line."""
    path = out / "tasks.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task, ensure_ascii=False) + "\n")
    return path


def write_files(base: Path, files: Mapping[str, str]) -> None:
    """A file map `{relative path: text}` under `base`."""
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def write_blobs(out: Path, files: Mapping[str, Path]) -> dict[str, str]:
    """Binary files as the pack's blobs, `out/blobs/<sha256>` (one copy of each content,
    server/packs/blobs.py): `{key: "sha256:<hex>"}` for each key of `files`."""
    refs: dict[str, str] = {}
    for key, source in files.items():
        ref = sha256_file(source)  # a MiB at a time, as the copy below
        path = out / BLOBS_DIR / ref.removeprefix("sha256:")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, path)
        refs[key] = ref
    return refs


def write_task_folder(
    tasks_dir: Path,
    task_id: str,
    task: Mapping[str, Any],
    instruction: str,
    folders: Mapping[str, Mapping[str, str]],
) -> Path:
    """The directory form, `tasks_dir/<task_id>/`: task.toml (`task`), instruction.md, and one
    folder per file map in `folders` (environment/, assets/, verifier/, solution/)."""
    folder = tasks_dir / task_id
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text(toml_text(task), encoding="utf-8")
    (folder / "instruction.md").write_text(instruction, encoding="utf-8")
    for name, files in folders.items():
        write_files(folder / name, files)
    return folder
