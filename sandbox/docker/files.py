"""A docker sandbox's files, through the engine's archive API.

Paths are confined to the workdir (``SandboxPathError`` otherwise).  The engine extracts and
archives as root, but inside the container's own filesystem view (chrooted since docker
19.03): a symlink the sandboxed code planted resolves inside the sandbox's own files, never
the host's.  ``read_file`` refuses anything but a regular file (a symlink is not followed);
uploads are rewritten before they are sent (members owned by 1000, no absolute or ``..``
names, no links escaping the destination, no hard links or devices).  Paths go to the
workspace volume, which the archive API sees (a plain tmpfs mount it would not).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import posixpath
import tarfile
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO

from palaestra.sandbox.base import (
    MAX_TREE_DEPTH,
    SandboxError,
    SandboxGone,
    SandboxPathError,
    SandboxTreeTooDeep,
    WorkspaceFull,
    forget_members,
    tar_members,
    tar_writer,
    too_large,
    upload_member,
)
from palaestra.sandbox.docker.engine import import_docker
from palaestra.sandbox.preamble import SANDBOX_UID

CHUNK = 1 << 20  # what one piece of a tar on its way to or from the engine holds


class ContainerFiles:
    """The file methods of one sandbox: its workspace at `workdir` in `container` (set once
    it runs); reads take in at most `limit` bytes; `running` says whether the container
    still runs (a missing path in a stopped one is the sandbox gone, not a missing file)."""

    def __init__(
        self, sandbox_id: str, workdir: str, limit: int, running: Callable[[], bool]
    ) -> None:
        self.sandbox_id = sandbox_id
        self.workdir = workdir
        self.limit = limit
        self.running = running
        self.container: Any = None

    def rel(self, path: str) -> str:
        """`path` relative to the workdir ("" for the workdir); SandboxPathError if it escapes."""
        if "\0" in path:
            raise SandboxPathError(f"NUL in path {path!r}")
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise SandboxPathError(
                f"path {path!r} is not valid UTF-8 (the docker archive API needs UTF-8 names)"
            ) from None
        norm = posixpath.normpath(posixpath.join(self.workdir, path))
        if norm == self.workdir:
            return ""
        if not norm.startswith(self.workdir + "/"):
            raise SandboxPathError(f"path {path!r} is outside the workspace {self.workdir}")
        return norm[len(self.workdir) + 1 :]

    async def read_file(self, path: str) -> bytes:
        rel = self.rel(path)
        if not rel:
            raise SandboxPathError(f"{path!r} is a directory", "not_regular_file")
        return await asyncio.to_thread(self._read_sync, rel, path)

    def _refuse_links(self, rel: str, shown: str, *, file: bool = False) -> None:
        """SandboxPathError if any component of `rel` is a symlink (or, with `file`, if `rel`
        exists and is not a regular file: a FIFO, socket, device or directory).

        The archive API resolves symlinks inside the container, so a planted `d -> /etc`
        would make `read_file("d/passwd")` read outside the workspace. No untrusted process
        runs between execs (each exec ends by killing them all), so this check cannot race.
        """
        docker = import_docker()
        api = self.container.client.api
        url = api._url("/containers/{0}/archive", self.container.id)
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            here = f"{self.workdir}/{'/'.join(parts[:i])}"
            try:
                res = api.head(url, params={"path": here})
            except Exception as e:
                raise SandboxError(f"docker archive stat {shown!r}: {e}") from e
            if res.status_code == 404:
                return  # the rest does not exist: there is nothing to follow
            if res.status_code >= 400:
                raise SandboxError(f"docker archive stat {shown!r}: HTTP {res.status_code}")
            header = res.headers.get("x-docker-container-path-stat")
            stat = docker.utils.decode_json_header(header) if header else {}
            mode = int(stat.get("mode", 0))
            if mode & _GO_MODE_SYMLINK or stat.get("linkTarget"):
                raise SandboxPathError(
                    f"{shown!r} goes through a symlink ({'/'.join(parts[:i])})",
                    "not_regular_file" if i == len(parts) else "bad_path",
                )
            if file and i == len(parts) and mode & _GO_MODE_NOT_REGULAR:
                raise SandboxPathError(
                    f"{shown!r} exists and is not a regular file", "not_regular_file"
                )

    def _read_sync(self, rel: str, path: str) -> bytes:
        self._refuse_links(rel, path, file=True)
        raw = self._get_archive(f"{self.workdir}/{rel}", path)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
            member = tf.next()
            if member is None or not member.isreg():
                raise SandboxPathError(f"{path!r} is not a regular file", "not_regular_file")
            f = tf.extractfile(member)
            assert f is not None
            return f.read()

    def _get_archive(self, abs_path: str, shown: str) -> bytes:
        """The archive of `abs_path`, at most `read_limit` bytes (SandboxFileTooLarge: more
        is sparse files or hard links the agent made; the stream is dropped unread)."""
        with self._archive(abs_path, shown, self.limit) as stream:
            return stream.read()

    @contextlib.contextmanager
    def _archive(self, abs_path: str, shown: str, limit: int) -> Iterator[_Capped]:
        """The engine's archive of `abs_path` as a file read as it arrives: at most `limit`
        bytes and 1 MiB for the engine's own headers (past them SandboxFileTooLarge naming
        `limit`; the stream is dropped unread); engine errors mapped as the module doc says."""
        docker = import_docker()
        stream: Any = None
        try:
            stream, _ = self.container.get_archive(abs_path, chunk_size=CHUNK)
            yield _Capped(iter(stream), limit, shown)
        except docker.errors.NotFound as e:
            if not self.running():
                raise SandboxGone(f"sandbox {self.sandbox_id}: its container is gone") from e
            raise FileNotFoundError(shown) from e
        except docker.errors.APIError as e:
            msg = str(e.explanation or e)
            if "not a directory" in msg:
                raise FileNotFoundError(shown) from e
            raise SandboxError(f"docker get_archive {shown!r}: {msg}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker get_archive {shown!r}: {e}") from e
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    def _put_archive(self, data: bytes | Iterator[bytes]) -> None:
        """Unpack `data` (a tar, whole or as chunks sent as they come) at the workdir."""
        docker = import_docker()
        try:
            ok = self.container.put_archive(self.workdir, data)
        except docker.errors.NotFound as e:
            raise SandboxGone(f"sandbox {self.sandbox_id}: its container is gone") from e
        except docker.errors.APIError as e:
            msg = str(e.explanation or e)
            if any(why in msg.lower() for why in _FULL):  # the engine's words for ENOSPC...
                raise WorkspaceFull(f"unpacking into the workspace: {msg[-300:]}") from e
            raise SandboxError(f"docker put_archive: {msg}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker put_archive: {e}") from e
        if not ok:
            raise SandboxError("docker put_archive failed")

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        rel = self.rel(path)
        if not rel:
            raise SandboxPathError("cannot write to the workdir itself")
        raw = data.encode() if isinstance(data, str) else data
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            _add_parents(tf, rel, set())
            tf.addfile(_info(rel, tarfile.REGTYPE, mode & 0o777, len(raw)), io.BytesIO(raw))
        await asyncio.to_thread(functools.partial(self._refuse_links, rel, path, file=True))
        await asyncio.to_thread(self._put_archive, buf.getvalue())

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        base = self.rel(dest or ".")
        clean, parents = await asyncio.to_thread(_rewrite_upload, data, base)
        for parent in sorted(parents):
            await asyncio.to_thread(self._refuse_links, parent, parent)
        await asyncio.to_thread(self._put_archive, clean)

    async def upload_tar_from(self, src: BinaryIO, dest: str | None, limit: int) -> None:
        """`upload_tar` of the tar in the seekable file `src`, never whole in memory: one
        pass checks every member (nothing is sent if one is refused), a second sends the
        rewritten tar to the engine as it is made."""
        base = self.rel(dest or ".")
        size = await asyncio.to_thread(src.seek, 0, 2)
        if size > limit:
            raise too_large(limit, "the tar to unpack")
        parents: set[str] = set()
        await asyncio.to_thread(_drain, _rewritten(src, base, parents, contents=False))
        for parent in sorted(parents):
            await asyncio.to_thread(self._refuse_links, parent, parent)
        chunks = _rewritten(src, base, set(), contents=True)
        await asyncio.to_thread(self._put_archive, chunks)

    async def copy_from(self, src: BinaryIO) -> None:
        """A fork's copy (`DockerSandbox.copy_workspace_from`): the tar `download_tar_to` made
        of another sandbox's workdir, unpacked at this one's as it was, symlinks kept
        whatever they point at (the agent made them in its own sandbox; the engine resolves
        links inside the container, and this fresh one runs nothing of the agent's yet).
        A member under a link of the same archive, or one that escapes, is refused."""
        await asyncio.to_thread(self._put_archive, _as_it_was(src, self.workdir))

    async def download_tar(self, path: str | None = None) -> bytes:
        rel = self.rel(path or ".")
        out = io.BytesIO()
        await asyncio.to_thread(self._download_sync, rel, path or ".", out, self.limit)
        return out.getvalue()

    async def download_tar_to(self, out: BinaryIO, path: str | None, limit: int) -> int:
        """`download_tar` into `out`, as the engine sends it: never whole in memory."""
        rel = self.rel(path or ".")
        return await asyncio.to_thread(self._download_sync, rel, path or ".", out, limit)

    def _download_sync(self, rel: str, shown: str, out: BinaryIO, limit: int) -> int:
        if rel:
            self._refuse_links(rel, shown)
        top = posixpath.basename(self.workdir)
        start = out.tell()
        written: dict[str, tuple[int, int]] = {}  # engine's name -> (its data in out, size)
        with (
            self._archive(f"{self.workdir}/{rel}" if rel else self.workdir, shown, limit) as raw,
            tarfile.open(fileobj=raw, mode="r|") as src,
            tar_writer(out) as dst,
        ):
            for m in tar_members(src):
                name = m.name
                if not rel:  # the workdir itself: its entries, relative to it
                    if name == top:
                        continue
                    name = name[len(top) + 1 :] if name.startswith(top + "/") else name
                if name.count("/") >= MAX_TREE_DEPTH:  # as bwrap's walk refuses it
                    raise SandboxTreeTooDeep(
                        f"{name[:200]!r}... is nested deeper than {MAX_TREE_DEPTH} levels"
                    )
                if out.tell() - start + 2 * tarfile.BLOCKSIZE + m.size > limit:
                    raise too_large(limit, f"the download (at {name[:200]!r})")
                if m.isreg():
                    f = src.extractfile(m)
                    assert f is not None
                    ti = _info(name, tarfile.REGTYPE, m.mode & 0o777, m.size, m.mtime)
                    dst.addfile(ti, f)
                    blocks = -(-m.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                    written[m.name] = (out.tell() - blocks, m.size)
                elif m.islnk() and m.linkname in written:  # a file's second name: its own
                    at, size = written[m.linkname]  # file, as bwrap's walk makes it
                    if out.tell() - start + 2 * tarfile.BLOCKSIZE + size > limit:
                        raise too_large(limit, f"the download (at {name[:200]!r})")
                    ti = _info(name, tarfile.REGTYPE, m.mode & 0o777, size, m.mtime)
                    dst.addfile(ti, _Reread(out, at))
                elif m.isdir():
                    dst.addfile(_info(name, tarfile.DIRTYPE, m.mode & 0o777, 0, m.mtime))
                elif m.issym():
                    ti = _info(name, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                    ti.linkname = m.linkname
                    dst.addfile(ti)
                forget_members(dst)
        return out.tell() - start


class _Reread:
    """What `out` (a tar being appended to) holds from `at` on, read back while it grows:
    each read seeks there and back to the end."""

    def __init__(self, out: BinaryIO, at: int) -> None:
        self.out = out
        self.at = at

    def read(self, n: int = -1) -> bytes:
        self.out.seek(self.at)
        data = self.out.read(n)
        self.at += len(data)
        self.out.seek(0, io.SEEK_END)
        return data


class _Capped(io.RawIOBase):
    """The chunks of an engine stream read as a file, at most `limit` bytes and 1 MiB of
    the engine's headers: past them SandboxFileTooLarge naming `limit` (sparse files or hard
    links of the agent's)."""

    def __init__(self, chunks: Iterator[bytes], limit: int, shown: str) -> None:
        super().__init__()
        self.chunks = chunks
        self.limit = limit
        self.shown = shown
        self.seen = 0
        self.buf = b""  # the chunk being read, from `pos` on
        self.pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1, /) -> bytes:
        out: list[bytes] = []
        want = n
        while n < 0 or want > 0:
            if self.pos >= len(self.buf):
                chunk = next(self.chunks, b"")
                if not chunk:
                    break
                self.seen += len(chunk)
                if self.seen > self.limit + (1 << 20):
                    raise too_large(self.limit, f"the archive of {self.shown!r}")
                self.buf, self.pos = chunk, 0
            take = len(self.buf) - self.pos if n < 0 else min(want, len(self.buf) - self.pos)
            out.append(self.buf[self.pos : self.pos + take])
            self.pos += take
            want -= take
        return b"".join(out)


# How the engine words the errnos of a full workspace (base.WorkspaceFull) in an API error.
_FULL = ("no space left on device", "file too large", "disk quota exceeded", "too many links")


# ---- tar members ---------------------------------------------------------------------------


def _info(name: str, kind: bytes, mode: int, size: int = 0, mtime: float | None = None) -> Any:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.size = size
    ti.uid = ti.gid = SANDBOX_UID
    ti.uname = ti.gname = "sandbox"
    ti.mtime = int(time.time() if mtime is None else mtime)
    return ti


def _add_parents(tf: tarfile.TarFile, rel: str, done: set[str]) -> None:
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in done:
            done.add(d)
            tf.addfile(_info(d, tarfile.DIRTYPE, 0o755))


# Go's os.FileMode bits, as the archive API's stat header reports them.
_GO_MODE_SYMLINK = 1 << 27
_GO_MODE_NOT_REGULAR = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21)


def _rewrite_upload(data: bytes, base: str) -> tuple[bytes, set[str]]:
    """The upload as a tar rooted at the workdir, and the parent folders it writes into
    (see `_rewritten`)."""
    parents: set[str] = set()
    clean = b"".join(_rewritten(io.BytesIO(data), base, parents, contents=True))
    return clean, parents


def _rewritten(src: BinaryIO, base: str, parents: set[str], *, contents: bool) -> Iterator[bytes]:
    """The tar in `src` rewritten as one rooted at the workdir, a piece at a time (without
    `contents`, only checked: nothing is read but its headers); the parent folders it writes
    into are added to `parents`.

    SandboxPathError (see the module doc) for escapes, including a member that goes
    through a symlink of the same archive (`s1 -> .`, `s1/s2 -> ..`, `s1/s2/x`); the
    caller checks the parents for symlinks already in the container.
    """
    done: set[str] = set()
    links: set[str] = set()
    src.seek(0)
    with tarfile.open(fileobj=src, mode="r:*") as tf:
        if base:
            yield from _parent_blocks(base + "/x", done)
        for m in tar_members(tf):
            name = upload_member(m)
            if name is None:
                continue
            full = f"{base}/{name}" if base else name
            above = [posixpath.join(*full.split("/")[:i]) for i in range(1, full.count("/") + 1)]
            if any(p in links for p in above):
                raise SandboxPathError(f"tar member {m.name!r} goes through a symlink")
            if above:
                parents.add(above[-1])
            yield from _parent_blocks(full, done)
            if m.isdir():
                if full not in done:
                    done.add(full)
                    yield _header(_info(full, tarfile.DIRTYPE, (m.mode & 0o777) | 0o700))
            elif m.isreg():
                ti = _info(full, tarfile.REGTYPE, (m.mode & 0o777) | 0o600, m.size, m.mtime)
                yield _header(ti)
                if contents:
                    f = tf.extractfile(m)
                    assert f is not None
                    yield from _data_blocks(f, m.size)
            else:  # a symlink inside the destination (upload_member)
                ti = _info(full, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                ti.linkname = m.linkname
                yield _header(ti)
                links.add(full)
    yield bytes(2 * tarfile.BLOCKSIZE)  # the end-of-archive marker


def _as_it_was(src: BinaryIO, workdir: str) -> Iterator[bytes]:
    """The tar in `src` (one of `_download_sync`'s: a workdir's entries, relative) as the
    engine unpacks it at `workdir`, a piece at a time, with its modes and links. A relative
    link climbing above the workdir (`../../tmp`), which the engine refuses to unpack, is
    written as the absolute path it resolves to in the container (`/tmp`)."""
    links: set[str] = set()
    src.seek(0)
    with tarfile.open(fileobj=src, mode="r:") as tf:
        for m in tar_members(tf):
            name = posixpath.normpath(m.name)
            above = [posixpath.join(*name.split("/")[:i]) for i in range(1, name.count("/") + 1)]
            if name.startswith(("/", "../")) or name == ".." or links.intersection(above):
                raise SandboxPathError(f"tar member {m.name!r} escapes the workdir")
            if name == ".":
                continue
            if m.isdir():
                yield _header(_info(name, tarfile.DIRTYPE, m.mode & 0o777, 0, m.mtime))
            elif m.isreg():
                yield _header(_info(name, tarfile.REGTYPE, m.mode & 0o777, m.size, m.mtime))
                f = tf.extractfile(m)
                assert f is not None
                yield from _data_blocks(f, m.size)
            elif m.issym():
                ti = _info(name, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                ti.linkname = _in_container(workdir, name, m.linkname)
                yield _header(ti)
                links.add(name)
    yield bytes(2 * tarfile.BLOCKSIZE)  # the end-of-archive marker


def _in_container(workdir: str, name: str, target: str) -> str:
    """`target` of the link `name` (under `workdir`) as the engine unpacks it: as it is,
    unless it is relative and climbs above the workdir; then the absolute path the kernel
    resolves it to (`..` at `/` stays at `/`; every folder above it in the tar is real)."""
    if target.startswith("/"):
        return target
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved != ".." and not resolved.startswith("../"):
        return target
    return posixpath.normpath(posixpath.join(workdir, posixpath.dirname(name), target))


def _header(ti: tarfile.TarInfo) -> bytes:
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _parent_blocks(rel: str, done: set[str]) -> Iterator[bytes]:
    """The headers of the folders above `rel` not yet in the tar (`done`)."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in done:
            done.add(d)
            yield _header(_info(d, tarfile.DIRTYPE, 0o755))


def _data_blocks(f: IO[bytes], size: int) -> Iterator[bytes]:
    """`size` bytes of `f` in chunks, padded to whole tar blocks."""
    left = size
    while left > 0:
        chunk = f.read(min(left, CHUNK))
        if not chunk:
            raise SandboxError("the tar to unpack ended inside a member")
        left -= len(chunk)
        yield chunk
    if size % tarfile.BLOCKSIZE:
        yield bytes(tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)


def _drain(chunks: Iterator[bytes]) -> None:
    for _ in chunks:
        pass
