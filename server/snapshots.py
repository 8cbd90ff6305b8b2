"""Content-addressed snapshots on disk: workspace archives kept past their sandbox (an
episode's checkpoint, server/checkpoint.py; the final state a verifier saw could live here
too, for regrade).

A snapshot is a file named by the sha256 of its bytes under `<root>/sha256/<2>/<62>`:
the same bytes twice are stored once, and a name says what it holds. `put` takes a file
(a `spool_file` a sandbox's tar was streamed into) and copies it in a thread, hashing on
the way: an archive never sits whole in server memory, and the event loop never waits on
the disk. A file appears only whole (written under a temporary name, fsynced, renamed), so
a SIGKILL leaves either the snapshot or nothing. `prune` removes what nobody refers to.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20  # what a copy holds at once
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
GRACE_S = 300.0  # a snapshot younger than this is never pruned (its row may be on its way)


class SnapshotMissing(LookupError):
    """No snapshot has that digest (pruned, or the data dir is another's)."""


class Snapshots:
    """The snapshot store under `root` (`<data_dir>/snapshots`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: str) -> Path:
        if not DIGEST_RE.match(digest):
            raise SnapshotMissing(f"{digest[:80]!r} is no snapshot digest")
        hexa = digest.removeprefix("sha256:")
        return self.root / "sha256" / hexa[:2] / hexa[2:]

    async def put(self, src: BinaryIO) -> tuple[str, int]:
        """Store the bytes of `src` (from its start) and return (digest, size)."""
        return await asyncio.to_thread(self._put, src)

    def _put(self, src: BinaryIO) -> tuple[str, int]:
        tmp_dir = self.root / "tmp"
        tmp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = tmp_dir / f"{os.getpid()}-{time.monotonic_ns()}"
        hasher, size = hashlib.sha256(), 0
        try:
            src.seek(0)
            with open(tmp, "xb") as out:
                while chunk := src.read(CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            digest = "sha256:" + hasher.hexdigest()
            final = self.path(digest)
            final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if final.exists():
                os.utime(final)  # fresh again: a prune's grace counts from the last put
            else:
                os.replace(tmp, final)
            return digest, size
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def open(self, digest: str) -> BinaryIO:
        """The snapshot's bytes, to read (blocking open: call it in a thread or accept one
        `open(2)`); SnapshotMissing when it is not here."""
        try:
            return open(self.path(digest), "rb")
        except FileNotFoundError:
            raise SnapshotMissing(f"snapshot {digest} is not in {self.root}") from None

    def exists(self, digest: str) -> bool:
        try:
            return self.path(digest).is_file()
        except SnapshotMissing:
            return False

    def drop(self, digest: str, put_by: float) -> bool:
        """Remove a snapshot nobody refers to any more (the caller checked), unless it was
        put again after `put_by` (another checkpoint of the same bytes on its way: its
        `put` refreshed it). Blocking: call it in a thread."""
        try:
            path = self.path(digest)
            if path.stat().st_mtime > put_by:
                return False
            path.unlink()
        except (SnapshotMissing, FileNotFoundError):
            return False
        return True

    async def prune(self, keep: Iterable[str], grace_s: float = GRACE_S) -> int:
        """Remove every snapshot not in `keep` older than `grace_s`; how many went."""
        kept = frozenset(keep)
        return await asyncio.to_thread(self._prune, kept, grace_s)

    def _prune(self, keep: frozenset[str], grace_s: float) -> int:
        base, gone, cutoff = self.root / "sha256", 0, time.time() - grace_s
        if not base.is_dir():
            return 0
        for folder in base.iterdir():
            for entry in folder.iterdir():
                digest = f"sha256:{folder.name}{entry.name}"
                with contextlib.suppress(FileNotFoundError):
                    if digest not in keep and entry.stat().st_mtime < cutoff:
                        entry.unlink()
                        gone += 1
        return gone
