"""One fork-server run's cgroup: made, joined, killed at the deadline, removed off the hot path.

Why: the fork server's runs are forked by a zygote inside a jail that cannot write the host's
cgroup files, so the server places each run.  The run's first process (``C`` in
`palaestra.sandbox.forkserver`'s zygote) sends one message on a socket the server holds with
``SO_PASSCRED``: the kernel attaches C's pid, translated into the server's pid namespace (never
a number the jail chose).  The server creates the run's cgroup, writes that pid into it and
answers ``g``; only then does C unshare and fork the run's program, so every process of the run
is inside the cgroup from its start.  Any failure closes the socket: C gives up before it
starts anything (the run reports a set-up error, a `SandboxError`).

Cost (2-core VM, cgroup v1: memory, pids and cpu hierarchies): create ≈ 1.2 ms, join ≈ 1.3 ms,
remove ≈ 0.9 ms of CPU; create and join run in one thread hop while the zygote forks, removal
runs after the result is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct

from palaestra.sandbox.cgroups import Cgroup, CgroupManager

log = logging.getLogger("palaestra.sandbox.forkserver")

_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid


class RunCgroup:
    """The cgroup of one run (`place` it, `kill_at` its deadline, then `cleanup`)."""

    def __init__(
        self, manager: CgroupManager, name: str, memory_bytes: int, pids: int, cpus: float | None
    ) -> None:
        self.manager, self.name = manager, name
        self.memory_bytes, self.pids, self.cpus = memory_bytes, pids, cpus
        self.cg: Cgroup | None = None
        self.killed = False  # `kill_at` fired: the run hit its deadline
        self._work: asyncio.Future[None] | None = None

    def _create_and_join(self, pid: int) -> None:
        self.cg = self.manager.create(self.name, self.memory_bytes, self.pids, self.cpus)
        self.cg.add(pid)

    async def place(self, sync: socket.socket) -> None:
        """Wait for the run's first process on `sync`, put it in the cgroup, let it go on."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(sync.fileno(), readable)
        try:
            await ready
        finally:
            loop.remove_reader(sync.fileno())
        try:
            data, anc, _, _ = sync.recvmsg(16, socket.CMSG_SPACE(_CREDS.size))
            pid = 0
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _CREDS.unpack(raw[: _CREDS.size])[0]
            if data != b"p" or pid <= 0:
                raise OSError(f"no pid in the run's message {data!r}")
            self._work = loop.run_in_executor(None, self._create_and_join, pid)
            await asyncio.shield(self._work)
            sync.send(b"g")
        except OSError as e:
            log.warning("cannot put a fork server run in its cgroup: %s", e)
            sync.close()

    async def kill_at(self, delay: float) -> None:
        """At the run's deadline, kill everything in its cgroup.

        The zygote kills the run's first process then too, but a run's processes at its pids
        limit (a fork bomb) took up to 3 s more to die of that on a loaded host; a cgroup kill
        reaches all of them at once."""
        await asyncio.sleep(delay)
        if self.cg is not None:
            self.killed = True
            await asyncio.to_thread(self.cg.kill_all, 1.0)

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of the run (a read of one small file)."""
        return self.cg is not None and self.cg.oom_killed()

    async def cleanup(self) -> None:
        """Kill what is left and remove the cgroup (after a placement still in its thread)."""
        if self._work is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._work)
        if self.cg is not None:
            await asyncio.to_thread(self.cg.remove)
