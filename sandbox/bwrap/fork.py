"""A bwrap sandbox's fork: its workspace copied on the host into a fresh sandbox's.

The copy walks the source from its root by file descriptor, never following a symlink
(the agent's processes may still run in it, a persistent shell's, and swap a folder for a
link meanwhile): directories, regular files and symlinks are copied with their modes and
times, anything else (fifos, sockets) is skipped, as a download skips it. File contents
go by reflink (FICLONE) where the filesystem has it, else by `copy_file_range` or
`sendfile` in the kernel: never through Python buffers. A copy that fills the destination
(sparse files, hard links the agent made take real space there) is the agent's
WorkspaceFull, raised by the caller's `workspace_errors`; so is one past `limit` bytes of
file contents (SandboxFileTooLarge), where the workspace has no size of its own (no tmpfs).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from palaestra.sandbox.base import MAX_TREE_DEPTH, SandboxTreeTooDeep, too_large
from palaestra.sandbox.bwrap.files import DIR_FLAGS

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Budget:
    """The bytes of file contents a copy may still take (`read_limit` of the spec)."""

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise too_large(self.limit, "the workspace's copy")


def copy_workspace(src: Path, dst: Path, host_uid: int | None, limit: int) -> None:
    """Copy the contents of the folder `src` into the empty folder `dst` (blocking: run it
    in a thread); entries are owned by `host_uid` (None: by us)."""
    sfd = os.open(src, DIR_FLAGS)
    try:
        dfd = os.open(dst, DIR_FLAGS)
        try:
            _copy_dir(sfd, dfd, host_uid, 1, _Budget(limit))
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _copy_dir(sfd: int, dfd: int, uid: int | None, depth: int, budget: _Budget) -> None:
    for name in os.listdir(sfd):
        try:
            st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone meanwhile
        if stat.S_ISDIR(st.st_mode):
            if depth > MAX_TREE_DEPTH:
                raise SandboxTreeTooDeep(f"{name[:200]!r} is nested deeper than {MAX_TREE_DEPTH}")
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=sfd)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    continue  # replaced meanwhile
                raise
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
                out = os.open(name, DIR_FLAGS, dir_fd=dfd)
                try:
                    _copy_dir(sub, out, uid, depth + 1, budget)
                    _settle(out, uid, st)
                finally:
                    os.close(out)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(sfd, dfd, name, uid, budget)
        elif stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=sfd)
            except OSError:
                continue
            os.symlink(target, name, dir_fd=dfd)
            if uid is not None:
                os.chown(name, uid, uid, dir_fd=dfd, follow_symlinks=False)


def _copy_file(sfd: int, dfd: int, name: str, uid: int | None, budget: _Budget) -> None:
    try:
        src = os.open(name, _READ, dir_fd=sfd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return  # replaced meanwhile by a link or a fifo: not copied, as it is now
        raise
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return
        budget.take(st.st_size)
        out = os.open(name, _WRITE, 0o600, dir_fd=dfd)
        try:
            _contents(src, out, st.st_size)
            _settle(out, uid, st)
        finally:
            os.close(out)
    finally:
        os.close(src)


def _contents(src: int, out: int, size: int) -> None:
    """`src`'s bytes into `out`: a reflink where the filesystem has one, else in-kernel."""
    if size == 0:
        return
    with contextlib.suppress(OSError):
        fcntl.ioctl(out, FICLONE, src)
        return
    left, use_range = size, True  # what it held at the stat: it may grow meanwhile
    while left > 0:
        try:
            if use_range:
                n = os.copy_file_range(src, out, min(left, 1 << 30))
            else:
                n = os.sendfile(out, src, None, min(left, 1 << 30))
        except OSError as e:
            if use_range and e.errno in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                use_range = False  # another filesystem (tmpfs to tmpfs): sendfile
                continue
            raise
        if n == 0:
            return  # it shrank meanwhile: as it is now
        left -= n


def _settle(fd: int, uid: int | None, st: os.stat_result) -> None:
    """The copy's owner, mode and times, as the source had them when it was read."""
    if uid is not None:
        os.fchown(fd, uid, uid)
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o1777)  # never set-id bits
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
