"""The pack format's binary files (blobs): their folder, their references and limits.

Shared by what writes packs (palaestra.sdk.packwriter, the importers) and what loads them
(server/packs/blobs.py, which documents the format): a task names a binary file in
`public.blobs` / `private.blobs` as `{"<folder>/<path>": "sha256:<hex>"}`, and the bytes
live once under the pack's `blobs/<hex>`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

BLOBS_DIR = "blobs"
BLOBS_FIELD = "blobs"
BLOCK = 4096  # the least a file costs on disk
HEX = re.compile(r"^[0-9a-f]{64}$")
REF = re.compile(r"^sha256:[0-9a-f]{64}$")
# The folders (file maps) a blob may belong to, by side.
SIDES: dict[str, frozenset[str]] = {
    "public": frozenset({"environment", "assets"}),
    "private": frozenset({"verifier", "solution", "build"}),
}
DEFAULT_MAX_BLOB = 64 * 1024 * 1024
DEFAULT_MAX_BLOBS = 512 * 1024 * 1024


def disk_cost(size: int) -> int:
    """What a file of `size` bytes costs against the per-pack total: at least a block."""
    return max(size, BLOCK)


def sha256_file(path: Path) -> str:
    """`sha256:<hex>` of a file, read a MiB at a time."""
    with path.open("rb") as data:
        return "sha256:" + hashlib.file_digest(data, "sha256").hexdigest()


def too_large(what: str, size: int, limit: int) -> str:
    return (
        f"{what} is {size} bytes, over the limit of {limit} bytes for one binary file "
        "(max_pack_blob_bytes)"
    )


@dataclass
class BlobSource:
    """Where a loaded pack's blobs are: its root (which moves once, when a publish places
    the unpacked pack in the store) and each blob's path under it, by digest hex."""

    root: Path
    files: dict[str, str] = field(default_factory=dict)

    def path(self, hexdigest: str) -> Path:
        return self.root / self.files[hexdigest]
