"""Binary files of a pack's tasks (blobs): content-addressed, deduplicated, size-limited.

A task's file maps (`environment`, `verifier`, …) hold text. Its binary files are named
in `public.blobs` / `private.blobs`, `{"<folder>/<path>": "sha256:<hex>"}`: the folder is
the file map the file belongs to (public: environment, assets; private: verifier,
solution, build), so a sealed task's verifier blobs are private fields like its verifier
text, and the agent gets only the `environment/` ones. The bytes live once per pack,
under `blobs/<hex>` (the name is the sha256 of the bytes: two tasks with the same file
share it), or, in the directory form, in place in the task's folder (the loader names
them by their digest). The task digest covers each blob's digest, the pack digest each
blob file, so both stay content addresses of every byte.

Checked wherever a pack is loaded (import, `pack check`, publish, start): a blob's name
is 64 lowercase hex and its bytes hash to it; a reference names a blob the pack has;
one blob is at most `max_pack_blob_bytes`, all of a pack's together (each at least a
4 KiB block) at most `max_pack_blobs_bytes` (Settings). The archive extractor applies
the same two limits to `blobs/` before the bytes land (server/packs/archive.py). The
format's names and limits are palaestra.sdk.blobs (the writers share them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.sdk.blobs import (
    BLOBS_DIR,
    BLOBS_FIELD,
    BLOCK,
    DEFAULT_MAX_BLOB,
    DEFAULT_MAX_BLOBS,
    HEX,
    REF,
    SIDES,
    disk_cost,
    too_large,
)
from palaestra.server.packs.taskfields import check_relative  # the one path rule


@dataclass
class BlobIndex:
    """A pack's blobs: digest hex -> the file that holds the bytes, and their sizes."""

    max_blob: int = DEFAULT_MAX_BLOB
    max_total: int = DEFAULT_MAX_BLOBS
    files: dict[str, Path] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    def add(self, hexdigest: str, path: Path, size: int) -> None:
        if hexdigest not in self.files:
            self.files[hexdigest] = path
            self.sizes[hexdigest] = size

    def relative_to(self, root: Path) -> dict[str, str]:
        """Each blob's file by its path under `root` (palaestra.sdk.blobs.BlobSource)."""
        return {h: p.relative_to(root).as_posix() for h, p in self.files.items()}

    def total(self) -> int:
        return sum(disk_cost(n) for n in self.sizes.values())

    def scan(self, root: Path, hashes: Mapping[str, str]) -> list[str]:
        """Index `root/blobs/` (its files' sha256 from `hashes`, the pack's file hashes);
        the problems: odd names, folders, bytes that are not their name, sizes."""
        folder = root / BLOBS_DIR
        if not folder.is_dir():
            return []
        problems: list[str] = []
        for path in sorted(folder.iterdir()):
            name = path.name
            if name.startswith(".") or name == "__pycache__":
                continue
            where = f"{BLOBS_DIR}/{name}"
            if path.is_symlink() or not path.is_file():
                problems.append(f"{root / where}: blobs/ holds files only (no folders or links)")
                continue
            if not HEX.match(name):
                problems.append(
                    f"{root / where}: a blob is named by the sha256 of its bytes (64 lowercase "
                    "hex digits); `palaestra pack import` and the pack writer name them"
                )
                continue
            size = path.stat().st_size
            if size > self.max_blob:
                problems.append(f"{root / where}: {too_large('the blob', size, self.max_blob)}")
                continue
            if hashes.get(where) != f"sha256:{name}":
                problems.append(
                    f"{root / where}: its bytes do not match its digest (sha256 "
                    f"{str(hashes.get(where, '?')).removeprefix('sha256:')[:16]}…); the blob "
                    "is corrupt or was edited: restore it"
                )
                continue
            self.add(name, path, size)
        return problems

    def total_problems(self, root: Path) -> list[str]:
        total = self.total()
        if total <= self.max_total:
            return []
        return [
            f"{root}: the pack's binary files come to {total} bytes ({len(self.sizes)} blobs, "
            f"each counted at least {BLOCK} bytes), over the limit of {self.max_total} "
            "(max_pack_blobs_bytes)"
        ]


def task_blob_problems(
    public: Mapping[str, Any], private: Mapping[str, Any], index: BlobIndex
) -> list[str]:
    """Each problem of a task's blob references, as 'side.blobs[path]: what to fix'."""
    problems: list[str] = []
    for side, fields in (("public", public), ("private", private)):
        refs = fields.get(BLOBS_FIELD)
        if refs is None:
            continue
        if not isinstance(refs, Mapping):
            problems.append(f"{side}.{BLOBS_FIELD}: a table of '<folder>/<path>' = 'sha256:<hex>'")
            continue
        for rel, ref in refs.items():
            at = f"{side}.{BLOBS_FIELD}[{rel!r}]"
            why = check_relative(rel)
            folder = rel.split("/", 1)[0] if isinstance(rel, str) else ""
            if why is None and ("/" not in rel or folder not in SIDES[side]):
                folders = ", ".join(f"{f}/" for f in sorted(SIDES[side]))
                why = f"must start with one of {folders} (its file map)"
            if why is None and (not isinstance(ref, str) or not REF.match(ref)):
                why = f"{str(ref)[:80]!r} is not a blob reference ('sha256:' and 64 hex digits)"
            if why is None and ref.removeprefix("sha256:") not in index.files:
                why = f"{ref} is not a blob of this pack; add it under {BLOBS_DIR}/"
            if why is not None:
                problems.append(f"{at}: {why}")
    return problems
