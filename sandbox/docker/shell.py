"""The docker sandbox's persistent shell transport: `DockerShellProcess`, a
`palaestra.sandbox.shell.BashSession` over one long-lived ``docker exec -i``.

The exec API's hijacked socket (stdin attached, no tty) runs ``bash --noprofile --norc -c
BOOTSTRAP``: docker's stdin is the control stream (bash moves it to fd 63 and puts /dev/null
on fd 0), stdout the output stream, stderr the status stream (the multiplexed frames tell
them apart).  Before the bootstrap, bash reports its pid and the container's /proc/uptime on
the status stream.  A command's round trip is frames on that one socket, no extra exec.

*Which processes are the shell's.* Each shell launch runs as uid 1000 with a gid of its own
(SHELL_GID_BASE + n, never reused in a sandbox).  A process cannot change its gid (no
CAP_SETGID, no-new-privileges stops set-gid files), so unlike a session id or a process
group the gid is a marker untrusted code can neither shed nor forge: whatever the shell
started has the shell's gid; nothing an exec started has it.  That lets an exec's sweep
spare a live shell, and lets the shell kill its own:

* a snapshot (before each command) is a point on the container's clock, no exec: host
  CLOCK_BOOTTIME minus the offset measured at launch (0 when the engine shares this
  kernel, the usual case: /proc/<pid>/stat starttimes are on that clock);
* on a timeout, idle timeout or interrupt, a short helper exec (`SHELL_JOB`, builtins only,
  run with the shell's gid) lists the processes of that gid with their parent and start
  time; the job is those that started since the snapshot and do not descend from one that
  did not, never the shell itself; the helper signals them;
* `kill` (the shell's last stage, `close`, and the shell's own death) marks the gid dead and
  runs a helper that SIGKILLs every process of that gid until none is left; every later
  exec's sweep kills that gid too; if no exec can start (pids limit) the sandbox-wide sweep
  or a container restart does it.

*Non-dumpable.* At create, the image's bash is copied once per image (`shell_binary`, into
``<cache>/docker-shell``), mode 0111, and bound read-only at SHELL_BINARY: a process that
execs a file it cannot read is non-dumpable, so ``/proc/<bash>/{fd,mem,environ}`` are EACCES
for the sandbox's other processes.  An image with no bash to copy gets the image's
/bin/bash, which is dumpable: see the residual risks in `palaestra.sandbox.shellproc`.

Residual risks beyond those: the shell and the execs share one pid namespace and uid (a
shell's background job can signal or ptrace a concurrent exec's processes: close the shell
before running a verifier); a process of the timed-out command that started within one
clock tick of the command may count as an earlier background job and survive the timeout
(it dies at `close`); a pid reused between listing and kill gets the signal; the helper
execs are uid-1000 processes the shell's code could kill (the last stage then falls back to
the sandbox-wide sweep); a bind mount needs the engine to see this host's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import struct
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from palaestra.sandbox.base import BASE_PATH, SandboxError
from palaestra.sandbox.docker.engine import LABEL, owner
from palaestra.sandbox.docker.scripts import SHELL_JOB, SHELL_KILL
from palaestra.sandbox.shellproc import ShellProcess

if TYPE_CHECKING:
    from palaestra.sandbox.docker.sandbox import DockerSandbox

# Shells run with gid SHELL_GID_BASE + n, a fresh n per launch; execs with gid SANDBOX_UID.
# Nothing in the container can change its gid (no CAP_SETGID, no-new-privileges), so the gid
# tells an exec's processes from a shell's.
SHELL_GID_BASE = 20000
# Where the execute-only copy of the image's bash is bound (read-only) for the shell.
SHELL_BINARY = "/run/palaestra/bash"


class DockerShellProcess(ShellProcess):
    """A shell over a ``docker exec -i`` hijacked stream (see the module docstring):
    stdin is the control stream, stdout the output, stderr the status stream. Its
    processes are the sandbox user's processes with its gid; snapshots are a point on the
    container's clock, signals go through a short exec."""

    def __init__(
        self,
        box: DockerSandbox,
        gid: int,
        exec_id: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.box = box
        self.gid = gid
        self.exec_id = exec_id
        self.output = asyncio.StreamReader(limit=2**20)
        self.status = asyncio.StreamReader(limit=2**20)
        self.pid: int | None = None  # the shell's pid in the container
        self._offset: float | None = None  # host CLOCK_BOOTTIME - the container's uptime
        self._pre: bytearray | None = bytearray()
        self._reader = reader
        self._writer = writer
        self._finish: asyncio.Future[None] | None = None
        self._pump_task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                head = await self._reader.readexactly(8)
                size = struct.unpack(">I", head[4:])[0]
                payload = await self._reader.readexactly(size)
                if head[0] == 2:
                    self._on_status(payload)
                else:
                    self.output.feed_data(payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if self._pre:
                self.status.feed_data(bytes(self._pre))
            self._pre = None
            self.output.feed_eof()
            self.status.feed_eof()
            self._writer.close()
            # Everything the shell started dies with it (as with bwrap's pid namespace).
            self._finishing()

    def _on_status(self, data: bytes) -> None:
        if self._pre is None:
            self.status.feed_data(data)
            return
        self._pre += data
        i = self._pre.find(b"\n")
        if i < 0:
            if len(self._pre) > 4096:
                self.status.feed_data(bytes(self._pre))
                self._pre = None
            return
        line, rest = bytes(self._pre[:i]), bytes(self._pre[i + 1 :])
        self._pre = None
        parts = line.split()
        if len(parts) == 3 and parts[0] == b"P":
            with contextlib.suppress(ValueError):
                self.pid = int(parts[1])
                offset = time.clock_gettime(time.CLOCK_BOOTTIME) - float(parts[2])
                self._offset = 0.0 if abs(offset) < 1.0 else offset  # 0: the same kernel
        else:
            rest = line + b"\n" + rest
        if rest:
            self.status.feed_data(rest)

    @property
    def exited(self) -> bool:
        return self._pump_task.done()

    async def send(self, data: bytes) -> None:
        if self.exited:
            raise ConnectionError("the shell has exited")
        self._writer.write(data)
        await self._writer.drain()

    async def wait(self) -> int:
        await asyncio.shield(self._pump_task)

        def code() -> int:
            for _ in range(50):
                with contextlib.suppress(Exception):
                    info = self.box.client.api.exec_inspect(self.exec_id)
                    if not info.get("Running") and info.get("ExitCode") is not None:
                        return int(info["ExitCode"])
                time.sleep(0.01)
            return 128 + 9

        return await asyncio.to_thread(code)

    async def snapshot(self) -> object:
        # A point on the container's clock, in the ticks of /proc/<pid>/stat's starttime:
        # the job is what started since (and does not descend from what started before).
        if self._offset is None:
            return None
        return int((time.clock_gettime(time.CLOCK_BOOTTIME) - self._offset) * _CLK_TCK)

    async def signal_job(self, snapshot: object, sig: int) -> int:
        if self.exited or self.box.closed or self.gid in self.box.dead:
            return 0
        since = snapshot if isinstance(snapshot, int) else None
        try:
            return await asyncio.wait_for(self._signal_job(since, sig), 5.0)
        except (TimeoutError, SandboxError, OSError, asyncio.IncompleteReadError):
            return 0

    async def _signal_job(self, since: int | None, sig: int) -> int:
        argv = ["/bin/sh", "-c", SHELL_JOB, "sh", str(self.gid)]
        _, reader, writer = await self.box.open_exec(argv, {"PATH": BASE_PATH}, self.gid, True)
        try:
            out = bytearray()
            while not (out.startswith(b".\n") or b"\n.\n" in out):
                head = await reader.readexactly(8)
                payload = await reader.readexactly(struct.unpack(">I", head[4:])[0])
                if head[0] == 1:
                    out += payload
            procs: dict[int, tuple[int, int]] = {}
            for line in out.decode(errors="replace").splitlines():
                f = line.split()
                if len(f) == 4 and f[0].isdigit() and f[1].isdigit() and f[2].isdigit():
                    procs[int(f[0])] = (int(f[1]), int(f[2]))
            job = [p for p in procs if p != self.pid and not self._background(p, procs, since)]
            writer.write(f"{sig} {' '.join(map(str, job))}\n".encode())
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            with contextlib.suppress(asyncio.IncompleteReadError):
                while True:  # until the helper is done
                    head = await reader.readexactly(8)
                    await reader.readexactly(struct.unpack(">I", head[4:])[0])
            return len(job)
        finally:
            writer.close()

    def _background(self, pid: int, procs: dict[int, tuple[int, int]], since: int | None) -> bool:
        """Whether `pid` started before `since`, or descends from a process that did."""
        seen: set[int] = set()
        while pid in procs and pid != self.pid and pid not in seen:
            seen.add(pid)
            ppid, start = procs[pid]
            if since is not None and start < since:
                return True
            pid = ppid
        return False

    def _finishing(self) -> asyncio.Future[None]:
        if self._finish is None:
            self._finish = asyncio.ensure_future(self._kill_gid())
        return self._finish

    async def _kill_gid(self) -> None:
        box = self.box
        box.dead.add(self.gid)  # from now on every exec's sweep kills them too
        if box.closed:
            return
        argv = ["/bin/sh", "-c", "__g=$1; " + SHELL_KILL, "sh", str(self.gid)]
        try:
            exec_id, reader, writer = await box.open_exec(
                argv, {"PATH": BASE_PATH}, self.gid, False
            )
            try:
                with contextlib.suppress(asyncio.IncompleteReadError):
                    while True:
                        head = await reader.readexactly(8)
                        await reader.readexactly(struct.unpack(">I", head[4:])[0])
            finally:
                writer.close()
            code = await asyncio.to_thread(box.exec_exit, exec_id)
            if code == 0:
                return
        except (SandboxError, OSError, asyncio.IncompleteReadError):
            if box.closed:
                return
        # No exec could do it (pids limit?): the sandbox-wide sweep, or a restart.
        with contextlib.suppress(SandboxError):
            await box.kill_all()

    async def kill(self) -> None:
        if not self.exited:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._finishing())
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pump_task), 5.0)
        if self._finish is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._finish), 10.0)


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def shell_binary(client: Any, image: str, cache: Path) -> str | None:
    """The host path of an execute-only (mode 0111) copy of `image`'s bash, made once per
    image under `cache` (from a container that is created, never started); None if it has
    none."""
    try:
        image_id = str(client.images.get(image).id).split(":")[-1][:20]
    except Exception:
        return None
    dest = cache / "docker-shell" / f"bash-{image_id}"
    if dest.is_file():
        return str(dest)
    try:
        cid = client.api.create_container(
            image,
            command=["true"],
            network_disabled=True,
            labels={LABEL: "shell-binary", **owner()},  # reaped if we die right here
        )["Id"]
    except Exception:
        return None
    data = None
    try:
        for path in ("/usr/bin/bash", "/bin/bash"):
            with contextlib.suppress(Exception):
                stream, _ = client.api.get_archive(cid, path)
                with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as tf:
                    m = tf.next()
                    f = tf.extractfile(m) if m is not None and m.isreg() else None
                    if f is not None:
                        data = f.read()
                        break
    finally:
        with contextlib.suppress(Exception):
            client.api.remove_container(cid, force=True)
    if not data:
        return None
    dest.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o111)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return str(dest)
