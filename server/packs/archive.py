"""Pack archives: a deterministic tar.gz of a pack directory, and a careful extractor.

`pack_archive(root)` gives the same bytes for the same files wherever and whenever it
runs: entries sorted, regular files and directories only, mtime 0, uid/gid 0, no owner
names, mode 0644 (0755 for directories), gzip header without a name or a time.
`__pycache__` folders, `*.pyc` and dotfiles are left out (the pack digest ignores them
too); `pack.lock` goes in.

`extract_archive(data, dest, limits)` refuses anything but regular files and directories
(symlinks, hard links, devices, FIFOs), absolute paths, `..` and odd names, and, while
the gzip stream inflates, archives over `ArchiveLimits` (compressed size, inflated total,
entries, inflation ratio, oversized pax records): a compression bomb costs the server
its first megabytes, not its memory or minutes. It returns the pack root: `dest` itself,
or the single top-level folder when the archive wraps everything in one that holds
`pack.toml`.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from palaestra.sdk.blobs import (
    BLOBS_DIR,
    DEFAULT_MAX_BLOB,
    DEFAULT_MAX_BLOBS,
    disk_cost,
    too_large,
)

MAX_BYTES = 2 * 1024 * 1024 * 1024
MAX_FILES = 200_000
MAX_NAME = 4096  # characters in an entry's path
MAX_META = 1024 * 1024  # bytes of one pax or GNU long-name record
SKIP_DIRS = {"__pycache__", ".git"}
_CHUNK = 1 << 16
_RATIO_FLOOR = 1 << 20  # below this many inflated bytes, no ratio is a bomb
_META_TYPES = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)


class ArchiveError(ValueError):
    """The archive is malformed or unsafe; the message says which entry and why."""


class ArchiveTooLarge(ArchiveError):
    """The archive is over a size limit (413): compressed, inflated, entries or ratio."""


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive may cost to unpack (Settings: max_pack_*)."""

    max_compressed: int = 256 * 1024 * 1024
    max_unpacked: int = MAX_BYTES
    max_files: int = MAX_FILES
    max_ratio: float = 200.0
    max_blob: int = DEFAULT_MAX_BLOB  # one file under blobs/ (server/packs/blobs.py)
    max_blobs: int = DEFAULT_MAX_BLOBS  # blobs/ together, each at least a disk block

    @classmethod
    def from_settings(cls, settings: Any) -> ArchiveLimits:
        return cls(
            settings.max_pack_bytes,
            settings.max_pack_unpacked_bytes,
            settings.max_pack_files,
            settings.max_pack_ratio,
            settings.max_pack_blob_bytes,
            settings.max_pack_blobs_bytes,
        )


def _included(path: Path, root: Path) -> bool:
    rel = path.relative_to(root)
    hidden = any(part.startswith(".") for part in rel.parts)
    return not hidden and not (set(rel.parts) & SKIP_DIRS) and path.suffix != ".pyc"


def pack_archive(root: Path) -> bytes:
    """The archive of the pack folder `root`, as bytes (`write_pack_archive`)."""
    out = io.BytesIO()
    write_pack_archive(root, out)
    return out.getvalue()


def write_pack_archive(root: Path, out: BinaryIO) -> None:
    """Write the archive of the pack folder `root` into `out`, a file at a time (a served
    download goes through a file on disk: a pack may be gigabytes unpacked)."""
    root = Path(root)
    if not (root / "pack.toml").is_file():
        raise ArchiveError(f"{root}: no pack.toml; not a pack directory")
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
            if not _included(path, root):
                continue
            if path.is_symlink():
                raise ArchiveError(f"{path}: symlinks cannot go into a pack archive")
            name = path.relative_to(root).as_posix()
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif path.is_file():
                with path.open("rb") as data:
                    info.size = os.fstat(data.fileno()).st_size
                    info.mode = 0o644
                    tar.addfile(info, data)
            else:
                raise ArchiveError(f"{path}: only regular files and folders can go into a pack")


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or name.startswith("/") or "\\" in name:
        raise ArchiveError(f"archive entry {name!r}: absolute or odd paths are refused")
    if any(part == ".." for part in path.parts):
        raise ArchiveError(f"archive entry {name!r}: '..' is refused")
    if len(name) > MAX_NAME or any(ord(c) < 32 for c in name):
        raise ArchiveError(
            f"archive entry {name[:80]!r}…: names are at most {MAX_NAME} characters, "
            "without control characters"
        )
    return path


class _Inflater(io.RawIOBase):
    """The gzip stream read from `source`, inflated as it is read, that refuses (ArchiveTooLarge) to
    yield more than `limits.max_unpacked` bytes or more than `limits.max_ratio` times what
    it has consumed: a bomb stops after the first megabytes, never after the gigabytes."""

    def __init__(self, source: BinaryIO, limits: ArchiveLimits) -> None:
        self._source = source
        self._ahead = source.read(_CHUNK)  # the next compressed chunk (b"": none left)
        self._at = len(self._ahead)  # compressed bytes read so far
        self._zlib = zlib.decompressobj(wbits=31)
        self._pending = b""
        self.produced = 0
        self._limits = limits

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._pending:
            if self._zlib.eof:
                rest = self._zlib.unused_data
                if not rest and not self._ahead:
                    return 0
                self._zlib = zlib.decompressobj(wbits=31)  # a further gzip member
                self._pending = self._zlib.decompress(rest, len(view))
                continue
            tail = self._zlib.unconsumed_tail
            chunk: bytes | memoryview
            if tail:
                chunk = tail
            elif self._ahead:
                chunk, self._ahead = self._ahead, self._source.read(_CHUNK)
                self._at += len(self._ahead)
            else:
                raise ArchiveError("the archive ends before its gzip stream does (truncated)")
            try:
                self._pending = self._zlib.decompress(chunk, len(view))
            except zlib.error as exc:
                raise ArchiveError(f"not a tar.gz archive ({exc})") from None
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        self.produced += n
        self._check()
        return n

    def _check(self) -> None:
        limits = self._limits
        if self.produced > limits.max_unpacked:
            raise ArchiveTooLarge(
                f"the archive unpacks to more than {limits.max_unpacked} bytes"
                " (max_pack_unpacked_bytes)"
            )
        if self.produced > _RATIO_FLOOR and self.produced > limits.max_ratio * max(self._at, 1):
            raise ArchiveTooLarge(
                f"the archive inflates more than {limits.max_ratio:g} times (max_pack_ratio:"
                f" {self.produced} bytes from the first {self._at}); a compression bomb?"
            )


def _check_blob(member: tarfile.TarInfo, total: int, limits: ArchiveLimits) -> None:
    """A blob entry over the per-file or per-pack limit, before its bytes land (413)."""
    if member.size > limits.max_blob:
        raise ArchiveTooLarge(
            f"archive entry {member.name!r}: {too_large('the blob', member.size, limits.max_blob)}"
        )
    if total > limits.max_blobs:
        raise ArchiveTooLarge(
            f"archive entry {member.name!r}: the pack's binary files (blobs/) come to more than "
            f"{limits.max_blobs} bytes, each counted at least a 4 KiB block "
            "(max_pack_blobs_bytes)"
        )


class _Member(tarfile.TarInfo):
    """A tar header whose extension records (pax, GNU long names) are size-checked before
    tarfile reads them whole into memory."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > MAX_META:
            raise ArchiveTooLarge(
                f"archive entry {self.name[:80]!r}: an extended header of {self.size} bytes"
                f" (at most {MAX_META})"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]


def extract_archive(
    data: bytes | BinaryIO, dest: Path, limits: ArchiveLimits | None = None
) -> Path:
    """Unpack a tar.gz (bytes, or a file at its start: a large upload waits on disk) while
    it inflates, one entry at a time; every limit is checked before the bytes it guards are
    read (ArchiveTooLarge), every entry before it lands."""
    limits = limits or ArchiveLimits()
    archive = io.BytesIO(data) if isinstance(data, bytes) else data
    size = len(data) if isinstance(data, bytes) else os.fstat(archive.fileno()).st_size
    if size > limits.max_compressed:
        raise ArchiveTooLarge(
            f"the archive is {size} bytes, over {limits.max_compressed} (max_pack_bytes)"
        )
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    stream = io.BufferedReader(_Inflater(archive, limits), buffer_size=_CHUNK)
    try:
        tar = tarfile.open(fileobj=stream, mode="r|", tarinfo=_Member)  # noqa: SIM115
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"not a tar.gz archive ({exc})") from None
    total = files = blob_total = 0
    with tar:
        members = iter(tar)
        while True:
            try:
                member = next(members)
            except StopIteration:
                break
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise ArchiveError(f"the archive is corrupt ({exc})") from None
            rel = _safe_name(member.name)
            if rel == PurePosixPath("."):
                continue
            if not (member.isfile() or member.isdir()):
                raise ArchiveError(
                    f"archive entry {member.name!r}: only regular files and folders are allowed"
                    " (no symlinks, hard links or devices)"
                )
            files += 1
            total += member.size
            if files > limits.max_files:
                raise ArchiveTooLarge(
                    f"the archive holds more than {limits.max_files} entries (max_pack_files)"
                )
            if total > limits.max_unpacked:
                raise ArchiveTooLarge(
                    f"the archive's files add up to more than {limits.max_unpacked} bytes"
                    " (max_pack_unpacked_bytes)"
                )
            if member.isfile() and len(rel.parts) in (2, 3) and rel.parts[-2] == BLOBS_DIR:
                blob_total += disk_cost(member.size)
                _check_blob(member, blob_total, limits)
            target = dest.joinpath(*rel.parts)
            try:
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ArchiveError(f"archive entry {member.name!r}: {exc.strerror}") from None
            try:
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - isfile() members always have data
                    raise ArchiveError(f"archive entry {member.name!r} has no data")
                with source, open(target, "xb") as out:
                    while chunk := source.read(_CHUNK):
                        out.write(chunk)
            except OSError as exc:
                raise ArchiveError(f"archive entry {member.name!r}: {exc.strerror}") from None
            except (tarfile.TarError, EOFError) as exc:
                raise ArchiveError(f"archive entry {member.name!r}: corrupt ({exc})") from None
            target.chmod(0o644)
    if (dest / "pack.toml").is_file():
        return dest
    tops = [p for p in dest.iterdir()]
    if len(tops) == 1 and tops[0].is_dir() and (tops[0] / "pack.toml").is_file():
        return tops[0]
    raise ArchiveError("the archive holds no pack.toml (at its top or in one top-level folder)")
