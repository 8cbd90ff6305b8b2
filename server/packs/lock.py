"""A pack's files, their sha256, the pack digest and `pack.lock` (DESIGN §6).

The pack digest (`files_digest`, the one place it is computed) is sha256 over the sorted
(path, sha256(bytes)) of the pack's files — pack.lock, `__pycache__` and dotfiles excluded —
so it can be recomputed from the lock; a `[source]` pack also mixes in its tasks' digests,
since its data lives outside the directory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

LOCK_FILE = "pack.lock"
LOCK_VERSION = 1


def ignored(rel: Path) -> bool:
    """Whether a path inside a pack is left out of it (dotfiles, `__pycache__`)."""
    return any(part.startswith(".") or part == "__pycache__" for part in rel.parts)


def pack_files(root: Path) -> dict[str, Path]:
    """The files a pack is made of, by relative POSIX path: no pack.lock, __pycache__, dotfiles."""
    found: dict[str, Path] = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if ignored(rel) or rel.as_posix() == LOCK_FILE or path.is_dir():
            continue
        found[rel.as_posix()] = path
    return dict(sorted(found.items()))


def file_hashes(root: Path) -> dict[str, str]:
    """`{path: "sha256:<hex>"}` for every file of the pack, sorted by path."""
    hashes = {}
    for rel, path in pack_files(root).items():
        if not path.is_symlink():
            with path.open("rb") as data:  # a file at a time, a MiB at a time: packs are large
                hashes[rel] = "sha256:" + hashlib.file_digest(data, "sha256").hexdigest()
    return hashes


def files_digest(hashes: Mapping[str, str], task_digests: Iterable[str] = ()) -> str:
    """The pack digest: sha256 over sorted (path, sha256(bytes)); the one place it is computed.

    `task_digests` (a `[source]` pack's tasks, whose data is outside the directory) are
    mixed in after the files."""
    h = hashlib.sha256()
    for rel in sorted(hashes):
        h.update(rel.encode() + b"\0")
        h.update(bytes.fromhex(hashes[rel].removeprefix("sha256:")))
    for digest in task_digests:
        h.update(digest.encode())
    return "sha256:" + h.hexdigest()


def pack_digest(root: Path) -> str:
    """The digest of a pack directory's files (what pack.lock records)."""
    return files_digest(file_hashes(root))


def lock_text(root: Path) -> str:
    """The text of `pack.lock` for the files under `root` as they are now."""
    hashes = file_hashes(root)
    body = {"lock_version": LOCK_VERSION, "digest": files_digest(hashes), "files": hashes}
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def write_lock(root: Path) -> str:
    """Write (or refresh) `pack.lock`; returns the pack digest."""
    text = lock_text(root)
    (root / LOCK_FILE).write_text(text, encoding="utf-8")
    digest: str = json.loads(text)["digest"]
    return digest


def verify_lock(root: Path, hashes: Mapping[str, str] | None = None) -> list[str]:
    """Problems with `pack.lock` (none if it is absent or right): one per file that differs."""
    path = root / LOCK_FILE
    if not path.exists():
        return []
    fix = "run `palaestra pack build` to refresh the lock if the change is intended"
    try:
        lock = json.loads(path.read_text(encoding="utf-8"))
        locked = lock["files"]
        if not isinstance(locked, dict):
            raise TypeError("files is not a table")
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{path}: not a pack lock ({exc}); {fix}"]
    hashes = file_hashes(root) if hashes is None else hashes
    problems = []
    for rel in sorted(locked.keys() | hashes.keys()):
        if rel not in hashes:
            problems.append(
                f"{path}: {rel} is locked but missing from the pack; restore it or {fix}"
            )
        elif rel not in locked:
            problems.append(f"{path}: {rel} is in the pack but not in the lock; remove it or {fix}")
        elif locked[rel] != hashes[rel]:
            problems.append(f"{path}: {rel} differs from its locked sha256; {fix}")
    if not problems and lock.get("digest") != files_digest(locked):
        problems.append(f"{path}: its digest does not match its file list; {fix}")
    return problems
