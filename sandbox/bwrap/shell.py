"""The bwrap backend's persistent shell: one long-lived ``bwrap … bash`` per session.

It has the same workspace, mounts, namespaces, uid, environment, rlimits, cgroup and seccomp
filter as an exec, plus one read-only file, an execute-only copy of bash at `SHELL_BINARY`
(which makes the shell non-dumpable; see `palaestra.sandbox.shellproc`).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from palaestra.sandbox.base import BASE_PATH, SandboxError, sandbox_env
from palaestra.sandbox.bwrap.mounts import shell_source
from palaestra.sandbox.shell import BashSession
from palaestra.sandbox.shellproc import LocalShellProcess, prepare_shell_binary

if TYPE_CHECKING:
    from palaestra.sandbox.bwrap.sandbox import BwrapSandbox

# Where the persistent shell's execute-only bash is bound inside (read-only).
SHELL_BINARY = "/run/palaestra/bash"


async def open_shell(box: BwrapSandbox) -> BashSession:
    """A started `BashSession` in `box`; each (re)start is a fresh bwrap."""
    box.check_alive()
    src = shell_source(box.image)
    if src is None:
        raise SandboxError(f"sandbox {box.id}: no bash in its root, no persistent shell")
    binary = await asyncio.to_thread(prepare_shell_binary, src, str(box.root.parent))

    def exited(proc: asyncio.subprocess.Process) -> None:
        box.procs.discard(proc)
        box.cgroup_users -= 1

    async def launch() -> LocalShellProcess:
        box.check_alive()
        if why := box.lost():
            raise await box.gone(why)
        launcher = box.launcher
        assert launcher is not None
        env = sandbox_env(box.spec, box.workdir)
        args = list(box.jails.static)
        for k, v in env.items():
            args += ["--setenv", k, v]
        args += ["--chdir", box.workdir, "--ro-bind", binary, SHELL_BINARY]
        sfd = launcher.seccomp_fd()
        if sfd is not None:
            args += ["--seccomp", str(sfd)]

        def argv_for(script: str) -> tuple[list[str], dict[str, Any]]:
            bash = [SHELL_BINARY, "--noprofile", "--norc", "-c", script]
            return launcher.wrap([*args, "--", *bash])

        box.cgroup_users += 1
        try:
            sp = await LocalShellProcess.spawn(
                argv_for,
                pass_fds=() if sfd is None else (sfd,),
                env={"PATH": BASE_PATH},
                on_exit=exited,
            )
        except BaseException:
            box.cgroup_users -= 1
            raise
        finally:
            if sfd is not None:
                os.close(sfd)
        box.procs.add(sp.proc)
        return sp

    session = BashSession(
        launch,
        workdir=box.workdir,
        default_timeout=box.spec.default_timeout_s,
        alive=lambda: box.alive,
    )
    await session.start()
    return session
