"""The sandbox interface (DESIGN §5): what every backend gives, whatever isolates it.

A non-zero exit, a timeout, an OOM kill or truncated output is *data* in an
`ExecResult`; only infrastructure faults (the sandbox could not start, died, or a
backend bug) raise `SandboxError`, and those void the episode.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import os
import posixpath
import socket
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Protocol, Self

DEFAULT_MAX_OUTPUT = 64 * 1024
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
# Where a sandbox with `network` reaches the server's egress proxy: 127.0.0.1 of its own
# network namespace, which has no other way out (palaestra.sandbox.netns).
PROXY_PORT = 3128
_PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
PROXY_ENV = {
    **{k: _PROXY_URL for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
    **{k: "localhost,127.0.0.1,::1" for k in ("NO_PROXY", "no_proxy")},
}
# Where a harness episode's sandbox reaches its session model proxy: 127.0.0.1 of its own
# network namespace (a listener the server placed there, as for PROXY_PORT), nothing else.
GATEWAY_PORT = 4000


class SocketService(Protocol):
    """What serves a listening socket the server placed inside a sandbox's network
    namespace: the egress proxy (`network`) and the model gateway (`gateway`). `key` names
    the sandbox (egress) or the session it belongs to (gateway)."""

    async def serve(self, sock: socket.socket, key: str) -> asyncio.Server: ...

    async def close(self, server: asyncio.Server) -> None: ...


def default_cache() -> Path:
    """The cache folder backends build into when the caller names none (the server passes
    its `cache` setting): the exec helper, bwrap image rootfs folders, docker's shell copy."""
    return Path.home() / ".cache" / "palaestra"


class SandboxError(Exception):
    """An infrastructure fault: the episode it happens in ends `void`, never with reward 0."""


class SandboxCreateError(SandboxError):
    """The backend could not create the sandbox."""


class SandboxGone(SandboxError):
    """The sandbox is closed or died (an exec killed it); nothing more can run in it."""


class SandboxSpecError(SandboxCreateError):
    """The spec asks for more than the host allows; the message names the limit."""


# The most a file read or a workspace download takes in, as a multiple of workspace_mb: no
# real file can exceed the workspace (RLIMIT_FSIZE, the tmpfs size), so more is sparse
# files or hard links the agent made; and the deepest tree a download walks.
DOWNLOAD_SLACK_MB = 16
MAX_TREE_DEPTH = 128


class AgentFault(Exception):
    """A fault the agent's own actions caused (DESIGN §3): the episode ends `ok` with reward
    0 and `failure` (a class of sdk.models.FAILURE_CLASSES) in its verdict, never `void`."""

    failure: str = "bad_path"

    def __init__(self, message: str, failure: str | None = None) -> None:
        super().__init__(message)
        if failure is not None:
            self.failure = failure


class SandboxPathError(SandboxError, AgentFault, ValueError):
    """A path escapes the workspace or names something that is not a regular file.

    The workspace's contents are the agent's, so this is an `AgentFault` (a 422 in a step,
    reward 0 in verification); it stays a SandboxError for callers that catch those."""


class WorkspaceFault(SandboxError, AgentFault):
    """A sandbox operation failed because of the state the agent's own processes left in
    its sandbox (docs/reference/episodes.md, "The agent cannot void its episode"): its workspace is
    full, its processes fill the process limit, it made its files unreadable. An agent
    fault (reward 0 with the class, a 422 in a step), never void; a SandboxError still for
    callers that catch those."""


class WorkspaceFull(WorkspaceFault):
    """ENOSPC, EDQUOT, EFBIG or EMLINK writing into the workspace (or into a fresh one from
    a copy of it: sparse files and hard links the agent made take real space there)."""

    failure = "workspace_full"


class ProcessLimit(WorkspaceFault):
    """No process can start in the sandbox: the agent's own processes fill its pids limit."""

    failure = "process_limit"


class MemoryFull(WorkspaceFault):
    """No process can start in the sandbox: its memory limit is held by what the agent
    left there (files in its tmpfs folders, which no OOM kill frees, or its processes)."""

    failure = "oom"


class UnreadableWorkspace(WorkspaceFault):
    """EACCES or EPERM on the workspace: permissions the agent set."""

    failure = "unreadable_workspace"


_AGENT_ERRNOS: dict[int, type[WorkspaceFault]] = {
    errno.ENOSPC: WorkspaceFull,
    errno.EDQUOT: WorkspaceFull,
    errno.EFBIG: WorkspaceFull,
    errno.EMLINK: WorkspaceFull,
    errno.EACCES: UnreadableWorkspace,
    errno.EPERM: UnreadableWorkspace,
}


def workspace_fault(exc: OSError, what: str) -> WorkspaceFault | None:
    """The agent fault an OSError met on a sandbox's workspace stands for, or None (then it
    is ours: a missing file stays FileNotFoundError, anything else a SandboxError)."""
    kind = _AGENT_ERRNOS.get(exc.errno or 0)
    if kind is None:
        return None
    return kind(f"{what}: {exc.strerror or exc}")


@contextlib.contextmanager
def workspace_errors(what: str) -> Iterator[None]:
    """Raise `workspace_fault` of an OSError met inside (see there); others pass."""
    try:
        yield
    except OSError as exc:
        fault = workspace_fault(exc, what)
        if fault is None:
            raise
        raise fault from exc


class SandboxFileTooLarge(SandboxPathError):
    """A file or a download is over what the reader takes in (a sparse file, hard links)."""

    failure = "too_large"


class SandboxTreeTooDeep(SandboxPathError):
    """A download met a tree nested deeper than MAX_TREE_DEPTH."""

    failure = "too_deep"


def upload_member(m: tarfile.TarInfo, links_out: bool = False) -> str | None:
    """Every backend's rule for a member of an uploaded tar: its normalised name (None for
    the archive's root, "."), or SandboxPathError when it escapes its destination (an
    absolute or ``..`` name, a symlink pointing out of it) or is not a directory, regular
    file or symlink (hard links, devices). `links_out`: a symlink may point anywhere (a
    checkpoint's own tar restored as it was; an unpack that never follows a link)."""
    name = posixpath.normpath(m.name)
    if name == ".":
        return None
    if name.startswith("/") or name == ".." or name.startswith("../") or "\0" in name:
        raise SandboxPathError(f"tar member {m.name!r} escapes the destination")
    if m.issym():
        if links_out:
            return name
        target = m.linkname
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise SandboxPathError(f"tar symlink {m.name!r} -> {target!r} escapes")
    elif not (m.isdir() or m.isreg()):
        raise SandboxPathError(f"tar member {m.name!r}: unsupported type (links/devices)")
    return name


def read_limit(spec: SandboxSpec) -> int:
    """The most bytes `read_file` or `download_tar` of a sandbox of `spec` takes in."""
    return (spec.workspace_mb + DOWNLOAD_SLACK_MB) << 20


def transfer_limit(spec: SandboxSpec, limit: int | None) -> int:
    """The byte cap of one tar moved out of or into a sandbox of `spec`: `read_limit`, lower
    where the caller asks for less."""
    cap = read_limit(spec)
    return cap if limit is None else min(cap, limit)


def too_large(limit: int, what: str) -> SandboxFileTooLarge:
    """The agent fault of a tar over `limit` (sparse files, hard links or too many entries
    the agent made: no real workspace outgrows it); the message names the limit."""
    return SandboxFileTooLarge(
        f"{what} is over its limit of {limit} bytes ({limit >> 20} MiB: the sandbox's "
        f"workspace_mb plus {DOWNLOAD_SLACK_MB} MiB): sparse files, hard links or too many "
        "entries"
    )


def spool_file(folder: Path) -> BinaryIO:
    """An anonymous file in `folder`, the server's own tmp dir (never a path a sandbox sees):
    a workspace in transit sits there, not in server memory, and is gone once closed or if
    the server dies (O_TMPFILE: it never has a name)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return tempfile.TemporaryFile(dir=folder)


TAR_CHUNK = 1 << 20  # what a copy of a file into or out of a tar holds at once


class TarTarget(Protocol):
    """What a tar is written into: a file, or a wrapper of one."""

    def read(self, size: int, /) -> bytes: ...

    def write(self, data: bytes, /) -> int: ...

    def tell(self) -> int: ...

    def seek(self, pos: int, /) -> object: ...

    def close(self) -> object: ...


def tar_writer(out: TarTarget) -> tarfile.TarFile:
    """A plain tar written into `out` that copies a file's contents TAR_CHUNK at a time."""
    return tarfile.TarFile(fileobj=out, mode="w", copybufsize=TAR_CHUNK)


def forget_members(tf: tarfile.TarFile) -> None:
    """Drop the list of members tarfile keeps of all it read or wrote (call after each):
    a tar of a million entries would otherwise hold them all in memory."""
    tf.members.clear()  # type: ignore[attr-defined]


def tar_members(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members of `tf`, read one at a time and none kept (`forget_members`)."""
    while (m := tf.next()) is not None:
        forget_members(tf)
        yield m


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox should look like; equal specs may share a warm pool.

    `image` None means the host's system directories, read-only.
    """

    image: str | None = None
    workdir: str = "/work"
    workspace_mb: int = 64
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 256
    # Egress only through the server's allow-list proxy (palaestra.sandbox.egress), never
    # open: the sandbox keeps its own network namespace with no route out. False: no network.
    network: bool = False
    # With `network`: the only hosts it may reach (host or *.domain, each also on the
    # operator's list; a task's own allow-list). Empty: the operator's list as is.
    egress_hosts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    default_timeout_s: float = 30.0
    # Host directories bound read-only inside, as (host path, sandbox path): a toolchain a
    # family needs (the cad family's trimesh/bpy site-packages). Never the server's files.
    ro_binds: tuple[tuple[str, str], ...] = ()
    # Harness mode: the key of a model-proxy session. The sandbox gets a network namespace
    # of its own whose only listener is 127.0.0.1:GATEWAY_PORT, served by the backend's
    # gateway (a `SocketService`) for this key; combined with `network` it is refused.
    gateway: str | None = None
    # The terminal verifier's sandbox: its processes may ptrace their own children (the exec
    # guard, verifiers/programs/exec_guard.py, traces the checker's tree; every process in
    # that tree is traced, so none can be attached by another). Denied everywhere else.
    traces_execs: bool = False


_RESERVED_TARGETS = ("/proc", "/dev", "/tmp", "/etc", "/usr", "/run/palaestra", "/.palaestra")


def check_ro_binds(spec: SandboxSpec) -> None:
    """Every backend's check of `spec.ro_binds`: each names an existing host directory and a
    fresh absolute target that shadows nothing the sandbox is built from (its workdir, /usr,
    /etc, /proc, /dev, /tmp)."""
    work = posixpath.normpath(spec.workdir)
    for host, target in spec.ro_binds:
        if not posixpath.isabs(host) or not os.path.isdir(host):
            raise SandboxSpecError(f"ro_binds: host path {host!r} is not an existing directory")
        if os.path.realpath(host) == "/":
            raise SandboxSpecError(f"ro_binds: host path {host!r} is the host root; never bound")
        t = posixpath.normpath(target)
        if not posixpath.isabs(target) or t == "/":
            raise SandboxSpecError(f"ro_binds: target {target!r} must be an absolute path below /")
        for reserved in (*_RESERVED_TARGETS, work):
            if t == reserved or t.startswith(reserved + "/") or reserved.startswith(t + "/"):
                raise SandboxSpecError(f"ro_binds: target {target!r} would shadow {reserved}")


MAX_GATEWAY_KEY = 256


def check_gateway(spec: SandboxSpec, service: SocketService | None, backend: str) -> None:
    """A backend's check of `spec.gateway`: a non-empty key, never with `network` (the
    namespace holds one listener), a backend made with the gateway service, and a root
    server (it places the listener in the sandbox's network namespace)."""
    key = spec.gateway
    if key is None:
        return
    if not key or len(key) > MAX_GATEWAY_KEY or not key.isprintable():
        raise SandboxSpecError(
            f"gateway: the session key must be 1-{MAX_GATEWAY_KEY} printable characters"
        )
    if spec.network:
        raise SandboxSpecError(
            "gateway with network=True: a harness sandbox reaches only its model gateway;"
            " drop network (the task's internet access) or the gateway"
        )
    if service is None:
        raise SandboxSpecError(
            f"gateway: this {backend} backend was made without the server's model gateway"
            " service (make_backend(settings, gateway=...)), so no sandbox can reach it"
        )
    if os.geteuid() != 0:
        raise SandboxSpecError(
            "gateway: the model gateway needs the server to run as root (it places the"
            " gateway's socket in the sandbox's network namespace)"
        )


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed


@dataclass
class ShellResult:
    """One command's result in a persistent shell session.

    `timed_out` covers both limits; `idle_timed_out` says it was the idle-output one.
    `restarted` says the shell had died (`exit`, `exec`, killed) and a fresh one now runs:
    its cwd and variables are back to the start.
    """

    output: str
    exit_code: int
    cwd: str
    timed_out: bool = False
    idle_timed_out: bool = False
    truncated: bool = False
    restarted: bool = False
    duration_s: float = 0.0


class ShellSession(abc.ABC):
    """A long-lived shell inside a sandbox: state (cwd, variables) survives between runs."""

    @abc.abstractmethod
    async def run(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ShellResult:
        """Run `cmd` in the shell; on a timeout, interrupt then kill its foreground group."""

    @abc.abstractmethod
    async def interrupt(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


def command_argv(cmd: list[str] | str) -> list[str]:
    """An exec's argv: a string runs under `/bin/sh -c`."""
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise ValueError("empty command")
    return argv


def sandbox_env(
    spec: SandboxSpec, workdir: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The whole environment a command sees in every backend: a fixed base, then the spec's,
    then the exec's own variables. Nothing of the server's environment."""
    env = {"PATH": BASE_PATH, "HOME": workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if spec.network:
        env.update(PROXY_ENV)
    env.update(dict(spec.env))
    env.update(extra or {})
    return env


async def close_all(sandboxes: set[Any]) -> None:
    """Close every sandbox a backend still tracks (its `aclose`); errors do not stop the rest."""
    boxes = list(sandboxes)
    await asyncio.gather(*(b.close() for b in boxes), return_exceptions=True)
    sandboxes.clear()


class Sandbox(abc.ABC):
    """One isolated place where untrusted code runs. `close()` is idempotent."""

    spec: SandboxSpec
    id: str

    @abc.abstractmethod
    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        """Run `cmd` (argv, or a string for `/bin/sh -c`).

        Returns once every process it started is dead."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a regular file; relative paths are under the workdir. Raises FileNotFoundError."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None: ...

    @abc.abstractmethod
    async def upload_tar(self, data: bytes, dest: str | None = None) -> None: ...

    @abc.abstractmethod
    async def download_tar(self, path: str | None = None) -> bytes: ...

    async def download_tar_to(
        self, out: BinaryIO, path: str | None = None, *, limit: int | None = None
    ) -> int:
        """Write a tar of `path` (default the workdir), as `download_tar` makes it, into
        `out` (a `spool_file`) as it is read, so a workspace never sits whole in server
        memory; returns the bytes written. Past `transfer_limit` it stops with
        SandboxFileTooLarge naming the limit (the agent's files: reward 0, never void).

        This default, for a backend that cannot stream, holds the tar in memory once."""
        cap = transfer_limit(self.spec, limit)
        data = await self.download_tar(path)
        if len(data) > cap:
            raise too_large(cap, f"the tar of {path or self.spec.workdir!r}")
        await asyncio.to_thread(out.write, data)
        return len(data)

    async def upload_tar_from(
        self, src: BinaryIO, dest: str | None = None, *, limit: int | None = None
    ) -> None:
        """Unpack the tar in `src` (a seekable file, read from its start) into `dest`, with
        `upload_tar`'s rules, without reading it whole into server memory; SandboxFileTooLarge
        past `transfer_limit`.

        This default, for a backend that cannot stream, reads it into memory once."""
        cap = transfer_limit(self.spec, limit)
        src.seek(0)
        data = await asyncio.to_thread(src.read, cap + 1)
        if len(data) > cap:
            raise too_large(cap, "the tar to unpack")
        await self.upload_tar(data, dest)

    async def copy_workspace_from(self, src: Sandbox, spool_dir: Path) -> None:
        """Fill this fresh sandbox's workdir with a copy of `src`'s (a fork, `Backend.fork`);
        `src` goes on unchanged. This default moves a tar through a spool file in
        `spool_dir` (never whole in server memory); a backend that can copy on the host
        does it there. A copy over the limit is the agent's (SandboxFileTooLarge)."""
        with spool_file(spool_dir) as f:
            await src.download_tar_to(f)
            await self.upload_tar_from(f)

    async def restore_workspace(self, src: BinaryIO) -> None:
        """Fill this fresh sandbox's workdir from a tar `download_tar_to` made of another's
        (an episode's checkpoint, resumed): `upload_tar_from` by default; a backend whose
        upload refuses what a download keeps (docker: absolute symlinks) unpacks it as it
        was, as `copy_workspace_from` does."""
        await self.upload_tar_from(src)

    async def shell(self) -> ShellSession:
        raise SandboxError(f"{type(self).__name__} has no persistent shell yet")

    @abc.abstractmethod
    async def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    def cpu_seconds(self) -> float | None:
        """CPU time this sandbox's processes used so far (None: the backend has no counter);
        the server bills it to the episode's token (server/tenancy.py)."""
        return None

    async def agent_fault(self) -> WorkspaceFault | None:
        """Why an operation that failed with a SandboxError failed, when the state the
        agent's processes left explains it (its processes fill the pids limit, its
        workspace is full); None when it does not (then the fault is ours: void)."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.close())


class Backend(abc.ABC):
    """Creates sandboxes of one kind (bwrap, docker, e2b)."""

    name: str

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    @property
    def live_count(self) -> int:
        """Sandboxes created and not yet closed (for metrics)."""
        return 0

    async def fork(self, box: Sandbox, spool_dir: Path) -> Sandbox:
        """A new sandbox of `box`'s spec whose workdir is a copy of `box`'s; `box` goes on
        unchanged (`POST /v1/episodes/{id}/fork`). Made by `create`, so a warm pool in
        front hands out a ready one, then filled by `copy_workspace_from`. The workdir is
        what a sandbox keeps between execs on every backend (docker's root is read-only,
        so a `docker commit` would capture nothing of it: docs/decisions.md)."""
        new = await self.create(box.spec)
        try:
            await new.copy_workspace_from(box, spool_dir)
        except BaseException:
            await asyncio.shield(new.close())
            raise
        return new

    async def aclose(self) -> None:
        """Release backend-wide resources (pools, clients)."""


@dataclass
class BackendInfo:
    name: str
    available: bool
    reason: str = ""
    details: dict[str, str] = field(default_factory=dict)
