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
import functools
import io
import posixpath
import tarfile
import time
from collections.abc import Callable
from typing import Any

from palaestra.sandbox.base import (
    MAX_TREE_DEPTH,
    SandboxError,
    SandboxFileTooLarge,
    SandboxGone,
    SandboxPathError,
    SandboxTreeTooDeep,
    WorkspaceFull,
    upload_member,
)
from palaestra.sandbox.docker.engine import import_docker
from palaestra.sandbox.preamble import SANDBOX_UID


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
        docker = import_docker()
        limit = self.limit + (1 << 20)
        try:
            stream, _ = self.container.get_archive(abs_path)
            chunks, size = [], 0
            for chunk in stream:
                size += len(chunk)
                if size > limit:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()
                    raise SandboxFileTooLarge(f"{shown!r}: the archive is over {limit} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
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

    def _put_archive(self, data: bytes) -> None:
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

    async def download_tar(self, path: str | None = None) -> bytes:
        rel = self.rel(path or ".")
        return await asyncio.to_thread(self._download_sync, rel, path or ".")

    def _download_sync(self, rel: str, shown: str) -> bytes:
        if rel:
            self._refuse_links(rel, shown)
        raw = self._get_archive(f"{self.workdir}/{rel}" if rel else self.workdir, shown)
        top = posixpath.basename(self.workdir)
        out = io.BytesIO()
        with (
            tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as src,
            tarfile.open(fileobj=out, mode="w") as dst,
        ):
            for m in src:
                name = m.name
                if not rel:  # the workdir itself: its entries, relative to it
                    if name == top:
                        continue
                    name = name[len(top) + 1 :] if name.startswith(top + "/") else name
                if name.count("/") >= MAX_TREE_DEPTH:  # as bwrap's walk refuses it
                    raise SandboxTreeTooDeep(
                        f"{name[:200]!r}... is nested deeper than {MAX_TREE_DEPTH} levels"
                    )
                if m.isreg():
                    f = src.extractfile(m)
                    assert f is not None
                    ti = _info(name, tarfile.REGTYPE, m.mode & 0o777, m.size, m.mtime)
                    dst.addfile(ti, f)
                elif m.isdir():
                    dst.addfile(_info(name, tarfile.DIRTYPE, m.mode & 0o777, 0, m.mtime))
                elif m.issym():
                    ti = _info(name, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                    ti.linkname = m.linkname
                    dst.addfile(ti)
        return out.getvalue()


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
    """The upload as a tar rooted at the workdir, and the parent folders it writes into.

    SandboxPathError (see the module doc) for escapes, including a member that goes
    through a symlink of the same archive (`s1 -> .`, `s1/s2 -> ..`, `s1/s2/x`); the
    caller checks the parents for symlinks already in the container.
    """
    out = io.BytesIO()
    done: set[str] = set()
    links: set[str] = set()
    parents: set[str] = set()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as src,
        tarfile.open(fileobj=out, mode="w") as dst,
    ):
        if base:
            _add_parents(dst, base + "/x", done)
        for m in src:
            name = upload_member(m)
            if name is None:
                continue
            full = f"{base}/{name}" if base else name
            above = [posixpath.join(*full.split("/")[:i]) for i in range(1, full.count("/") + 1)]
            if any(p in links for p in above):
                raise SandboxPathError(f"tar member {m.name!r} goes through a symlink")
            if above:
                parents.add(above[-1])
            _add_parents(dst, full, done)
            if m.isdir():
                if full not in done:
                    done.add(full)
                    dst.addfile(_info(full, tarfile.DIRTYPE, (m.mode & 0o777) | 0o700))
            elif m.isreg():
                f = src.extractfile(m)
                assert f is not None
                ti = _info(full, tarfile.REGTYPE, (m.mode & 0o777) | 0o600, m.size, m.mtime)
                dst.addfile(ti, f)
            else:  # a symlink inside the destination (upload_member)
                ti = _info(full, tarfile.SYMTYPE, 0o777, 0, m.mtime)
                ti.linkname = m.linkname
                dst.addfile(ti)
                links.add(full)
    return out.getvalue(), parents
