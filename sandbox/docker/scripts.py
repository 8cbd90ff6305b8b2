"""The shell programs a docker sandbox runs around its execs (``programs/docker_*.sh``).

Every exec runs as uid/gid 1000 through `WRAPPER`::

    cd CWD || exit 1; "$@"; rc=$?; <sweep>; exit $rc

The sweep (builtins only, no fork: it must work at the pids limit) SIGKILLs, pass after pass
until none is left, every process of uid 1000 with gid 1000 (an exec's) or with the gid of a
persistent shell that is gone -- never init or the keep-alive (another uid), never a live
shell's processes.  A fork bomb that outruns one kill per pid for 200 passes gets ``kill -9
-1`` (every process of uid 1000, live shells included: they restart).
"""

from __future__ import annotations

from palaestra.sandbox import programs
from palaestra.sandbox.preamble import SANDBOX_UID

_FORK_BOMB = "n=0; while __f && [ $n -lt 1000 ]; do kill -9 -1 2>/dev/null; wait; n=$((n+1)); done"


def sweep(pick: str, *, fast: bool) -> str:
    """A sh snippet that SIGKILLs, until none is left, every live process of the sandbox
    user but itself for which `pick` (a snippet that sees the process's gid as ``$g``)
    succeeds; its status is 0 once none is left. With `fast`, a pick that still finds
    processes after 200 passes gives way to ``kill -9 -1``. Zombies, which run nothing, are
    skipped; init reaps orphans, `wait` our own children."""
    return programs.text(
        "docker_sweep.sh", UID=SANDBOX_UID, PICK=pick, FORKBOMB=_FORK_BOMB if fast else ":"
    ).strip()


# After every exec: kill the exec's processes (gid SANDBOX_UID) and those of the shells that
# are gone (their gids: ``$__dead``, set by the wrapper). A live shell's are spared.
KILL_LOOP = sweep(
    f'[ "$g" = {SANDBOX_UID} ] || case " $__dead " in *" $g "*) true;; *) false;; esac',
    fast=True,
)
WRAPPER = (
    'cd "$1" 2>/dev/null || { echo "cannot cd to $1" >&2; exit 1; }; __dead=$2; shift 2; '
    f'"$@"; rc=$?; {KILL_LOOP}; exit $rc'
)
# A shell's processes (gid ``$1``), all of them: `DockerShellProcess.kill`.
SHELL_KILL = sweep('[ "$g" = "$__g" ]', fast=False)
# A shell's processes (gid ``$1``) as lines ``pid ppid starttime state``, then ``.``; then
# reads ``signal pid…`` and signals those: `DockerShellProcess.signal_job`.
SHELL_JOB = programs.text("docker_shell_job.sh", UID=SANDBOX_UID)
