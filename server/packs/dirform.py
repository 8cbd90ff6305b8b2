"""The directory form of a pack's tasks (DESIGN §6): `tasks/<id>/` folders.

`task.toml` (the task's keys, `[public]`/`[private]` tables), `instruction.md`
(-> `public.instruction`) and one folder per file map: `environment/` and `assets/`
(public), `verifier/`, `solution/` and `build/` (private). A folder's text files become
its map `{relative path: text}`; its binary files stay where they are and are named in
`<side>.blobs` by their digest (server/packs/blobs.py).
"""

from __future__ import annotations

import codecs
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from palaestra.sdk.blobs import BLOBS_FIELD, sha256_file, too_large
from palaestra.server.packs.blobs import BlobIndex
from palaestra.server.packs.lock import ignored

Found = tuple[str, dict[str, Any] | None, list[str]]  # where, the task dict or None, problems

# Directory form: the folders of tasks/<id>/ and where their file maps land.
TASK_DIRS: dict[str, tuple[str, str]] = {
    "environment": ("public", "environment"),
    "assets": ("public", "assets"),
    "verifier": ("private", "verifier"),
    "solution": ("private", "solution"),
    "build": ("private", "build"),  # a task's environment build context (terminal)
}


def _file_map(folder: Path, index: BlobIndex) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """A folder's text files, its binary files (relative path -> `sha256:<hex>`, added to
    `index` where they are: the directory form keeps them in place) and its problems."""
    files: dict[str, str] = {}
    binary: dict[str, str] = {}
    problems: list[str] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if ignored(rel) or path.is_dir():
            continue
        if path.is_symlink():
            problems.append(f"{path}: symlinks are not allowed in a pack; copy the file")
            continue
        size = path.stat().st_size
        try:
            if size > index.max_blob and not _utf8(path):  # a large binary is never held whole
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "over max_pack_blob_bytes")
            files[rel.as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            if size > index.max_blob:
                problems.append(f"{path}: {too_large('the file', size, index.max_blob)}")
                continue
            digest = sha256_file(path)
            index.add(digest.removeprefix("sha256:"), path, size)
            binary[rel.as_posix()] = digest
    return files, binary, problems


def _utf8(path: Path) -> bool:
    """Whether the file is UTF-8 text, read a MiB at a time (never whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with path.open("rb") as data:
            while chunk := data.read(1 << 20):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _dir_task(task_dir: Path, index: BlobIndex) -> Found:
    toml_path = task_dir / "task.toml"
    where = str(toml_path)
    problems: list[str] = []
    try:
        raw: dict[str, Any] = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return where, None, [f"{task_dir}: no task.toml; every tasks/<id>/ needs one"]
    except tomllib.TOMLDecodeError as exc:
        return where, None, [f"{where}: invalid TOML ({exc})"]
    raw.setdefault("id", task_dir.name)
    if raw["id"] != task_dir.name:
        problems.append(
            f"{where}: id {raw['id']!r} differs from its folder name {task_dir.name!r}; "
            "make them equal (or drop `id`)"
        )
    public = raw.setdefault("public", {})
    private = raw.setdefault("private", {})
    if not isinstance(public, dict) or not isinstance(private, dict):
        return where, None, [*problems, f"{where}: [public] and [private] must be tables"]
    instruction = task_dir / "instruction.md"
    if instruction.exists():
        if "instruction" in public:
            problems.append(
                f"{where}: public.instruction is set and instruction.md exists; keep one"
            )
        public["instruction"] = instruction.read_text(encoding="utf-8")
    for folder, (side, key) in TASK_DIRS.items():
        if not (task_dir / folder).is_dir():
            continue
        target = public if side == "public" else private
        if key in target:
            problems.append(f"{where}: {side}.{key} is set and {folder}/ exists; keep one")
            continue
        files, binary, bad = _file_map(task_dir / folder, index)
        target[key] = files
        problems.extend(bad)
        refs = target.setdefault(BLOBS_FIELD, {})
        for rel, digest in binary.items():
            if not isinstance(refs, dict) or f"{folder}/{rel}" in refs:
                problems.append(
                    f"{where}: {side}.blobs names {folder}/{rel}, which exists; keep one"
                )
                continue
            refs[f"{folder}/{rel}"] = digest
    for side_fields in (public, private):
        if side_fields.get(BLOBS_FIELD) == {}:
            del side_fields[BLOBS_FIELD]  # no binary files: the task's digest is unchanged
    for path in sorted(task_dir.iterdir()):
        if path.name.startswith(".") or path.name == "__pycache__":
            continue
        if path.name not in {"task.toml", "instruction.md", *TASK_DIRS}:
            problems.append(
                f"{path}: not part of the directory form; put it under environment/, assets/ "
                "(public) or verifier/, solution/ (private)"
            )
    return where, raw, problems


def directory_tasks(root: Path, index: BlobIndex) -> Iterator[Found]:
    for task_dir in sorted(p for p in (root / "tasks").iterdir() if not p.name.startswith(".")):
        if task_dir.name == "__pycache__":
            continue
        if not task_dir.is_dir():
            yield str(task_dir), None, [f"{task_dir}: tasks/ holds one folder per task"]
            continue
        yield _dir_task(task_dir, index)
