"""`DockerSandbox`: one container per sandbox on the local docker engine.

Each sandbox is a container ``sleep infinity`` under docker's init (tini) that runs as uid
65534, with no network (``network_mode=none``), a read-only root, a size-limited tmpfs at
/tmp, ``mem_limit = memswap_limit = memory_mb``, ``pids_limit``, ``nano_cpus``, every
capability dropped, ``no-new-privileges``, our seccomp profile (`seccomp.docker_profile`: the
bwrap filter's policy plus no new namespaces) in place of the engine's default, no logging,
and a workspace: a tmpfs *volume* (size ``workspace_mb``, owned by uid 1000) at
``spec.workdir`` (a volume, which the archive API sees; `palaestra.sandbox.docker.files`).

Every exec runs as uid/gid 1000 through the wrapper of `palaestra.sandbox.docker.scripts`,
whose sweep kills what the exec left, so when an exec returns nothing it started is left
running, although ``docker exec`` itself has no way to kill what it started.  On a timeout a
second exec runs the same sweep (it works at the pids limit too); if even that exec cannot
start, the container is restarted (its tmpfs workspace and /tmp are remounted empty).  A
timed-out exec returns with ``exit_code=-9`` within about 0.1-0.3 s of its timeout.  Because
of that sweep, execs in one sandbox run one at a time (an asyncio lock).

Output is read from the exec's hijacked HTTP connection with asyncio (the engine's unix
socket; no thread per exec), demultiplexed, and capped at ``max_output`` bytes per stream;
stdin is written to the same connection, then half-closed.  Every blocking docker SDK call
runs in `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
import secrets
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from palaestra.sandbox import netns
from palaestra.sandbox.base import (
    BASE_PATH,
    DEFAULT_MAX_OUTPUT,
    ExecResult,
    MemoryFull,
    ProcessLimit,
    Sandbox,
    SandboxCreateError,
    SandboxError,
    SandboxGone,
    SandboxSpec,
    SocketService,
    WorkspaceFault,
    read_limit,
    sandbox_env,
    spool_file,
    transfer_limit,
)
from palaestra.sandbox.docker.engine import (
    LABEL,
    import_docker,
    owner,
    seccomp_profile,
    socket_path,
)
from palaestra.sandbox.docker.files import ContainerFiles
from palaestra.sandbox.docker.scripts import KILL_LOOP, WRAPPER
from palaestra.sandbox.docker.shell import (
    SHELL_BINARY,
    SHELL_GID_BASE,
    DockerShellProcess,
    shell_binary,
)
from palaestra.sandbox.egress import EgressProxy
from palaestra.sandbox.preamble import (
    NOFILE,
    SANDBOX_UID,
    TIMEOUT_EXIT_CODE,
    append_capped,
    memory_error,
    prepare_exec,
)
from palaestra.sandbox.shell import BashSession
from palaestra.sandbox.shellproc import bootstrap_script
from palaestra.sandbox.spawn import CHUNK

KEEPALIVE_USER = "65534:65534"


class DockerSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        client: Any,
        image: str,
        on_close: Callable[[DockerSandbox], None] | None = None,
        *,
        cache: Path,
        egress: EgressProxy | None = None,
        gateway: SocketService | None = None,
    ) -> None:
        self.spec = spec
        self.id = secrets.token_hex(8)
        # With spec.network or spec.gateway: the one listener the container's own network
        # namespace holds (the egress proxy's or the gateway's), and its server.
        self._listener = netns.listener_for(spec, self.id, egress, gateway)
        self._listener_server: asyncio.Server | None = None
        self.image = image
        self.client = client
        self._cache = cache
        self._workdir = posixpath.normpath(spec.workdir)
        self._volume = f"palaestra-{self.id}"
        self._container: Any = None
        self._on_close = on_close
        self._closed = False
        self._lock = asyncio.Lock()
        self._sock_path = socket_path()
        self._shell_binary: str | None = None  # host path, bound at SHELL_BINARY
        self._next_gid = SHELL_GID_BASE
        self.dead: set[int] = set()  # gids of shells that are gone (swept after each exec)
        self.files = ContainerFiles(self.id, self._workdir, read_limit(spec), self.running)

    @property
    def container_id(self) -> str:
        return str(self._container.id) if self._container is not None else ""

    # ---- lifecycle -------------------------------------------------------------------------

    def create_sync(self) -> None:
        """Create the workspace volume and start the container (blocking: in a thread)."""
        docker = import_docker()
        spec = self.spec
        labels = {LABEL: self.id, **owner()}
        mb = spec.workspace_mb
        inodes = max(8192, mb * 256)
        try:
            self.client.images.get(self.image)  # never a pull: images are built here
            self.client.volumes.create(
                name=self._volume,
                driver="local",
                driver_opts={
                    "type": "tmpfs",
                    "device": "tmpfs",
                    "o": f"size={mb}m,nr_inodes={inodes},uid={SANDBOX_UID},"
                    f"gid={SANDBOX_UID},mode=0755,nosuid,nodev",
                },
                labels=labels,
            )
            env = {"PATH": BASE_PATH, "HOME": self._workdir, "LANG": "C.UTF-8"}
            self._shell_binary = shell_binary(self.client, self.image, self._cache)
            mounts = []
            if self._shell_binary is not None:
                mounts.append(
                    docker.types.Mount(
                        SHELL_BINARY, self._shell_binary, type="bind", read_only=True
                    )
                )
            # A family's toolchains (SandboxSpec.ro_binds), read-only, as bwrap binds them.
            mounts += [
                docker.types.Mount(target, host, type="bind", read_only=True)
                for host, target in spec.ro_binds
            ]
            self._container = self.client.containers.run(
                self.image,
                ["infinity"],
                entrypoint=["sleep"],  # never the image's ENTRYPOINT or CMD (a task's image)
                detach=True,
                init=True,
                user=KEEPALIVE_USER,
                hostname="sandbox",
                working_dir=self._workdir,
                environment=env,
                labels=labels,
                network_mode="none",
                read_only=True,
                # verifier files run from /tmp; its inodes bounded as the workspace's are
                # (tmpfs pages and inodes are charged to the container's memory)
                tmpfs={"/tmp": f"size={mb}m,nr_inodes={inodes},mode=1777,nosuid,nodev,exec"},
                volumes={self._volume: {"bind": self._workdir, "mode": "rw"}},
                mounts=mounts,
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                pids_limit=spec.pids,
                nano_cpus=int(spec.cpus * 1e9),
                cap_drop=["ALL"],
                security_opt=["no-new-privileges", f"seccomp={seccomp_profile(spec.traces_execs)}"],
                ipc_mode="private",
                ulimits=[
                    docker.types.Ulimit(name="nofile", soft=NOFILE, hard=NOFILE),
                    docker.types.Ulimit(name="core", soft=0, hard=0),
                ],
                log_config=docker.types.LogConfig(type="none"),
                stdin_open=False,
                tty=False,
            )
            self.files.container = self._container
        except docker.errors.ImageNotFound as e:
            name = self.image.split("/")[-1].split(":")[0]
            how = "--pack PACK" if name.startswith("env-") else name  # a task's environment
            raise SandboxCreateError(
                f"image {self.image} is not in the local docker engine; build it with "
                f"`palaestra images build {how}` ({e.explanation})"
            ) from e
        except docker.errors.DockerException as e:
            raise SandboxCreateError(f"docker could not create the sandbox: {e}") from e

    def _init_pid(self) -> int:
        self._container.reload()
        state = self._container.attrs.get("State", {})
        pid = state.get("Pid") if state.get("Running") else None
        if not isinstance(pid, int) or pid <= 0:
            raise SandboxCreateError(f"sandbox {self.id}: its container is not running")
        return pid

    async def attach_listener(self) -> None:
        """Serve the spec's listener (the egress proxy on 127.0.0.1:PROXY_PORT, the model
        gateway on 127.0.0.1:GATEWAY_PORT) in the container's own network namespace
        (``network_mode=none``: loopback only), before any exec runs; again after a restart
        (a restarted container has a fresh namespace, and none of the agent's processes)."""
        lst = self._listener
        if lst is None:
            return
        await self._detach_listener()
        pid = await asyncio.to_thread(self._init_pid)
        sock = await asyncio.to_thread(netns.listen_in, pid, lst.port)
        if await asyncio.to_thread(self._init_pid) != pid:  # never another process's
            sock.close()
            raise SandboxCreateError(f"sandbox {self.id}: its container restarted")
        try:
            self._listener_server = await lst.service.serve(sock, lst.key)
        except BaseException:
            sock.close()
            raise

    async def _detach_listener(self) -> None:
        server, self._listener_server = self._listener_server, None
        if server is not None and self._listener is not None:
            await self._listener.service.close(server)

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._detach_listener()
        try:
            await asyncio.to_thread(self._remove_sync)
        finally:
            if self._on_close is not None:
                self._on_close(self)

    def _remove_sync(self) -> None:
        with contextlib.suppress(Exception):
            if self._container is not None:
                self._container.remove(force=True)
        for _ in range(20):
            try:
                self.client.volumes.get(self._volume).remove(force=True)
                return
            except Exception as e:
                if "not found" in str(e).lower() or "no such volume" in str(e).lower():
                    return
                time.sleep(0.05)  # still in use for a moment after the container is gone

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxGone(f"sandbox {self.id} is closed")

    # ---- exec ------------------------------------------------------------------------------

    def _exec_create(
        self, argv: list[str], env: dict[str, str], stdin: bool, gid: int = SANDBOX_UID
    ) -> str:
        docker = import_docker()
        try:
            res = self.client.api.exec_create(
                self._container.id,
                argv,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                environment=env,
                user=f"{SANDBOX_UID}:{gid}",
                workdir=self._workdir,
            )
        except docker.errors.NotFound as e:
            raise SandboxGone(f"sandbox {self.id}: its container is gone") from e
        except docker.errors.APIError as e:
            if e.status_code == 409:  # not running
                raise SandboxGone(f"sandbox {self.id}: {e.explanation}") from e
            raise SandboxError(f"docker exec failed: {e}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker exec failed: {e}") from e
        return str(res["Id"])

    def exec_exit(self, exec_id: str) -> int | None:
        for _ in range(50):
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.01)
        return None

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
        self._check_alive()
        x = prepare_exec(
            self.spec, self._workdir, cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin
        )
        async with self._lock:
            self._check_alive()
            return await self._exec_locked(
                ["/bin/sh", "-c", WRAPPER, "sh", x.cwd, self._dead_gids(), *x.argv],
                x.env,
                x.stdin,
                x.timeout,
                max_output,
            )

    async def _exec_locked(
        self,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        timeout: float,
        max_output: int,
    ) -> ExecResult:
        start = time.monotonic()
        exec_id = await asyncio.to_thread(self._exec_create, argv, env, stdin is not None)
        try:
            reader, writer = await asyncio.open_unix_connection(self._sock_path, limit=CHUNK * 4)
        except OSError as e:
            raise SandboxError(f"cannot reach the docker engine: {e}") from e
        out, err = bytearray(), bytearray()
        truncated = False
        timed_out = False
        try:
            await self._start_exec(reader, writer, exec_id)
            feeder = None
            if stdin is not None:
                feeder = asyncio.create_task(_feed(writer, stdin))

            async def pump() -> None:
                nonlocal truncated
                while True:
                    try:
                        head = await reader.readexactly(8)
                    except asyncio.IncompleteReadError:
                        return
                    kind, size = head[0], struct.unpack(">I", head[4:])[0]
                    payload = await reader.readexactly(size)
                    if append_capped(err if kind == 2 else out, payload, max_output):
                        truncated = True

            remaining = max(0.0, timeout - (time.monotonic() - start))
            pumping = asyncio.ensure_future(pump())
            try:
                await asyncio.wait_for(asyncio.shield(pumping), remaining)
            except TimeoutError:
                timed_out = True
                await self.kill_all()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(pumping), 0.5)
            finally:
                if not pumping.done():
                    pumping.cancel()
                if feeder is not None and not feeder.done():
                    feeder.cancel()
            if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
                exc = pumping.exception()
                raise SandboxError(f"exec stream failed: {exc!r}") from exc
        except asyncio.IncompleteReadError as e:
            raise SandboxError(f"the docker engine closed the exec stream: {e!r}") from e
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        duration = time.monotonic() - start
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        if timed_out:
            return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated, duration)
        self._check_alive()
        code = await asyncio.to_thread(self.exec_exit, exec_id)
        if code is None:
            await self.kill_all()
            raise SandboxError(f"sandbox {self.id}: the exec ended without an exit code")
        if code >= 128:
            # The wrapper itself may have been killed (its sweep never ran): sweep now.
            await self.kill_all()
            if not await asyncio.to_thread(self.running):
                raise SandboxGone(f"sandbox {self.id}: its container stopped")
        oom = code == 137 or memory_error(stderr)
        return ExecResult(code, stdout, stderr, False, oom, truncated, time.monotonic() - start)

    async def _start_exec(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exec_id: str
    ) -> None:
        version = self.client.api.api_version
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        head = (
            f"POST /v{version}/exec/{exec_id}/start HTTP/1.1\r\n"
            "Host: docker\r\nContent-Type: application/json\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        status = await reader.readuntil(b"\r\n\r\n")
        line = status.split(b"\r\n", 1)[0].decode(errors="replace")
        if " 101 " not in line and " 200 " not in line:
            rest = b""
            with contextlib.suppress(Exception):
                rest = await asyncio.wait_for(reader.read(2000), 1.0)
            if " 404 " in line or " 409 " in line:
                raise SandboxGone(f"sandbox {self.id}: {line} {rest.decode(errors='replace')}")
            raise SandboxError(f"docker exec start: {line} {rest.decode(errors='replace')}")

    # ---- persistent shell --------------------------------------------------------------

    def _dead_gids(self) -> str:
        return " ".join(str(g) for g in sorted(self.dead))

    async def open_exec(
        self, argv: list[str], env: dict[str, str], gid: int, stdin: bool
    ) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
        """Create and start an exec as uid SANDBOX_UID, gid `gid`: its id and hijacked stream."""
        exec_id = await asyncio.to_thread(self._exec_create, argv, env, stdin, gid)
        try:
            reader, writer = await asyncio.open_unix_connection(self._sock_path, limit=CHUNK * 4)
        except OSError as e:
            raise SandboxError(f"cannot reach the docker engine: {e}") from e
        try:
            await self._start_exec(reader, writer, exec_id)
        except BaseException:
            writer.close()
            raise
        return exec_id, reader, writer

    async def shell(self) -> BashSession:
        """A persistent bash: one long-lived ``docker exec -i`` per session (see the module
        docstring), uid SANDBOX_UID with a gid of its own, the execute-only bash at
        SHELL_BINARY where the image has one to copy (else the image's /bin/bash)."""
        self._check_alive()
        binary = SHELL_BINARY if self._shell_binary is not None else "/bin/bash"
        env = sandbox_env(self.spec, self._workdir)
        # The bash moves the control stream (docker's stdin) off fd 0, and reports its pid
        # and the container's clock on the status stream (stderr) before the bootstrap.
        script = (
            "exec 63<&0 0</dev/null; builtin read -r __p_u _ </proc/uptime; "
            'builtin printf \'P %s %s\\n\' "$$" "$__p_u" >&2; __p_u=\n'
        ) + bootstrap_script(63, 2)

        async def launch() -> DockerShellProcess:
            self._check_alive()
            gid = self._next_gid
            self._next_gid += 1
            try:
                argv = [binary, "--noprofile", "--norc", "-c", script]
                exec_id, reader, writer = await self.open_exec(argv, env, gid, True)
            except BaseException:
                self.dead.add(gid)
                raise
            return DockerShellProcess(self, gid, exec_id, reader, writer)

        session = BashSession(
            launch,
            workdir=self._workdir,
            default_timeout=self.spec.default_timeout_s,
            alive=lambda: not self._closed,
        )
        try:
            await session.start()
        except BaseException:
            await asyncio.shield(session.close())
            raise
        return session

    def running(self) -> bool:
        try:
            self._container.reload()
        except Exception:
            return False
        return bool(self._container.attrs.get("State", {}).get("Running"))

    def _kill_sync(self) -> bool:
        """Kill every process of the sandbox user; False if no exec could do it."""
        docker = import_docker()
        for _ in range(3):
            try:
                res = self.client.api.exec_create(
                    self._container.id,
                    ["/bin/sh", "-c", "__dead=$1; " + KILL_LOOP, "sh", self._dead_gids()],
                    user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                )
                self.client.api.exec_start(res["Id"])
                code = self.client.api.exec_inspect(res["Id"]).get("ExitCode")
                if code == 0:
                    return True
            except docker.errors.DockerException:
                pass
            time.sleep(0.05)
        return False

    async def kill_all(self) -> None:
        if await asyncio.to_thread(self._kill_sync):
            return
        # No exec could start. Memory held by the agent's files: a restart would remount
        # the tmpfs workspace empty (its work lost), so that is the agent's fault instead.
        if isinstance(fault := await self.agent_fault(), MemoryFull):
            raise fault
        # Otherwise (the pids limit reached?): restart the container (its processes end;
        # the workspace's files are lost with its tmpfs, /tmp's too).
        try:
            await asyncio.to_thread(self._container.restart, timeout=0)
            await self.attach_listener()
        except Exception as e:
            raise SandboxGone(f"sandbox {self.id}: could not kill its processes: {e}") from e

    async def agent_fault(self) -> WorkspaceFault | None:
        """Its processes fill the container's pids limit (a fork bomb of the agent's, which
        no exec can start beside): the agent's doing (see `Sandbox.agent_fault`)."""
        if self._closed:
            return None
        try:
            stats = await asyncio.to_thread(self._container.stats, stream=False)
        except Exception:
            return None
        current = int((stats.get("pids_stats") or {}).get("current") or 0)
        if current * 4 >= self.spec.pids * 3:
            return ProcessLimit(
                f"no process can start: {current} of the sandbox's {self.spec.pids} processes "
                "are the agent's own (kill its background processes)"
            )
        return memory_fault(stats.get("memory_stats") or {}, self.spec.memory_mb)

    # ---- files (palaestra.sandbox.docker.files) --------------------------------------------

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        return await self.files.read_file(path)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_alive()
        await self.files.write_file(path, data, mode)

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        self._check_alive()
        await self.files.upload_tar(data, dest)

    async def download_tar(self, path: str | None = None) -> bytes:
        self._check_alive()
        return await self.files.download_tar(path)

    async def download_tar_to(
        self, out: BinaryIO, path: str | None = None, *, limit: int | None = None
    ) -> int:
        """Stream the engine's archive into `out` (`Sandbox.download_tar_to`)."""
        self._check_alive()
        return await self.files.download_tar_to(out, path, transfer_limit(self.spec, limit))

    async def upload_tar_from(
        self, src: BinaryIO, dest: str | None = None, *, limit: int | None = None
    ) -> None:
        """Stream `src` to the engine (`Sandbox.upload_tar_from`)."""
        self._check_alive()
        await self.files.upload_tar_from(src, dest, transfer_limit(self.spec, limit))

    async def copy_workspace_from(self, src: Sandbox, spool_dir: Path) -> None:
        """From another docker sandbox: its workdir as it was, absolute symlinks too (an
        upload refuses those; `ContainerFiles.copy_from`)."""
        if not isinstance(src, DockerSandbox):
            return await super().copy_workspace_from(src, spool_dir)
        self._check_alive()
        with spool_file(spool_dir) as f:
            await src.download_tar_to(f)
            await self.files.copy_from(f)

    async def restore_workspace(self, src: BinaryIO) -> None:
        """A checkpoint's tar as it was, absolute symlinks too (`ContainerFiles.copy_from`)."""
        self._check_alive()
        await self.files.copy_from(src)


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def memory_fault(memory: dict[str, Any], limit_mb: int) -> MemoryFull | None:
    """The agent's fault when the container's memory is (nearly) all in use: an exec's
    runc init is then OOM-killed before it starts ("read init-p: connection reset").
    Files the agent wrote to its tmpfs /tmp and workspace are memory no OOM kill frees, so
    filling them (the workspace-exhaustion cheat) voided the episode before this check.
    `memory` is the engine's `memory_stats` (cgroup v1 or v2)."""
    detail = memory.get("stats") or {}
    # page cache (active or not) is freed before any OOM kill; tmpfs pages are not in it
    # (shmem is swap-backed: on the anon lists)
    cache = sum(
        int(detail.get(name) or detail.get(f"total_{name}") or 0)
        for name in ("inactive_file", "active_file")
    )
    usage = int(memory.get("usage") or 0) - cache
    limit = int(memory.get("limit") or 0) or limit_mb << 20
    if usage * 10 < limit * 9:
        return None
    files = int(detail.get("shmem") or detail.get("total_shmem") or 0)
    what = (
        f"its files in /tmp and the workspace hold {files >> 20} MiB (delete some)"
        if files * 2 >= usage
        else "its processes hold the rest (stop its background processes)"
    )
    return MemoryFull(
        f"no process can start: {usage >> 20} of the sandbox's {limit >> 20} MiB of memory "
        f"are in use; {what}"
    )
