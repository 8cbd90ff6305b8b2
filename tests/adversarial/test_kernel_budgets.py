"""Kernel budgets shared by every sandbox are not a neighbour's weapon (issue 14, item 8).

* The fork server's runs (the coding family's one-shot Python runner) get a cgroup each,
  like a bwrap sandbox: a fork bomb or a memory hog in one run is held to that run's pids
  and memory limits, and a neighbouring run and a neighbouring sandbox still work.
* io_uring is refused (ENOSYS) on every backend: bwrap, the fork server, docker.
* Budgets the kernel counts per host uid, which all sandboxes of that uid share (inotify
  instances and watches, POSIX message queue bytes), are out of reach: their calls fail
  with ENOSYS everywhere, so no sandbox can use them up for another
  (docs/security-kernel.md says why this and not a uid per sandbox).

The programs are in programs/; each prints one line of JSON (or a count).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from palaestra.sandbox import seccomp
from palaestra.sandbox.base import Backend, ExecResult, Sandbox
from palaestra.sandbox.forkrun import PythonRun
from palaestra.sandbox.forkserver import ForkServerUnavailable, PythonForkServer
from tests.servers import scaled

from .harness import ATTACK_SPEC, Guard, bwrap_cgroups, on_backends

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROGRAMS = Path(__file__).parent / "programs"
PIDS = ATTACK_SPEC.pids
MEM = ATTACK_SPEC.memory_mb


def program(name: str) -> str:
    return (PROGRAMS / name).read_text()


@pytest.fixture
async def forks() -> AsyncIterator[PythonForkServer]:
    """A fork server with the attack spec's pids limit (its runs' cgroups)."""
    server = PythonForkServer(pids=PIDS)
    try:
        await server.start()
    except ForkServerUnavailable as exc:
        pytest.skip(f"fork server unavailable here: {exc}")
    try:
        yield server
    finally:
        await server.aclose()


def needs_cgroups(forks: PythonForkServer) -> None:
    if forks.cgroups is None:
        pytest.skip(f"the fork server's runs get no cgroup here: {forks.cgroup_status}")


async def fork_run(
    forks: PythonForkServer, code: str, args: dict[str, Any] | None = None, timeout: float = 10
) -> ExecResult:
    stdin = json.dumps(args or {}).encode()
    job = PythonRun(code, {}, stdin, timeout, 1 << 16, MEM, ATTACK_SPEC.workspace_mb)
    return await forks.run(job)


async def neighbours_fine(forks: PythonForkServer, neighbour: Sandbox) -> None:
    """Another fork-server run and a bwrap sandbox both start processes, quickly."""
    t0 = time.monotonic()
    r = await fork_run(forks, "import subprocess; print(subprocess.run(['echo', 'ok']).returncode)")
    assert (r.exit_code, r.stdout) == (0, "ok\n0\n"), f"neighbouring run broken: {r}"
    r2 = await neighbour.exec("sh -c 'echo ok'", timeout=10)
    assert (r2.exit_code, r2.stdout) == (0, "ok\n"), f"neighbouring sandbox broken: {r2}"
    assert time.monotonic() - t0 < 5.0


def run_cgroups(forks: PythonForkServer) -> list[Path]:
    """The run cgroups the fork server has now (they go when their run ends)."""
    assert forks.cgroups is not None
    return [p for d in forks.cgroups.server_dirs() if d.is_dir() for p in d.glob("fork-*")]


async def cgroups_left(forks: PythonForkServer, within_s: float = 10.0) -> list[Path]:
    """The run cgroups still there after their removal had its time: it runs beside the
    result, not before it (a fork bomb's hundreds of processes take a while to go)."""
    deadline = time.monotonic() + scaled(within_s)
    while (left := run_cgroups(forks)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return left


@pytest.mark.parametrize("backend_name", ["bwrap"])
async def test_forkserver_fork_bomb_is_held_to_its_run(
    forks: PythonForkServer, neighbour: Sandbox
) -> None:
    needs_cgroups(forks)
    # The bounded probe first: without a pids limit the real bomb would exhaust the host's
    # pid space (32768 here) for everyone on the machine.
    r = await fork_run(forks, program("fork_probe.py"), {"n": 300})
    assert r.exit_code == 0, r
    assert int(r.stdout.split()[-1]) < PIDS, f"no pids limit: {r.stdout!r} processes started"
    bomb = asyncio.ensure_future(fork_run(forks, program("fork_bomb.py"), timeout=4))
    await asyncio.sleep(1.5)  # the bomb is at its limit now
    await neighbours_fine(forks, neighbour)
    r = await bomb
    assert r.timed_out, r
    await neighbours_fine(forks, neighbour)
    assert await cgroups_left(forks) == [], "a run's cgroup outlived it"


@pytest.mark.parametrize("backend_name", ["bwrap"])
async def test_forkserver_memory_hog_is_held_to_its_run(
    forks: PythonForkServer, neighbour: Sandbox
) -> None:
    needs_cgroups(forks)
    # Four children of 200 MiB each: every one is under the run's RLIMIT_AS (256 MiB, per
    # process), together they are three times the run's memory limit.
    r = await fork_run(forks, program("mem_hog.py"), {"mb": 200, "kids": 4}, timeout=20)
    assert r.oom_killed, r
    if r.exit_code == 0:
        held = json.loads(r.stdout.splitlines()[-1])
        assert held["holding"] * 200 <= MEM + 64, f"the run held {held} x 200 MiB"
    await neighbours_fine(forks, neighbour)
    assert await cgroups_left(forks) == []


async def test_forkserver_run_is_in_its_own_cgroup(forks: PythonForkServer) -> None:
    needs_cgroups(forks)
    r = await fork_run(forks, "print(open('/proc/self/cgroup').read())")
    assert r.exit_code == 0, r
    assert forks.cgroups is not None
    want = ("0::",) if forks.cgroups.version == 2 else (":pids:", ":memory:")
    lines = [ln for ln in r.stdout.splitlines() if any(w in ln for w in want)]
    assert len(lines) == len(want) and all("/fork-" in ln for ln in lines), r.stdout


def syscalls_result(r: ExecResult) -> dict[str, Any]:
    assert r.exit_code == 0, r
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


async def box_syscalls(box: Sandbox, args: dict[str, Any], timeout: float = 15) -> dict[str, Any]:
    await box.write_file("syscalls.py", program("syscalls.py"))
    r = await box.exec("python3 syscalls.py", stdin=json.dumps(args), timeout=timeout)
    return syscalls_result(r)


@pytest.mark.parametrize("backend_name", on_backends())
async def test_io_uring_refused(box: Sandbox, guard: Guard) -> None:
    out = await box_syscalls(box, {})
    assert out["io_uring_setup"] in ("ENOSYS", "EPERM"), out
    await guard.check(json.dumps(out))


@pytest.mark.parametrize("backend_name", on_backends())
async def test_per_uid_budgets_out_of_reach(backend: Backend, box: Sandbox, guard: Guard) -> None:
    # The attacker takes every inotify instance it can (the host allows 128 per uid) and
    # holds them while a second sandbox of the same backend asks for one.
    attack = asyncio.ensure_future(box_syscalls(box, {"inotify": 200, "hold": 3}))
    await asyncio.sleep(1.5)
    other = await backend.create(ATTACK_SPEC)
    try:
        theirs = await box_syscalls(other, {})
    finally:
        await other.close()
    ours = await attack
    assert ours["inotify_instances"] == 0 and ours["inotify_error"] == "ENOSYS", ours
    # Refused the same way, not used up (EMFILE) by the attacker.
    assert theirs["inotify_error"] == "ENOSYS", theirs
    assert ours["mq_open"] == "ENOSYS", ours
    await guard.check(json.dumps(ours), json.dumps(theirs))


async def test_forkserver_refuses_io_uring_and_per_uid_budgets(forks: PythonForkServer) -> None:
    out = syscalls_result(await fork_run(forks, program("syscalls.py"), {"inotify": 200}))
    assert out["io_uring_setup"] in ("ENOSYS", "EPERM"), out
    assert (out["inotify_instances"], out["inotify_error"], out["mq_open"]) == (
        0,
        "ENOSYS",
        "ENOSYS",
    ), out


def test_harness_sees_bwrap_cgroups_as_the_fork_server_does() -> None:
    # The fork server decides on cgroups as the bwrap backend does (root, a usable hierarchy).
    assert (PythonForkServer().cgroups is not None) == bwrap_cgroups()


def test_filter_and_docker_profile_name_every_call() -> None:
    """Both policies come from one list; no name is silently missing from an arch's table."""
    for arch in (seccomp.AUDIT_ARCH_X86_64, seccomp.AUDIT_ARCH_AARCH64):
        table = seccomp.SYSCALLS[arch]
        missing = set(seccomp.UNAVAILABLE) - set(table)
        assert missing <= {"inotify_init"} and (arch == seccomp.AUDIT_ARCH_AARCH64 or not missing)
        profile = seccomp.docker_profile(arch)
        rules = profile["syscalls"]
        assert isinstance(rules, list)
        named = {n for rule in rules for n in rule["names"]}
        assert set(seccomp.DENIED) | (set(seccomp.UNAVAILABLE) - missing) <= named
        assert {"clone3", "setns", "unshare", "clone"} <= named
        assert 0 < len(seccomp.build(arch)) // 8 < 256
