"""The bwrap backend's hardening: seccomp, cgroups, spec checks, the collector, images."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from palaestra.sandbox import cgroups as cgroups_mod
from palaestra.sandbox import seccomp
from palaestra.sandbox.base import SandboxGone, SandboxSpec, SandboxSpecError
from palaestra.sandbox.bwrap import BwrapBackend, BwrapSandbox, bwrap_available
from palaestra.sandbox.bwrap.host import default_runtime_base, host_cpus, host_memory_mb
from palaestra.sandbox.bwrap.mounts import unmount

_OK, _WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mounts, cgroups)")


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[BwrapBackend]:
    b = BwrapBackend(None if IS_ROOT else tmp_path / "rt")
    yield b
    await b.aclose()


@pytest.fixture
async def box(backend: BwrapBackend) -> AsyncIterator[BwrapSandbox]:
    async with await backend.create(SandboxSpec(default_timeout_s=20)) as s:
        yield s


def _need_cgroups(backend: BwrapBackend) -> None:
    if backend.cgroups is None:
        pytest.skip(f"no cgroups here: {backend.cgroup_status}")


# ---- seccomp -------------------------------------------------------------------------------

SECCOMP_PROBE = r"""
import ctypes, errno, fcntl, os, sys
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": dict(ptrace=101, pvr=310, pvw=311, bpf=321, perf=298, uffd=323, keyctl=250,
                     mount=165, umount2=166, pivot_root=155, fsopen=430, open_tree=428,
                     init_module=175, kexec_load=246),
      "aarch64": dict(ptrace=117, pvr=270, pvw=271, bpf=280, perf=241, uffd=282, keyctl=219,
                      mount=40, umount2=39, pivot_root=41, fsopen=430, open_tree=428,
                      init_module=105, kexec_load=104)}[os.uname().machine]
libc.syscall.restype = ctypes.c_long
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr[name], *[ctypes.c_ulong(a) for a in args])
    return r, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
buf = ctypes.create_string_buffer(16)
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = IOV(ctypes.cast(buf, ctypes.c_void_p), 16)
remote = IOV(ctypes.cast(buf, ctypes.c_void_p), 16)
out = {}
out["ptrace"] = call("ptrace", 0, 0, 0, 0)  # PTRACE_TRACEME
out["pvr"] = call("pvr", os.getpid(), ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
out["pvw"] = call("pvw", os.getpid(), ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
out["bpf"] = call("bpf", 0, 0, 0)
out["perf"] = call("perf", 0, 0, -1, -1, 0)
out["uffd"] = call("uffd", 0)
out["keyctl"] = call("keyctl", 0, (1 << 64) - 3, 0)  # KEYCTL_GET_KEYRING_ID, session keyring
for name in ("mount", "umount2", "pivot_root", "fsopen", "open_tree", "init_module",
             "kexec_load"):
    out[name] = call(name, 0, 0, 0, 0, 0)
r, w = os.pipe()
for req, key in ((0x5412, "tiocsti"), (0x1_0000_5412, "tiocsti_hi"), (0x5413, "tiocgwinsz")):
    try:
        fcntl.ioctl(r, req, b"x" * 8)
        out[key] = (0, None)
    except OSError as e:
        out[key] = (-1, errno.errorcode[e.errno])
    except OverflowError:
        out[key] = (-1, "overflow")
print(repr(out))
"""


async def test_seccomp_denials(box: BwrapSandbox) -> None:
    r = await box.exec(["python3", "-c", SECCOMP_PROBE])
    assert r.ok, r
    out = eval(r.stdout)  # our own probe's repr of a dict of tuples
    for name in ("ptrace", "pvr", "pvw", "bpf", "perf", "uffd", "keyctl", "mount", "umount2"):
        assert out[name] == (-1, "EPERM"), (name, out[name])
    for name in ("pivot_root", "fsopen", "open_tree", "init_module", "kexec_load"):
        assert out[name] == (-1, "EPERM"), (name, out[name])
    # TIOCSTI on a pipe would be ENOTTY without the filter: EPERM proves the filter matched
    assert out["tiocsti"] == (-1, "EPERM")
    assert out["tiocgwinsz"] == (-1, "ENOTTY")  # other ioctls pass through
    assert out["tiocsti_hi"][1] in ("EPERM", "overflow")
    r = await box.exec("grep '^Seccomp:' /proc/self/status")
    assert r.stdout.split() == ["Seccomp:", "2"], r


async def test_only_a_sandbox_that_traces_execs_allows_ptrace(backend: BwrapBackend) -> None:
    """The terminal verifier's sandbox (SandboxSpec.traces_execs, for its exec guard) may
    ptrace; every other keeps it denied, on bwrap and in the docker profile."""
    spec = SandboxSpec(default_timeout_s=20, traces_execs=True)
    async with await backend.create(spec) as traced:
        r = await traced.exec(["python3", "-c", SECCOMP_PROBE])
    out = eval(r.stdout)  # our own probe's repr of a dict of tuples
    assert out["ptrace"][0] == 0, out["ptrace"]  # PTRACE_TRACEME: allowed
    assert out["pvr"] == (-1, "EPERM") and out["bpf"] == (-1, "EPERM")
    assert "ptrace" in seccomp.denied() and "ptrace" not in seccomp.denied(traces_execs=True)
    for traces, denied in ((False, True), (True, False)):
        rules = seccomp.docker_profile(traces_execs=traces)["syscalls"]
        names = {n for rule in rules for n in rule["names"]}  # type: ignore[attr-defined]
        assert ("ptrace" in names) is denied


async def test_seccomp_normal_programs_work(box: BwrapSandbox) -> None:
    r = await box.exec("ls / >/dev/null && sh -c 'echo sh' && python3 -c 'import ssl; print(1)'")
    assert r.ok and r.stdout == "sh\n1\n", r
    assert (await box.exec("unshare -U true")).exit_code != 0
    assert (await box.exec("mount -t tmpfs none /tmp")).exit_code != 0
    if shutil.which("gcc"):
        await box.write_file("hello.c", '#include <stdio.h>\nint main(){puts("hi");return 0;}\n')
        r = await box.exec("gcc -o hello hello.c && ./hello")
        assert r.ok and r.stdout == "hi\n", r


def test_seccomp_programs_assemble() -> None:
    for arch in (seccomp.AUDIT_ARCH_X86_64, seccomp.AUDIT_ARCH_AARCH64):
        prog = seccomp.build(arch)
        assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 256
        assert set(seccomp.DENIED) <= set(seccomp.SYSCALLS[arch])
    assert seccomp.filter_bytes() == seccomp.build(seccomp.host_arch())


async def test_seccomp_can_be_turned_off(tmp_path: Path) -> None:
    b = BwrapBackend(None if IS_ROOT else tmp_path / "rt", seccomp_filter=False)
    try:
        async with await b.create(SandboxSpec()) as s:
            r = await s.exec("grep '^Seccomp:' /proc/self/status")
            assert r.stdout.split() == ["Seccomp:", "0"], r
        assert "off" in b.seccomp_status
    finally:
        await b.aclose()


# ---- environment and spec checks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (SandboxSpec(memory_mb=host_memory_mb() + 1024), "memory_mb"),
        (SandboxSpec(memory_mb=1), "memory_mb"),
        (SandboxSpec(cpus=host_cpus() + 1), "cpus"),
        (SandboxSpec(cpus=0), "cpus"),
        (SandboxSpec(pids=0), "pids"),
        (SandboxSpec(pids=-5), "pids"),
        (SandboxSpec(workspace_mb=10**7), "workspace_mb"),
        (SandboxSpec(workspace_mb=0), "workspace_mb"),
        (SandboxSpec(default_timeout_s=0), "default_timeout_s"),
        (SandboxSpec(env=(("LD_PRELOAD", "/x.so"),)), "LD_PRELOAD"),
        (SandboxSpec(env=(("BAD-NAME", "x"),)), "BAD-NAME"),
        (SandboxSpec(env=(("A", "x\0y"),)), "NUL"),
        (SandboxSpec(workdir="relative"), "workdir"),
        (SandboxSpec(network=True), "network"),
        (SandboxSpec(image="python:3.11"), "image"),
        (SandboxSpec(image="/nonexistent/rootfs"), "image"),
    ],
)
async def test_spec_errors_name_the_limit(
    backend: BwrapBackend, spec: SandboxSpec, needle: str
) -> None:
    with pytest.raises(SandboxSpecError, match=needle):
        await backend.create(spec)
    assert backend.live_count == 0


async def test_exec_env_checked(box: BwrapSandbox) -> None:
    for env in ({"LD_LIBRARY_PATH": "/tmp"}, {"1X": "y"}, {"A=B": "c"}, {"A": "\0"}):
        with pytest.raises(ValueError):
            await box.exec("true", env=env)
    r = await box.exec("echo $lower_ok $UP_1", env={"lower_ok": "a", "UP_1": "b"})
    assert r.stdout == "a b\n"


async def test_rlimits_inside(box: BwrapSandbox, backend: BwrapBackend) -> None:
    r = await box.exec("cat /proc/self/limits")
    lines = {line[:26].strip(): line[26:].split() for line in r.stdout.splitlines()[1:]}
    ws = str(box.spec.workspace_mb << 20)
    assert lines["Max file size"][:2] == [ws, ws]
    assert lines["Max open files"][:2] == ["1024", "1024"]
    assert lines["Max core file size"][:2] == ["0", "0"]
    if backend.cgroups is not None:  # the memory cgroup replaces the address-space limit
        assert lines["Max address space"][:2] == ["unlimited", "unlimited"]
    else:
        mem = str(box.spec.memory_mb << 20)
        assert lines["Max address space"][:2] == [mem, mem]


# ---- cgroups -------------------------------------------------------------------------------


async def test_cgroup_status_reported(tmp_path: Path) -> None:
    b = BwrapBackend(None if IS_ROOT else tmp_path / "rt")
    assert b.cgroup_status
    if b.cgroups is None:
        assert "unavailable" in b.cgroup_status
    off = BwrapBackend(None if IS_ROOT else tmp_path / "rt", cgroups="off")
    assert off.cgroups is None and "off" in off.cgroup_status
    async with await off.create(SandboxSpec()) as s:
        assert s.cgroup is None and (await s.exec("true")).ok


async def test_memory_bomb_is_oom_killed(backend: BwrapBackend) -> None:
    _need_cgroups(backend)
    async with await backend.create(SandboxSpec(memory_mb=128)) as s:
        assert s.cgroup is not None
        bomb = "b = []\nwhile True: b.append(bytearray(16 << 20))"
        r = await s.exec(["python3", "-c", bomb])
        assert r.oom_killed and r.exit_code == 137 and not r.timed_out, r
        # the sandbox stays usable, and reservations beyond the limit are fine (no RLIMIT_AS)
        code = "import mmap; m = mmap.mmap(-1, 2 << 30); b = bytearray(32 << 20); print('ok')"
        r = await s.exec(["python3", "-c", code])
        assert r.ok and r.stdout == "ok\n" and not r.oom_killed, r


async def test_fork_bomb_contained(backend: BwrapBackend) -> None:
    _need_cgroups(backend)
    bomb_spec = SandboxSpec(pids=32, default_timeout_s=20)
    async with (
        await backend.create(bomb_spec) as bombed,
        await backend.create(SandboxSpec()) as other,
    ):
        code = (
            "import os, time\n"
            "n = 0\n"
            "try:\n"
            "    while n < 1000:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(30); os._exit(0)\n"
            "        n += 1\n"
            "except OSError as e:\n"
            "    print(n, e.errno)\n"
        )
        r = await bombed.exec(["python3", "-c", code], timeout=10)
        n, err = r.stdout.split()
        assert 0 < int(n) < 32 and err == "11", r  # EAGAIN from pids.max
        # a shell fork bomb until the timeout: others are unaffected, everything dies
        task = asyncio.create_task(bombed.exec("f() { f | f & }; f; sleep 30", timeout=2))
        await asyncio.sleep(0.5)
        r2 = await other.exec(["python3", "-c", "import os; print(len([os.getpid()]))"])
        assert r2.ok, r2
        assert subprocess.run(["true"], check=False).returncode == 0
        res = await task
        # Either the bomb runs into the timeout, or pids.max makes its own shell give up
        # ("Cannot fork") first; both are contained, and nothing of it survives.
        assert res.timed_out or res.exit_code != 0, res
        assert bombed.cgroup is not None and _not_waiting(bombed) == []
        assert (await bombed.exec("echo alive")).stdout == "alive\n"


def _not_waiting(box: BwrapSandbox) -> list[int]:
    """The processes in `box`'s cgroup but the jail started ahead for its next exec (bwrap
    and the exec helper's stub, which runs no code of the sandbox's)."""
    assert box.cgroup is not None
    procs = box.cgroup.procs()
    fut = box.jails.ahead
    if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
        return procs
    jail, tree = fut.result().proc.pid, set()
    todo = [jail]
    while todo:  # the waiting jail's process tree, from /proc/<pid>/task/<tid>/children
        pid = todo.pop()
        tree.add(pid)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [p for p in procs if p not in tree]


async def test_cpu_quota_throttles(backend: BwrapBackend) -> None:
    _need_cgroups(backend)
    assert backend.cgroups is not None
    if not backend.cgroups.has_cpu:
        pytest.skip("no cpu controller")
    async with await backend.create(SandboxSpec(cpus=0.25)) as s:
        code = (
            "import time\n"
            "w0, c0 = time.monotonic(), time.process_time()\n"
            "while time.monotonic() - w0 < 1.5: pass\n"
            "print((time.process_time() - c0) / (time.monotonic() - w0))\n"
        )
        r = await s.exec(["python3", "-c", code])
        assert r.ok, r
        assert float(r.stdout) < 0.6, r.stdout  # ~0.25; loose for a loaded machine
        assert s.cgroup is not None
        stat = [d / "cpu.stat" for d in s.cgroup.dirs if (d / "cpu.stat").exists()]
        throttled = [cgroups_mod._counter(f, "nr_throttled") for f in stat]
        assert any(t > 0 for t in throttled), throttled


async def test_close_removes_cgroup(backend: BwrapBackend) -> None:
    _need_cgroups(backend)
    s = await backend.create(SandboxSpec())
    assert s.cgroup is not None
    dirs = list(s.cgroup.dirs)
    assert all(d.is_dir() for d in dirs)
    task = asyncio.create_task(s.exec("sleep 100 & sleep 100"))
    await asyncio.sleep(0.3)
    await s.close()
    with pytest.raises(SandboxGone):
        await task
    assert not any(d.exists() for d in dirs)


# ---- a sandbox that died ---------------------------------------------------------------------


@needs_root
async def test_lost_workspace_is_sandbox_gone(backend: BwrapBackend) -> None:
    s = await backend.create(SandboxSpec())
    assert (await s.exec("true")).ok
    unmount(s.workspace)  # what an infrastructure fault would do
    with pytest.raises(SandboxGone, match="unmounted"):
        await s.exec("true")
    assert not s.alive and backend.live_count == 0


async def test_lost_cgroup_is_sandbox_gone(backend: BwrapBackend) -> None:
    _need_cgroups(backend)
    s = await backend.create(SandboxSpec())
    assert s.cgroup is not None
    s.cgroup.remove()
    with pytest.raises(SandboxGone, match="cgroup"):
        await s.exec("true")
    assert not s.alive


# ---- the collector -------------------------------------------------------------------------


@needs_root
def test_collector_reaps_dead_server() -> None:
    mgr, why = cgroups_mod.detect()
    if mgr is None:
        pytest.skip(f"no cgroups here: {why}")
    dead = "999999999"  # above any pid_max: never a live process
    base = default_runtime_base()
    folder = base / dead / "0123456789abcdef"
    ws = folder / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    assert (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ws)]).returncode == 0
    )
    fake = cgroups_mod.CgroupManager(mgr.version, mgr.roots, pid=int(dead))
    cg = fake.create("0123456789abcdef", 64 << 20, 16, None)
    joins = "; ".join(f"echo $$ > {f}" for f in cg.procs_files)
    proc = subprocess.Popen(["sh", "-c", f"{joins}; exec sleep 1000"])
    try:
        deadline = time.monotonic() + 5
        while proc.pid not in cg.procs() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.pid in cg.procs()
        b = BwrapBackend()  # reaps at start
        assert b.runtime_dir.name == str(os.getpid())
        assert proc.wait(timeout=5) == -9
        assert not any(d.exists() for d in cg.dirs)
        assert not any(d.exists() for d in fake.server_dirs())
        assert not (base / dead).exists()
        assert str(ws) not in Path("/proc/mounts").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        cg.remove()
        for d in fake.server_dirs():
            with contextlib.suppress(OSError):
                d.rmdir()
        if str(ws) in Path("/proc/mounts").read_text():
            unmount(ws)
        shutil.rmtree(base / dead, ignore_errors=True)


# ---- image rootfs ----------------------------------------------------------------------------


@pytest.fixture
def tiny_rootfs() -> Iterator[Path]:
    """A rootfs dir: the host's /usr bound in, merged-/usr symlinks, its own /etc."""
    if not IS_ROOT:
        pytest.skip("building a bind-mounted rootfs needs root")
    top = Path(tempfile.mkdtemp(prefix="palaestra-rootfs-"))
    os.chmod(top, 0o755)
    root = top / "tiny" / "rootfs"
    (root / "usr").mkdir(parents=True)
    (root / "etc").mkdir()
    for p in (top / "tiny", root, root / "etc"):
        os.chmod(p, 0o755)
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), root / name)
    for f, text in (("passwd", "root:x:0:0::/root:/bin/sh\n"), ("group", "root:x:0:\n")):
        (root / "etc" / f).write_text(text)
    (root / "etc" / "palaestra-image").write_text("tiny image\n")
    for f in root.joinpath("etc").iterdir():
        os.chmod(f, 0o644)
    mounted = subprocess.run(["mount", "--bind", "/usr", str(root / "usr")]).returncode == 0
    if not mounted:
        shutil.rmtree(top)
        pytest.skip("cannot bind-mount /usr")
    try:
        yield root
    finally:
        unmount(root / "usr")
        shutil.rmtree(top, ignore_errors=True)


async def _check_image(backend: BwrapBackend, image: str, marker: str | None) -> None:
    async with await backend.create(SandboxSpec(image=image)) as s:
        if marker is not None:
            r = await s.exec("cat /etc/palaestra-image")
            assert r.stdout == marker, r
        r = await s.exec("python3 -c 'import os; print(os.getuid())' && id -un && pwd")
        assert r.ok and r.stdout == "1000\nsandbox\n/work\n", r
        await s.write_file("x.txt", "data")
        assert (await s.exec("cat x.txt")).stdout == "data"
        assert (await s.exec("touch /usr/pwned")).exit_code != 0
        # the host's /etc is not there: only the image's
        assert (await s.exec("test -e /etc/ld.so.cache")).exit_code != 0 or marker is None


async def test_image_rootfs_by_path(
    backend: BwrapBackend, tiny_rootfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A path is taken only inside the operator's images dir (tests/redteam/test_host_paths.py).
    monkeypatch.setattr(backend, "images_dir", tiny_rootfs.parent.parent)
    await _check_image(backend, str(tiny_rootfs), "tiny image\n")


async def test_image_rootfs_by_name(
    backend: BwrapBackend, tiny_rootfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend, "images_dir", tiny_rootfs.parent.parent)
    await _check_image(backend, "tiny", "tiny image\n")
    with pytest.raises(SandboxSpecError, match="no rootfs"):
        await backend.create(SandboxSpec(image="missing"))


def _base_rootfs() -> Path | None:
    explicit = os.environ.get("PALAESTRA_TEST_ROOTFS")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("PALAESTRA_CACHE") or str(Path.home() / ".cache" / "palaestra")
    p = Path(cache) / "images" / "base" / "rootfs"
    return p if p.is_dir() else None


@pytest.mark.skipif(
    _base_rootfs() is None,
    reason="no built base image (images/base/build.sh; or set PALAESTRA_TEST_ROOTFS)",
)
async def test_image_rootfs_base(backend: BwrapBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _base_rootfs()
    assert root is not None
    monkeypatch.setattr(backend, "images_dir", root.parent.parent)
    await _check_image(backend, str(root), None)


# ---- the fork server's runs get the same filter -------------------------------------------------


async def test_forkserver_runs_are_filtered() -> None:
    from palaestra.sandbox.forkrun import PythonRun
    from palaestra.sandbox.forkserver import ForkServerUnavailable, PythonForkServer

    server = PythonForkServer()
    try:
        probe = "print(open('/proc/self/status').read().count('Seccomp:\\t2'))\n"
        job = PythonRun(SECCOMP_PROBE + probe, timeout=20, max_output=1 << 16, workspace_mb=8)
        r = await server.run(job)
    except ForkServerUnavailable as e:
        pytest.skip(f"fork server unavailable: {e}")
    finally:
        await server.aclose()
    assert r.exit_code == 0, r
    probe, filtered = r.stdout.splitlines()
    out = eval(probe)
    for name in ("ptrace", "pvr", "bpf", "keyctl", "mount", "tiocsti"):
        assert out[name] == (-1, "EPERM"), (name, out[name])
    assert filtered == "1"
