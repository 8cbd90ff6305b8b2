"""Pack archives: a deterministic tar.gz of a pack directory, and a careful extractor.

`pack_archive(root)` gives the same bytes for the same files wherever and whenever it
runs: entries sorted, regular files and directories only, mtime 0, uid/gid 0, no owner
names, mode 0644 (0755 for directories), gzip header without a name or a time.
`__pycache__` folders, `*.pyc` and dotfiles are left out (the pack digest ignores them
too); `pack.lock` goes in.

`extract_archive(data, dest)` refuses anything but regular files and directories
(symlinks, hard links, devices, FIFOs), absolute paths and `..`, and archives that
unpack to more than `MAX_BYTES` or `MAX_FILES`. It returns the pack root: `dest` itself,
or the single top-level folder when the archive wraps everything in one that holds
`pack.toml`.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path, PurePosixPath

MAX_BYTES = 2 * 1024 * 1024 * 1024
MAX_FILES = 200_000
SKIP_DIRS = {"__pycache__", ".git"}


class ArchiveError(ValueError):
    """The archive is malformed or unsafe; the message says which entry and why."""


def _included(path: Path, root: Path) -> bool:
    rel = path.relative_to(root)
    hidden = any(part.startswith(".") for part in rel.parts)
    return not hidden and not (set(rel.parts) & SKIP_DIRS) and path.suffix != ".pyc"


def pack_archive(root: Path) -> bytes:
    root = Path(root)
    if not (root / "pack.toml").is_file():
        raise ArchiveError(f"{root}: no pack.toml; not a pack directory")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
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
                data = path.read_bytes()
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
            else:
                raise ArchiveError(f"{path}: only regular files and folders can go into a pack")
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or name.startswith("/") or "\\" in name:
        raise ArchiveError(f"archive entry {name!r}: absolute or odd paths are refused")
    if any(part == ".." for part in path.parts):
        raise ArchiveError(f"archive entry {name!r}: '..' is refused")
    return path


def extract_archive(data: bytes, dest: Path) -> Path:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")  # noqa: SIM115 (closed below)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"not a tar.gz archive ({exc})") from None
    total = files = 0
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ArchiveError(f"the archive is corrupt ({exc})") from None
        for member in members:
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
            if files > MAX_FILES or total > MAX_BYTES:
                raise ArchiveError(
                    f"the archive unpacks to more than {MAX_FILES} files or {MAX_BYTES} bytes"
                )
            target = dest.joinpath(*rel.parts)
            try:
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ArchiveError(f"archive entry {member.name!r}: {exc.strerror}") from None
            source = tar.extractfile(member)
            if source is None:  # pragma: no cover - isfile() members always have data
                raise ArchiveError(f"archive entry {member.name!r} has no data")
            try:
                with source, open(target, "xb") as out:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
            except OSError as exc:
                raise ArchiveError(f"archive entry {member.name!r}: {exc.strerror}") from None
            target.chmod(0o644)
    if (dest / "pack.toml").is_file():
        return dest
    tops = [p for p in dest.iterdir()]
    if len(tops) == 1 and tops[0].is_dir() and (tops[0] / "pack.toml").is_file():
        return tops[0]
    raise ArchiveError("the archive holds no pack.toml (at its top or in one top-level folder)")
