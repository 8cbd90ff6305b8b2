"""A bwrap sandbox's workspace seen from the host: file reads, writes, tar uploads and
downloads, every path walked from the workspace root without following a symlink.

The workspace's contents are the agent's: a path that escapes, a symlink, a file that is
not regular, a download over its budget or nested too deep is a `SandboxPathError` (an
agent fault), never followed.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from palaestra.sandbox.base import (
    MAX_TREE_DEPTH,
    TAR_CHUNK,
    SandboxError,
    SandboxFileTooLarge,
    SandboxPathError,
    SandboxTreeTooDeep,
    forget_members,
    tar_members,
    tar_writer,
    too_large,
    upload_member,
)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Workspace:
    """The host folder `root` bound at `workdir` inside; files written are owned by
    `host_uid` (None: by us, and world-writable); reads take in at most `limit` bytes."""

    def __init__(self, root: Path, workdir: str, host_uid: int | None, limit: int) -> None:
        self.root = root
        self.workdir = workdir
        self.host_uid = host_uid
        self.limit = limit

    def parts(self, path: str) -> list[str]:
        """The workspace-relative components of `path`; SandboxPathError if it escapes."""
        if "\0" in path:
            raise SandboxPathError(f"NUL in path {path!r}")
        norm = posixpath.normpath(posixpath.join(self.workdir, path))
        if norm == self.workdir:
            return []
        if not norm.startswith(self.workdir + "/"):
            raise SandboxPathError(f"path {path!r} is outside the workspace {self.workdir}")
        return norm[len(self.workdir) + 1 :].split("/")

    def _chown(self, name: str, dir_fd: int) -> None:
        if self.host_uid is not None:
            os.chown(name, self.host_uid, self.host_uid, dir_fd=dir_fd, follow_symlinks=False)

    def _open_dir(self, parts: list[str], create: bool = False) -> int:
        """Walk `parts` from the workspace root without following any symlink."""
        fd = os.open(self.root, DIR_FLAGS)
        try:
            for part in parts:
                try:
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                        self._chown(part, fd)
                        if self.host_uid is None:
                            os.chmod(part, 0o777, dir_fd=fd, follow_symlinks=False)
                    nfd = _open_at(part, DIR_FLAGS, fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise SandboxPathError(f"{part!r} is a symlink or not a directory") from e
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, path: str) -> bytes:
        parts = self.parts(path)
        if not parts:
            raise SandboxPathError(f"{path!r} is a directory", "not_regular_file")
        dfd = self._open_dir(parts[:-1])
        try:
            fd = _open_at(
                parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dfd
            )
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise SandboxPathError(f"{path!r} is not a regular file", "not_regular_file")
        limit = self.limit
        if st.st_size > limit:  # sparse: no real file outgrows the workspace
            os.close(fd)
            raise SandboxFileTooLarge(f"{path!r} is {st.st_size} bytes, over {limit}")
        with os.fdopen(fd, "rb") as f:
            return f.read(limit + 1)

    def write(self, parts: list[str], data: bytes | IO[bytes], mode: int) -> None:
        """Write `data` (bytes, or a file read to its end in chunks) to the file `parts`."""
        if not parts:
            raise SandboxPathError("cannot write to the workdir itself")
        mode &= 0o777
        if self.host_uid is None:
            mode |= 0o666  # the sandbox uid maps to us, but be permissive anyway
        dfd = self._open_dir(parts[:-1], create=True)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = _open_at(parts[-1], flags, dfd, mode)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise SandboxPathError(f"{'/'.join(parts)!r} is not a regular file")
            with os.fdopen(fd, "wb") as f:
                os.ftruncate(fd, 0)
                os.fchmod(fd, mode)
                if self.host_uid is not None:
                    os.fchown(fd, self.host_uid, self.host_uid)
                if isinstance(data, bytes):
                    f.write(data)
                else:
                    shutil.copyfileobj(data, f, TAR_CHUNK)
        finally:
            os.close(dfd)

    def upload(self, data: bytes | BinaryIO, dest: list[str], links_out: bool = False) -> None:
        """Unpack the tar `data` (bytes, or a seekable file read from its start, a member at
        a time) under `dest`; `links_out`: symlinks pointing anywhere are kept as they are
        (a checkpoint's restore: no write here ever follows a link)."""
        if isinstance(data, bytes):
            data = io.BytesIO(data)
        data.seek(0)
        with tarfile.open(fileobj=data, mode="r:*") as tf:
            for m in tar_members(tf):
                name = upload_member(m, links_out)
                if name is None:
                    continue
                parts = dest + name.split("/")
                if m.isdir():
                    self._close(self._open_dir(parts, create=True))
                elif m.isreg():
                    f = tf.extractfile(m)
                    assert f is not None
                    self.write(parts, f, (m.mode & 0o777) | 0o600)
                else:  # a symlink inside the destination (upload_member)
                    dfd = self._open_dir(parts[:-1], create=True)
                    try:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(parts[-1], dir_fd=dfd)
                        os.symlink(m.linkname, parts[-1], dir_fd=dfd)
                        self._chown(parts[-1], dfd)
                    finally:
                        os.close(dfd)

    @staticmethod
    def _close(fd: int) -> None:
        os.close(fd)

    def download(self, parts: list[str]) -> bytes:
        buf = io.BytesIO()
        self.download_to(parts, buf, self.limit)
        return buf.getvalue()

    def download_to(self, parts: list[str], out: BinaryIO, limit: int) -> int:
        """Write a tar of `parts` into `out` a file at a time (never a whole file in
        memory); SandboxFileTooLarge past `limit` bytes (base.too_large). The bytes written."""
        start = out.tell()
        budget = _Budget(limit)
        with tar_writer(_ServerFile(out)) as tf:
            if not parts:
                fd = self._open_dir([])
                try:
                    for item in _walk(fd, "", budget):
                        _add(tf, *item)
                finally:
                    os.close(fd)
            else:
                dfd = self._open_dir(parts[:-1])
                try:
                    st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        fd = self._open_dir(parts)
                        try:
                            budget.take(0, parts[-1])
                            _add(tf, parts[-1], st, None, None)
                            for item in _walk(fd, parts[-1], budget):
                                _add(tf, *item)
                        finally:
                            os.close(fd)
                    else:
                        _add(tf, *_entry(dfd, parts[-1], parts[-1], st, budget))
                finally:
                    os.close(dfd)
        return out.tell() - start


def _open_at(name: str, flags: int, dir_fd: int, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
            raise SandboxPathError(
                f"{name!r} is a symlink or not a regular file", "not_regular_file"
            ) from e
        raise


# (name in the tar, its stat, an open fd of a regular file's contents, a symlink's target);
# the fd is `_add`'s to close.
_Entry = tuple[str, os.stat_result, int | None, str | None]


@dataclass
class _Budget:
    """What is left of a download's byte allowance (`read_limit`, or the caller's lower
    `limit`): every entry is charged what it takes in the tar, header and padding included."""

    left: int
    limit: int = 0

    def __post_init__(self) -> None:
        self.limit = self.left

    def take(self, n: int, what: str) -> None:
        name = len(what.encode(errors="surrogateescape"))
        self.left -= -(-n // 512) * 512 + 512 + (-(-name // 512) * 512 + 1024 if name > 99 else 0)
        if self.left < 0:
            raise too_large(self.limit, f"the download (at {what[:200]!r})")


def _entry(dfd: int, name: str, arcname: str, st: os.stat_result, budget: _Budget) -> _Entry:
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=dfd)
        budget.take(len(target) if len(target) > 99 else 0, arcname)
        return arcname, st, None, target
    if stat.S_ISREG(st.st_mode):
        fd = _open_at(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dfd)
        try:
            real = os.fstat(fd)
            if not stat.S_ISREG(real.st_mode):
                raise SandboxPathError(f"{name!r} is not a regular file", "not_regular_file")
            budget.take(real.st_size, arcname)
        except BaseException:
            os.close(fd)
            raise
        return arcname, real, fd, None
    budget.take(0, arcname)
    return arcname, st, None, None


def _walk(dfd: int, prefix: str, budget: _Budget, depth: int = 1) -> Iterator[_Entry]:
    """Entries below the directory `dfd`, never following symlinks; SandboxTreeTooDeep past
    MAX_TREE_DEPTH levels, SandboxFileTooLarge past the budget (both the agent's doing)."""
    for name in sorted(os.listdir(dfd)):
        arc = f"{prefix}/{name}" if prefix else name
        if depth > MAX_TREE_DEPTH:
            raise SandboxTreeTooDeep(f"{arc[:200]!r}... is nested deeper than {MAX_TREE_DEPTH}")
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=dfd)
            except OSError:
                continue
            try:
                budget.take(0, arc)
                yield arc, st, None, None
                yield from _walk(sub, arc, budget, depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            try:
                yield _entry(dfd, name, arc, st, budget)
            except SandboxFileTooLarge:
                raise
            except (OSError, SandboxPathError):
                continue


class _ServerFile:
    """`f`, a file of the server's own (a spool file), whose OSErrors are ours: a full
    server disk is a SandboxError (void), never read as the workspace's ENOSPC (the
    caller's `workspace_errors` would make that WorkspaceFull, the agent's fault)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def write(self, data: bytes, /) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            raise SandboxError(f"writing the server's spool file: {e}") from e

    def read(self, n: int = -1, /) -> bytes:
        return self.f.read(n)

    def tell(self) -> int:
        return self.f.tell()

    def seek(self, pos: int, whence: int = 0, /) -> int:
        return self.f.seek(pos, whence)

    def close(self) -> None:
        """Not ours to close: the caller's file stays open."""


class _Exact:
    """Exactly `size` bytes of the file `f`, zeros past an early end: the size its tar header
    already promised, should the file have shrunk since (never more, should it have grown)."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self.f = f
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        parts, got = [], 0
        while got < n:  # a short read is not the end; an empty one is
            data = self.f.read(n - got)
            if not data:
                parts.append(bytes(n - got))
                break
            parts.append(data)
            got += len(data)
        self.left -= n
        return b"".join(parts)


def _add(
    tf: tarfile.TarFile, arc: str, st: os.stat_result, fd: int | None, link: str | None
) -> None:
    """Append one entry (closing its `fd`); tarfile keeps no list of what it wrote."""
    ti = tarfile.TarInfo(arc)
    ti.mtime = int(st.st_mtime)
    ti.mode = stat.S_IMODE(st.st_mode)
    if link is not None:
        ti.type = tarfile.SYMTYPE
        ti.linkname = link
        tf.addfile(ti)
    elif fd is not None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            ti.size = st.st_size
            tf.addfile(ti, _Exact(f, st.st_size))
    elif stat.S_ISDIR(st.st_mode):
        ti.type = tarfile.DIRTYPE
        tf.addfile(ti)
    forget_members(tf)
