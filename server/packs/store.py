"""The on-disk pack store: installed packs as folders named by their digest.

An installed pack is the extracted archive under `<data_dir>/packs/sha256/<hex>/` (`hex`:
the pack digest, DESIGN §6). An archive is unpacked into a fresh folder under
`packs/tmp/` (removed afterwards, whatever happens) and moved into place with one
`rename`, so a folder under `sha256/` is always whole; which folders are live is the
published-pack registry's business (server/packs/registry.py), not the store's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from palaestra.sdk.errors import BadRequestError, TooLargeError
from palaestra.server.packs.archive import (
    ArchiveError,
    ArchiveLimits,
    ArchiveTooLarge,
    extract_archive,
)
from palaestra.server.packs.lock import pack_digest


class PackStore:
    """Pack folders under `<data_dir>/packs/sha256/`, unpacked from archives under tmp/."""

    def __init__(self, data_dir: Path, archive_limits: ArchiveLimits | None = None) -> None:
        self.root = data_dir / "packs"
        self.objects = self.root / "sha256"
        self.tmp = self.root / "tmp"
        self.archive_limits = archive_limits or ArchiveLimits()

    def path_of(self, digest: str) -> Path:
        """The folder of the installed pack with this digest."""
        return self.objects / digest.removeprefix("sha256:")

    @contextmanager
    def unpacked(self, data: bytes | BinaryIO) -> Iterator[Path]:
        """The archive `data` extracted under tmp/ (its pack root), removed on exit unless
        `place` moved it. Raises TooLargeError (over `archive_limits`) or BadRequestError
        (an unsafe or malformed archive)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.objects.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="install-", dir=self.tmp))
        try:
            try:
                root = extract_archive(data, work / "pack", self.archive_limits)
            except ArchiveTooLarge as exc:
                message = f"pack archive refused: {exc}"
                raise TooLargeError(message, code="archive_too_large") from None
            except ArchiveError as exc:
                raise BadRequestError(f"bad pack archive: {exc}", code="invalid_archive") from None
            yield root
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def place(self, root: Path, digest: str) -> Path:
        """Move the unpacked pack at `root` to its digest's folder (one rename); its path."""
        final = self.path_of(digest)
        # A folder there was left by an install that stopped between the rename and the
        # index row; a rename is all-or-nothing, so its files are whole. Check them anyway.
        if final.exists() and pack_digest(final) != pack_digest(root):
            shutil.rmtree(final)
        if not final.exists():
            os.rename(root, final)
        return final
