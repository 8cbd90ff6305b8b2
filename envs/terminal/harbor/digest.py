"""Harbor's content digest of a task folder and its dataset.toml pins (`[[tasks]] digest`).

The digest is Harbor's `Packager.compute_content_hash`: SHA-256 over `"<path>\\0<file
sha256>\\n"` for task.toml, instruction.md, README.md, trajectory.json and every file under
environment/, tests/, solution/ and steps/, sorted by path, less Harbor's default ignores.
A folder with .gitignore or .harborignore rules is not pinned here (its selection differs).
"""

from __future__ import annotations

import fnmatch
import hashlib
import tomllib
from pathlib import Path

DATASET_FILE = "dataset.toml"
SINGLE = ("task.toml", "instruction.md", "README.md", "trajectory.json")
TREES = ("environment", "tests", "solution", "steps")
IGNORED_DIRS = {"__pycache__"}
IGNORED_NAMES = ("*.pyc", ".DS_Store", "*.swp", "*.swo", "*~")
RULE_FILES = (".gitignore", ".harborignore")


def has_ignore_rules(folder: Path) -> bool:
    return any(p.name in RULE_FILES for p in folder.rglob(".*"))


def task_files(folder: Path) -> list[str]:
    """The paths (relative, POSIX) Harbor's packager hashes."""
    files = [name for name in SINGLE if (folder / name).is_file()]
    for tree in TREES:
        root = folder / tree
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            rel = path.relative_to(folder)
            if not path.is_file() or IGNORED_DIRS & set(rel.parts[:-1]):
                continue
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in IGNORED_NAMES):
                continue
            files.append(rel.as_posix())
    return sorted(files)


def content_digest(folder: Path) -> str:
    """`sha256:<hex>` of the folder as Harbor computes it."""
    outer = hashlib.sha256()
    for rel in task_files(folder):
        inner = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
        outer.update(f"{rel}\0{inner}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def pinned_digests(src: Path) -> tuple[dict[str, str], list[str]]:
    """{task short name: digest} from `src/dataset.toml` (none: {}), and its problems."""
    path = src / DATASET_FILE
    if not path.is_file():
        return {}, []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return {}, [f"{DATASET_FILE} cannot be read: {exc}"]
    pins: dict[str, str] = {}
    tasks = data.get("tasks")
    for entry in tasks if isinstance(tasks, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            pins[entry["name"].rsplit("/", 1)[-1]] = str(entry.get("digest", ""))
    return pins, []
