"""`BwrapSandbox`: one sandbox of the bwrap backend, its lifecycle and its execs.

Each sandbox owns a host directory ``<runtime_root>/<id>/`` holding ``ws/``, the workspace: a
size-limited tmpfs when we run as root (a plain directory otherwise), bound read-write at
``spec.workdir``; one cgroup (memory, pids, CPU) where cgroups are usable.  Every exec is one
bwrap jail (`palaestra.sandbox.bwrap.jail`) with every namespace unshared, so when the
command exits every process it started dies with its pid namespace.  An exec can only kill
the *sandbox* by destroying what persists between execs -- the workspace mount or the
cgroup: after each exec (and before one) both must still be there, else the sandbox is
closed and `SandboxGone` raised.  OOM kills and timeouts leave it usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import posixpath
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from palaestra.sandbox import exechelper, netns
from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    ExecResult,
    ProcessLimit,
    Sandbox,
    SandboxCreateError,
    SandboxError,
    SandboxGone,
    SandboxSpec,
    SandboxSpecError,
    SocketService,
    WorkspaceFault,
    WorkspaceFull,
    read_limit,
    too_large,
    transfer_limit,
    workspace_errors,
)
from palaestra.sandbox.bwrap.files import Workspace
from palaestra.sandbox.bwrap.fork import copy_workspace
from palaestra.sandbox.bwrap.host import (
    default_runtime_base,
    host_cpus,
    is_root,
    log_once,
)
from palaestra.sandbox.bwrap.jail import (
    KILL_GRACE_S,
    Jail,
    JailBudget,
    JailDied,
    Jails,
    took_command,
)
from palaestra.sandbox.bwrap.launch import Launcher, LimitMode, resolve_limits
from palaestra.sandbox.bwrap.mounts import (
    mount_tmpfs,
    reachable_binds,
    reachable_source,
    remove_tree,
    static_args,
    write_etc_files,
    write_etc_tree,
)
from palaestra.sandbox.bwrap.run import run_stub, supervise
from palaestra.sandbox.bwrap.shell import open_shell
from palaestra.sandbox.bwrap.spec import check_env, resolve_image
from palaestra.sandbox.cgroups import Cgroup, CgroupManager
from palaestra.sandbox.egress import EgressProxy
from palaestra.sandbox.preamble import SANDBOX_UID, memory_error, prepare_exec
from palaestra.sandbox.shell import BashSession
from palaestra.sandbox.spawn import killpg

log = logging.getLogger("palaestra.sandbox.bwrap")


class BwrapSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        *,
        images_dir: Path,
        bwrap: str = "/usr/bin/bwrap",
        runtime_dir: Path | None = None,
        host_uid: int = SANDBOX_UID,
        limits: LimitMode = "auto",
        on_close: Callable[[BwrapSandbox], None] | None = None,
        cgroups: CgroupManager | None = None,
        seccomp_filter: bool = True,
        helper: Path | None = None,
        prespawn: bool = True,
        jails: JailBudget | None = None,
        egress: EgressProxy | None = None,
        gateway: SocketService | None = None,
    ) -> None:
        if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) == "/":
            raise SandboxSpecError(f"workdir must be an absolute path below /: {spec.workdir!r}")
        self.spec = spec
        self._image = resolve_image(spec.image, images_dir) if spec.image is not None else None
        self._cgroups = cgroups
        self.cgroup: Cgroup | None = None
        self._seccomp = seccomp_filter
        self._ws_dev: int | None = None
        # Execs (and other users, such as a persistent shell) running in the cgroup now: a
        # timed-out exec kills the whole cgroup only when it is the only one.
        self.cgroup_users = 0
        self.id = secrets.token_hex(8)
        self._bwrap = bwrap
        if runtime_dir is None:
            runtime_dir = default_runtime_base() / str(os.getpid())
        self.root = runtime_dir / self.id
        self.workspace = self.root / "ws"
        self.workdir = posixpath.normpath(spec.workdir)
        # The synthetic /etc files depend only on the workdir: written once, shared read-only.
        tag = hashlib.sha256(self.workdir.encode()).hexdigest()[:12]
        self._etc = runtime_dir / f"etc-{tag}"
        self._as_root = is_root()
        # Host uid the sandboxed code runs as (None: whatever we are).
        self.host_uid: int | None = host_uid if self._as_root else None
        self._limits: LimitMode = resolve_limits(limits)
        self._on_close = on_close
        self._mounted = False
        self.mount_error = ""
        self.tmpfs = False  # whether the workspace is a size-limited tmpfs
        self._closed = False
        self.procs: set[asyncio.subprocess.Process] = set()
        self.launcher: Launcher | None = None  # once set up
        self.files = Workspace(self.workspace, self.workdir, self.host_uid, read_limit(spec))
        # The exec helper (palaestra.sandbox.exechelper): with it, every exec's bwrap jail
        # is started by its launcher and its stub receives the command once the jail is up.
        self._helper = helper
        # With spec.network or spec.gateway: the namespace every jail joins (its fd), the
        # one listener in it (the egress proxy's or the gateway's) and its server.
        self._listener = netns.listener_for(spec, self.id, egress, gateway)
        self._netns_fd: int | None = None
        self._listener_server: asyncio.Server | None = None
        self.jails = Jails(
            self.id,
            workdir=self.workdir,
            helper=helper,
            prespawn=prespawn,
            budget=jails if jails is not None else JailBudget(1),
        )

    @property
    def image(self) -> Path | None:
        """The rootfs this sandbox runs on (None: the host's /usr), as bwrap reaches it."""
        return self._image

    # ---- lifecycle -------------------------------------------------------------------------

    async def setup(self) -> None:
        """Make the workspace, /etc and cgroup, and the argv every jail starts with."""
        try:
            self.root.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
            self.root.mkdir(mode=0o711)
            os.chmod(self.root, 0o711)
            self.workspace.mkdir(mode=0o700)
            if not (self._etc / "hosts").exists():
                self._etc.mkdir(mode=0o755, exist_ok=True)
                os.chmod(self._etc, 0o755)
                write_etc_files(self._etc, self.workdir)
        except OSError as e:
            raise SandboxCreateError(f"cannot create sandbox dir {self.root}: {e}") from e
        etc_tree: Path | None = None
        if self._image is None:
            etc_tree = self._etc / "etc"
            if not self._etc.joinpath("etc").is_dir():
                try:
                    etc_tree = await asyncio.to_thread(write_etc_tree, self._etc)
                except OSError as e:
                    log_once(logging.WARNING, f"bwrap: /etc as one folder failed ({e}); "
                             "binding its files one by one")  # fmt: skip
                    etc_tree = None
        if self._as_root:
            mb = self.spec.workspace_mb
            opts = f"size={mb}m,nr_inodes={max(8192, mb * 256)}"
            opts += f",mode=0755,uid={self.host_uid},gid={self.host_uid}"
            self.mount_error = mount_tmpfs(self.workspace, opts)
            self._mounted = self.tmpfs = not self.mount_error
        if not self.tmpfs:
            if self.host_uid is not None:
                os.chown(self.workspace, self.host_uid, self.host_uid)
                os.chmod(self.workspace, 0o755)
            else:
                os.chmod(self.workspace, 0o777)
        self._ws_dev = os.stat(self.workspace).st_dev
        if self._cgroups is not None:
            cpus = self.spec.cpus if self.spec.cpus < host_cpus() else None
            try:
                self.cgroup = await asyncio.to_thread(
                    self._cgroups.create,
                    self.id,
                    self.spec.memory_mb << 20,
                    self.spec.pids,
                    cpus,
                )
            except OSError as e:
                raise SandboxCreateError(f"cannot create the sandbox's cgroup: {e}") from e
        runtime_dir = self.root.parent
        if self._image is not None:
            self._image = reachable_source(self._image, runtime_dir, self.host_uid, "img")
        binds = reachable_binds(self.spec.ro_binds, runtime_dir, self.host_uid)
        self.jails.static = static_args(
            self._bwrap,
            self.spec,
            image=self._image,
            etc=self._etc,
            etc_tree=etc_tree,
            workspace=self.workspace,
            binds=binds,
        )
        ns: str | None = None
        if (lst := self._listener) is not None:
            self._netns_fd, sock = await asyncio.to_thread(netns.new_netns, lst.port)
            try:
                self._listener_server = await lst.service.serve(sock, lst.key)
            except BaseException:
                sock.close()
                raise
            ns = f"/proc/{os.getpid()}/fd/{self._netns_fd}"
        self.launcher = self.jails.launcher = Launcher(
            self.spec, self._limits, self.cgroup, self.host_uid, self._helper, self._seccomp, ns
        )
        # No jail yet: a first exec right after create is one bwrap with its command on the
        # command line (the cold path); a warm pool starts one with `wait_ready`.

    def lost(self) -> str:
        """Why the sandbox is dead although not closed ("" while it is intact)."""
        try:
            st = os.stat(self.workspace)
        except OSError:
            return "its workspace is gone"
        if self._ws_dev is not None and st.st_dev != self._ws_dev:
            return "its workspace was unmounted"
        if self.cgroup is not None and not self.cgroup.exists():
            return "its cgroup was removed"
        return ""

    async def gone(self, why: str) -> SandboxGone:
        """Close the sandbox that died (`why`); the error to raise."""
        await self.close()
        return SandboxGone(f"sandbox {self.id} died: {why}")

    @property
    def alive(self) -> bool:
        return not self._closed

    def check_alive(self) -> None:
        if self._closed:
            raise SandboxGone(f"sandbox {self.id} is closed")

    def cpu_seconds(self) -> float | None:
        """CPU time this sandbox's processes used so far, from its cgroup (None: no counter);
        the server bills it to the episode's token (server/tenancy.py)."""
        return self.cgroup.cpu_seconds() if self.cgroup is not None else None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = self.jails.closed = True
        for proc in list(self.procs):
            killpg(proc)
        self.jails.drop_next()
        await self.jails.drain(KILL_GRACE_S)
        server, self._listener_server = self._listener_server, None
        if server is not None and self._listener is not None:
            await self._listener.service.close(server)
        fd, self._netns_fd = self._netns_fd, None
        if fd is not None:
            os.close(fd)
        mounted, self._mounted = self._mounted, False
        cg, self.cgroup = self.cgroup, None
        if cg is not None:
            await asyncio.to_thread(cg.remove)
        await asyncio.to_thread(remove_tree, self.root, self.workspace if mounted else None)
        if self._on_close is not None:
            self._on_close(self)

    async def wait_ready(self) -> None:
        """Start the next exec's jail now and wait until it is up: a warm pool calls this
        before it pools the sandbox, so a hand-out's first exec is one ``execve``.
        SandboxError if it cannot come up (nothing to do without the exec helper, or when
        the backend's `max_ready_jails` are all taken)."""
        self.check_alive()
        await self.jails.wait_ready()

    async def shell(self) -> BashSession:
        """A persistent bash (`palaestra.sandbox.bwrap.shell`)."""
        return await open_shell(self)

    # ---- exec ------------------------------------------------------------------------------

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
        try:
            return await self._exec(cmd, timeout, cwd, env, stdin, max_output)
        except (SandboxGone, WorkspaceFault):
            raise
        except SandboxError as exc:  # bwrap could not start: the agent's fork bomb?
            fault = await self.agent_fault()
            if fault is None:
                raise
            raise fault from exc

    async def _exec(
        self,
        cmd: list[str] | str,
        timeout: float | None,
        cwd: str | None,
        env: dict[str, str] | None,
        stdin: bytes | str | None,
        max_output: int,
    ) -> ExecResult:
        if self._closed:
            raise SandboxGone(f"sandbox {self.id} is closed")
        x = prepare_exec(
            self.spec, self.workdir, cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin
        )
        if env:
            check_env(env)
        if why := self.lost():
            raise await self.gone(why)
        data = x.stdin
        start = time.monotonic()
        req = b""
        if self._helper is not None:
            req = exechelper.request(x.cwd, x.env, x.argv, data is None)
        try:
            jail = None
            if self._helper is not None:
                jail = await self.jails.take()
            if jail is None:  # cold: one bwrap with the command on its command line
                jail = await self.jails.spawn(x.argv, x.env, x.cwd, data is None)
        except OSError as e:
            if e.errno == errno.E2BIG:
                # The command itself is too big for execve: the caller's doing, so data (as a
                # shell reports it), not an infrastructure fault that would void the episode.
                message = "palaestra: argument list too long (an argument over 128 KiB?)\n"
                return ExecResult(126, "", message, duration_s=time.monotonic() - start)
            raise SandboxError(f"cannot start bwrap: {e}") from e
        try:
            return await self._exec_in(jail, req, data, x.timeout, max_output, start)
        except JailDied as e:
            # The jail started ahead died before it took the command (an OOM kill while it
            # waited, say): nothing ran, so run it once more in a fresh jail.
            log.info("sandbox %s: %s; retrying in a fresh jail", self.id, e)
            try:
                jail = await self.jails.spawn(x.argv, x.env, x.cwd, data is None)
            except OSError as e2:
                raise SandboxError(f"cannot start bwrap: {e2}") from e2
            return await self._exec_in(jail, req, data, x.timeout, max_output, start)

    async def _exec_in(
        self,
        jail: Jail,
        req: bytes,
        data: bytes | None,
        timeout: float,
        max_output: int,
        start: float,
    ) -> ExecResult:
        """Run one exec in `jail` (sending `req` to its stub, if it has one) to its end."""
        if self._closed:
            self.jails.discard(jail)
            raise SandboxGone(f"sandbox {self.id} was closed during exec")
        proc = jail.proc
        cg = self.cgroup
        self.procs.add(proc)
        self.cgroup_users += 1
        closed = self._is_closed
        try:
            oom_before = cg.oom_kills() if cg is not None else 0
            try:
                if jail.ctl is not None:
                    result = await run_stub(
                        jail, req, data, timeout, max_output, start,
                        sandbox_id=self.id, closed=closed,
                    )  # fmt: skip
                else:
                    result = await supervise(
                        proc, data, timeout, max_output, jail.status_r, start,
                        sandbox_id=self.id, closed=closed,
                    )  # fmt: skip
            except SandboxGone:
                raise
            except SandboxError as e:
                if why := self.lost():
                    raise await self.gone(why) from e
                if jail.ctl is not None and not took_command(jail.ctl):
                    raise JailDied(str(e)) from e
                raise
            if cg is not None and self.cgroup is cg:
                if result.timed_out and self.cgroup_users == 1:
                    # The pid namespace is gone with bwrap; this makes sure of it (and takes
                    # the jail started ahead with it, if one is up).
                    self.jails.drop_next()
                    await asyncio.to_thread(cg.kill_all, KILL_GRACE_S)
                result.oom_killed = cg.oom_kills() > oom_before or (
                    not result.timed_out and memory_error(result.stderr)
                )
            if why := self.lost():
                raise await self.gone(why)
            return result
        finally:
            self.cgroup_users -= 1
            if proc.returncode is None and jail.reported:
                # bwrap reported the exit code (its init, and with it every process of the
                # exec, is gone) and now exits by itself: reaped in the background.
                self.jails.reap_later(proc)
            elif proc.returncode is None:
                killpg(proc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_S)
            self.procs.discard(proc)
            jail.release()
            self.jails.schedule_next()

    def _is_closed(self) -> bool:
        return self._closed

    # ---- files -----------------------------------------------------------------------------

    # The workspace's contents and free space are the agent's: an errno they explain
    # (ENOSPC, EACCES, ...) is a WorkspaceFault (base.workspace_errors), never void.
    async def read_file(self, path: str) -> bytes:
        self.check_alive()
        with workspace_errors(f"reading {path!r}"):
            return await asyncio.to_thread(self.files.read, path)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.check_alive()
        raw = data.encode() if isinstance(data, str) else data
        with workspace_errors(f"writing {path!r}"):
            await asyncio.to_thread(self.files.write, self.files.parts(path), raw, mode)

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        self.check_alive()
        with workspace_errors("unpacking into the workspace"):
            await asyncio.to_thread(self.files.upload, data, self.files.parts(dest or "."))

    async def download_tar(self, path: str | None = None) -> bytes:
        self.check_alive()
        with workspace_errors("copying the workspace"):
            return await asyncio.to_thread(self.files.download, self.files.parts(path or "."))

    async def download_tar_to(
        self, out: BinaryIO, path: str | None = None, *, limit: int | None = None
    ) -> int:
        """Stream the tar into `out` a file at a time (`Sandbox.download_tar_to`)."""
        self.check_alive()
        parts = self.files.parts(path or ".")
        cap = transfer_limit(self.spec, limit)
        with workspace_errors("copying the workspace"):
            return await asyncio.to_thread(self.files.download_to, parts, out, cap)

    async def upload_tar_from(
        self, src: BinaryIO, dest: str | None = None, *, limit: int | None = None
    ) -> None:
        """Unpack `src` a member at a time (`Sandbox.upload_tar_from`); a tar over the cap is
        refused before anything is written."""
        self.check_alive()
        parts = self.files.parts(dest or ".")
        cap = transfer_limit(self.spec, limit)
        size = await asyncio.to_thread(_size, src)
        if size > cap:
            raise too_large(cap, "the tar to unpack")
        with workspace_errors("unpacking into the workspace"):
            await asyncio.to_thread(self.files.upload, src, parts)

    async def restore_workspace(self, src: BinaryIO) -> None:
        """A checkpoint's tar as it was, links out of the workspace too (a venv's absolute
        `python`): an upload refuses those, but no write here follows a link."""
        self.check_alive()
        cap = transfer_limit(self.spec, None)
        if await asyncio.to_thread(_size, src) > cap:
            raise too_large(cap, "the tar to unpack")
        with workspace_errors("unpacking into the workspace"):
            await asyncio.to_thread(self.files.upload, src, [], True)

    async def copy_workspace_from(self, src: Sandbox, spool_dir: Path) -> None:
        """From another bwrap sandbox: its workspace folder copied on the host
        (`palaestra.sandbox.bwrap.fork`: reflinks where the filesystem has them), no tar."""
        if not isinstance(src, BwrapSandbox):
            return await super().copy_workspace_from(src, spool_dir)
        self.check_alive()
        src.check_alive()
        try:
            with workspace_errors("copying the workspace"):
                await asyncio.to_thread(
                    copy_workspace, src.workspace, self.workspace, self.host_uid,
                    read_limit(src.spec),
                )  # fmt: skip
        except OSError as e:  # not the agent's (workspace_errors): ours
            raise SandboxError(f"cannot copy the workspace of sandbox {src.id}: {e}") from e

    async def agent_fault(self) -> WorkspaceFault | None:
        """Its processes fill the cgroup's pids limit (a fork bomb left running), or its
        workspace has no free block: the agent's doing (see `Sandbox.agent_fault`)."""
        if self._closed:
            return None
        cg = self.cgroup
        if cg is not None and await asyncio.to_thread(cg.pids_exhausted):
            return ProcessLimit(
                f"no process can start: the sandbox's {self.spec.pids} processes are all "
                "taken by the agent's own (kill its background processes)"
            )
        try:
            st = os.statvfs(self.workspace)
        except OSError:
            return None
        if self.tmpfs and (st.f_bavail == 0 or st.f_favail == 0):
            return WorkspaceFull(f"the workspace ({self.spec.workspace_mb} MB) is full")
        return None


def _size(f: BinaryIO) -> int:
    """The size of the seekable file `f`, whatever its position."""
    return f.seek(0, os.SEEK_END)
