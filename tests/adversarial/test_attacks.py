"""Untrusted code attacking the sandbox, parametrized over the backends (bwrap; docker when up).

Most attacks are data: a shell command (``{M}`` is the attack's marker, so `pgrep -f` finds
anything it leaves behind) and what its `ExecResult` must look like. Every attack, table or
not, ends with `Guard.check`: no leftover host process, no new zombie, the neighbouring
sandbox and the attacked one still answer `echo ok` quickly, the test process (the server
side) did not stall or balloon, and no server secret showed in the output.

Attacks a missing defence does not contain yet are marked `xfail(strict=False)` with the
defence they need (harness.NEEDS_*). The unbounded ones (fork bomb) only run once their
bounded probe shows the limit is there, so a missing limit cannot take the shared host down.
"""

from __future__ import annotations

import asyncio
import io
import re
import shlex
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxPathError,
)

from .harness import (
    ATTACK_SPEC,
    NEEDS_DEV_LIMIT,
    NEEDS_MEMORY,
    NEEDS_PIDS,
    NEEDS_TMP_INODES,
    REPO,
    Guard,
    cases,
    check_result,
    on_backends,
    unless_cgroups,
)

# A hung attack must fail its own test, not eat the suite's 300 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MEM = ATTACK_SPEC.memory_mb
DISK = ATTACK_SPEC.workspace_mb
PIDS = ATTACK_SPEC.pids


@dataclass(frozen=True)
class Expect:
    ok: bool | None = None  # exit 0 (True), non-zero or killed (False), either (None)
    timed_out: bool | None = False
    truncated: bool | None = None
    has: tuple[str, ...] = ()  # each in stdout
    lacks: tuple[str, ...] = ()  # none in stdout or stderr
    count_max: int | None = None  # bound on the last integer the attack printed
    within_s: float = 5.0  # wall time of the exec


@dataclass(frozen=True)
class Attack:
    name: str
    cmd: str
    expect: Expect
    timeout: float = 5.0
    xfail: dict[str, str] = field(default_factory=dict)


def py(code: str) -> str:
    """`python3 -c CODE` for the table (the code holds no single quote)."""
    assert "'" not in code
    return f"python3 -c '{code.strip()}'"


NET = """
import socket  # {M}
for host, port in HOSTS:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("CONNECTED", host, port)
    except OSError as e:
        print("blocked", host, port, e)
"""
FILL = (  # 8 MB files until a write fails; prints the running total in MB
    "i=0; while [ $i -lt 64 ] && head -c 8388608 /dev/zero > DIR/f$i 2>/dev/null; "
    "do i=$((i+1)); echo $((i*8)); done; : {M}"
)
MANY_FILES = """
n = 0  # {M}
try:
    while n < LIMIT:
        open("DIR/f%d" % n, "w").close()
        n += 1
        if n % 10_000 == 0:
            print(n, flush=True)
except OSError as e:
    print(e)
print(n)
"""

ATTACKS = [
    # ---- processes and memory -----------------------------------------------------------
    Attack(
        "fork_bomb_bounded",  # forks up to 400 sleepers: at most `pids` may exist at once
        py("""
import os, time  # {M}
n = 0
for i in range(400):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    n += 1
print(n)
"""),
        Expect(count_max=PIDS),
        xfail=unless_cgroups(NEEDS_PIDS),
    ),
    Attack(
        "memory_python_one_block",
        py("b = bytearray(4 << 30)  # {M}"),
        Expect(ok=False),
    ),
    Attack(
        "memory_python_grow",  # touched 16 MB chunks until the limit bites
        py("""
chunks = []  # {M}
while True:
    chunks.append(b"\\x01" * (16 << 20))
    print(16 * len(chunks), flush=True)
"""),
        Expect(ok=False, count_max=MEM, within_s=16),
        timeout=15,
    ),
    Attack(
        # 4 × 200 MB, each under RLIMIT_AS; the sandbox has 256 MB. A process says so once it
        # has held its 200 MB for 2 s: the OOM killer may take the first to allocate (the
        # largest) and let another finish, but two never hold theirs at once.
        "memory_many_processes",
        "( for i in 1 2 3 4; do "
        + py("""
import time  # {M}
b = b"\\x01" * (200 << 20)
time.sleep(2)
print("held", flush=True)
""")
        + " & done; wait ) | grep -c held",
        Expect(count_max=1, within_s=10),
        timeout=10,
        xfail=unless_cgroups(NEEDS_MEMORY),
    ),
    Attack(
        "tmpfs_fill_tmp",
        FILL.replace("DIR", "/tmp"),
        Expect(count_max=DISK),
    ),
    Attack(
        "tmpfs_fill_dev_shm",  # memory the kernel holds for the sandbox: bounded by memory_mb
        FILL.replace("DIR", "/dev/shm"),
        Expect(count_max=MEM),
        xfail=unless_cgroups(NEEDS_DEV_LIMIT),
    ),
    Attack(
        "tmpfs_fill_dev",
        FILL.replace("DIR", "/dev"),
        Expect(count_max=MEM),
        xfail=unless_cgroups(NEEDS_DEV_LIMIT),
    ),
    Attack(
        "disk_fill_one_big_file",
        "head -c 1073741824 /dev/zero > big; : {M}; du -sm . | cut -f1",
        Expect(count_max=DISK + 1),
    ),
    Attack(
        "disk_fill_million_files",  # the workspace's inode limit stops it
        py(MANY_FILES.replace("DIR", ".").replace("LIMIT", "1_000_000")),
        Expect(ok=True, count_max=100_000, within_s=20),
        timeout=20,
    ),
    Attack(
        "tmp_fill_million_files",  # ≈ 1 KiB of kernel memory each: bounded by memory_mb
        py(MANY_FILES.replace("DIR", "/tmp").replace("LIMIT", "1_000_000")),
        Expect(count_max=MEM * 1024 * 3 // 2, within_s=20),
        timeout=20,
        xfail=unless_cgroups(NEEDS_TMP_INODES),
    ),
    # ---- output ---------------------------------------------------------------------------
    Attack("stdout_flood", "yes {M}", Expect(timed_out=True, truncated=True), timeout=2),
    Attack("stderr_flood", "yes {M} >&2", Expect(timed_out=True, truncated=True), timeout=2),
    Attack(
        "one_giant_line",
        ": {M}; head -c 200000000 /dev/zero | tr '\\0' x",
        Expect(ok=True, truncated=True, within_s=15),
        timeout=15,
    ),
    Attack(
        "binary_output",
        ": {M}; head -c 50000000 /dev/urandom; head -c 1000000 /dev/urandom >&2",
        Expect(ok=True, truncated=True, within_s=10),
        timeout=10,
    ),
    Attack(
        "invalid_utf8_output",
        ": {M}; printf 'a\\377\\376b\\300'; printf '\\355\\240\\200' >&2",
        Expect(ok=True, has=("a\ufffd\ufffdb\ufffd",)),
    ),
    # ---- network ----------------------------------------------------------------------------
    Attack(
        "net_egress_ip",
        py(NET.replace("HOSTS", '[("1.1.1.1", 53), ("8.8.8.8", 443), ("2606:4700::1111", 53)]')),
        Expect(ok=True, lacks=("CONNECTED",), has=("blocked",)),
    ),
    Attack(
        "net_dns",
        py("""
import socket  # {M}
for name in ("example.com", "pypi.org"):
    try:
        print("RESOLVED", name, socket.getaddrinfo(name, 443))
    except OSError as e:
        print("blocked", name, e)
"""),
        Expect(ok=True, lacks=("RESOLVED",), has=("blocked",)),
    ),
    Attack(
        "net_metadata_address",
        py(NET.replace("HOSTS", '[("169.254.169.254", 80), ("169.254.169.254", 443)]')),
        Expect(ok=True, lacks=("CONNECTED",), has=("blocked",)),
    ),
    Attack(
        "docker_socket",
        py("""
import socket  # {M}
for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as e:
        print("blocked", path, e)
"""),
        Expect(ok=True, lacks=("CONNECTED",), has=("blocked",)),
    ),
    # ---- host secrets -------------------------------------------------------------------------
    Attack(
        "server_environment",  # the guard's secret is in this process's environment
        ": {M}; env; cat /proc/1/environ /proc/self/environ; "
        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done",
        Expect(has=("PATH=",), lacks=("PALAESTRA_ADVERSARIAL_SECRET",)),
    ),
    Attack(
        "host_process_list",
        ": {M}; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done",
        Expect(ok=True, lacks=("pytest", "palaestra serve", "/sbin/init", "dockerd")),
    ),
    Attack(
        "pack_store_and_repo",
        ": {M}; cat {REPO}/packs/*/tasks.jsonl {REPO}/pyproject.toml; ls -la {REPO}/packs",
        Expect(ok=False, lacks=('"id"', "[project]")),
    ),
    Attack(
        "host_files",
        ": {M}; cat /etc/shadow /root/.bashrc /run/palaestra/*/* ; ls /root /home /run /sys",
        Expect(ok=False, lacks=("root:*", "root:$", "root:!")),
    ),
    # ---- the parent and init ----------------------------------------------------------------
    Attack("kill_pid_1", "kill -9 1; sleep 0.3; echo survived {M}", Expect(within_s=3)),
    Attack("kill_everything", "sleep 99{M} & kill -9 -1; echo after", Expect(within_s=3)),
    Attack("kill_ppid", "kill -9 $PPID; sleep 0.3; echo after {M}", Expect(within_s=3)),
    Attack("kill_own_group", "sleep 99{M} & kill -9 0; echo after", Expect(within_s=3)),
    # ---- timeouts and orphans -----------------------------------------------------------------
    Attack(
        "sleep_past_timeout_sigterm_ignored",
        "trap '' TERM INT HUP QUIT; sleep 99{M}",
        Expect(timed_out=True, within_s=2.5),
        timeout=1,
    ),
    Attack(
        "busy_loop_sigterm_ignored",
        py("""
import signal  # {M}
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
while True:
    pass
"""),
        Expect(timed_out=True, within_s=2.5),
        timeout=1,
    ),
    Attack(
        "children_ignore_sigterm",
        "(trap '' TERM; sleep 99{M}) & (trap '' TERM; sleep 99{M}) & wait",
        Expect(timed_out=True, within_s=2.5),
        timeout=1,
    ),
    Attack(
        "double_fork_orphan",
        "(sleep 99{M} &) ; (sh -c 'sleep 99{M} &' &) ; echo started",
        Expect(ok=True, has=("started",), within_s=3),
    ),
    Attack(
        "setsid_nohup_orphans",
        "setsid -f sleep 99{M}; nohup sleep 99{M} >/dev/null 2>&1 & echo started",
        Expect(ok=True, has=("started",), within_s=3),
    ),
    Attack(
        "python_daemon",
        py("""
import os, sys, time  # {M}
if os.fork():
    print("parent exits"); sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.closerange(0, 1024)
time.sleep(9999)
"""),
        Expect(ok=True, within_s=3),
    ),
    Attack(
        "zombies_500",
        py("""
import os, time  # {M}
n = 0
for i in range(500):
    try:
        if os.fork() == 0:
            os._exit(0)
    except OSError:
        break
    n += 1
time.sleep(0.5)
print(n)
"""),
        Expect(ok=True, within_s=5),
    ),
    # ---- privileges ---------------------------------------------------------------------------
    Attack(
        "setuid_binaries",
        ": {M}; su root -c 'id -u' </dev/null; passwd -d root </dev/null; "
        "cp /usr/bin/id ./id2 && chmod u+s,g+s ./id2; ./id2; echo euid=$(id -u)",
        Expect(has=("euid=1000",), lacks=("uid=0",)),
    ),
    Attack(
        "setuid_syscalls",
        py("""
import os  # {M}
for name, call in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                   ("seteuid", lambda: os.seteuid(0)), ("setgroups", lambda: os.setgroups([0]))):
    try:
        call()
        print("ESCALATED", name)
    except OSError as e:
        print("denied", name, e)
print(os.getuid(), os.geteuid())
"""),
        Expect(ok=True, has=("denied setuid",), lacks=("ESCALATED",)),
    ),
    Attack(
        "capabilities_userns_mount",
        ": {M}; grep CapEff /proc/self/status; unshare -Ur id; mount -t tmpfs none /tmp && "
        "echo MOUNTED; ulimit -n 1048576 && echo RAISED",
        Expect(has=("0000000000000000",), lacks=("uid=0(root)", "MOUNTED", "RAISED")),
    ),
    Attack(
        "fd_exhaustion",
        py("""
fds = []  # {M}
try:
    while len(fds) < 1_000_000:
        fds.append(open("/dev/null"))
except OSError as e:
    print(e)
print(len(fds))
"""),
        Expect(ok=True, count_max=1024),
    ),
]


def _last_int(text: str) -> int:
    """The last integer the attack printed; 0 if it was killed before it printed any."""
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else 0


def check_expect(r: ExecResult, e: Expect, elapsed: float, max_output: int) -> None:
    check_result(r, max_output)
    both = r.stdout + r.stderr
    if e.ok is not None:
        assert r.ok is e.ok, r
    if e.timed_out is not None:
        assert r.timed_out is e.timed_out, r
    if e.truncated is not None:
        assert r.truncated is e.truncated, r
    for s in e.has:
        assert s in r.stdout, (s, r)
    for s in e.lacks:
        assert s not in both, (s, both[:2000])
    if e.count_max is not None:
        assert _last_int(r.stdout) <= e.count_max, r
    assert elapsed < e.within_s, f"exec took {elapsed:.2f} s"


@pytest.mark.parametrize(("backend_name", "attack"), cases(ATTACKS))
async def test_attack(backend_name: str, attack: Attack, box: Sandbox, guard: Guard) -> None:
    cmd = attack.cmd.replace("{M}", guard.marker).replace("{REPO}", str(REPO))
    t0 = time.monotonic()
    r = await box.exec(cmd, timeout=attack.timeout)
    elapsed = time.monotonic() - t0
    try:
        check_expect(r, attack.expect, elapsed, DEFAULT_MAX_OUTPUT)
    finally:
        await guard.check(r.stdout, r.stderr)


# ---- attacks that need more than a command ---------------------------------------------------


@pytest.mark.parametrize("backend_name", on_backends(unless_cgroups(NEEDS_PIDS)))
async def test_fork_bomb(box: Sandbox, guard: Guard) -> None:
    # The bounded probe first: without a pids limit the real bomb would exhaust the host's
    # pid space for everyone on this machine, so it only runs once the limit is there.
    probe = ATTACKS[0]
    r = await box.exec(probe.cmd.replace("{M}", guard.marker), timeout=probe.timeout)
    assert _last_int(r.stdout) <= PIDS, f"no pids limit: {r.stdout!r} processes started"
    t0 = time.monotonic()
    r = await box.exec(
        "bomb() { bomb | bomb & }; bomb; : {M}".replace("{M}", guard.marker), timeout=3
    )
    assert time.monotonic() - t0 < 4.5
    await guard.check(r.stdout, r.stderr)


@pytest.mark.parametrize("backend_name", on_backends())
async def test_memory_bomb_c(box: Sandbox, guard: Guard, tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc on the host to build the C memory bomb")
    src = tmp_path / "bomb.c"
    src.write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
        "int main(void) { size_t mb = 0; for (;;) { char *p = malloc(16 << 20);\n"
        '  if (!p) { printf("malloc failed\\n"); return 1; }\n'
        '  memset(p, 1, 16 << 20); mb += 16; printf("%zu\\n", mb); fflush(stdout); } }\n'
    )
    exe = tmp_path / "bomb"
    # In a thread: the guard is already timing this event loop, and gcc takes a while.
    await asyncio.to_thread(
        subprocess.run, [gcc, "-O0", "-o", str(exe), str(src)], check=True, timeout=60
    )
    await box.write_file(f"bomb{guard.marker}", exe.read_bytes(), mode=0o755)
    r = await box.exec(f"./bomb{guard.marker}", timeout=15)
    assert not r.ok and not r.timed_out, r
    assert _last_int(r.stdout) <= MEM, r
    await guard.check(r.stdout, r.stderr)


class Listener:
    """A TCP socket on host loopback and an abstract Unix socket, counting who got in."""

    def __init__(self, marker: str) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.abstract = f"palaestra-adversarial-{marker}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.abstract)
        self.unix.listen()
        self.accepted: list[str] = []
        self._stop = False
        self._threads = [threading.Thread(target=self._accept, args=(s,)) for s in self.socks]
        for t in self._threads:
            t.start()

    @property
    def socks(self) -> list[socket.socket]:
        return [self.tcp, self.unix]

    def _accept(self, s: socket.socket) -> None:
        s.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = s.accept()
            except OSError:
                continue
            self.accepted.append(repr(s))
            conn.close()

    def close(self) -> None:
        self._stop = True
        for t in self._threads:
            t.join()
        for s in self.socks:
            s.close()


@pytest.fixture
def listener(marker: str) -> Iterator[Listener]:
    lst = Listener(marker)
    try:
        yield lst
    finally:
        lst.close()


@pytest.mark.parametrize("backend_name", on_backends())
async def test_reach_host_loopback(box: Sandbox, guard: Guard, listener: Listener) -> None:
    # The host can reach both, so a refusal inside is the sandbox's doing.
    socket.create_connection(("127.0.0.1", listener.port), timeout=2).close()
    probe = socket.socket(socket.AF_UNIX)
    probe.connect("\0" + listener.abstract)
    probe.close()
    deadline = time.monotonic() + 2
    while len(listener.accepted) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(listener.accepted) == 2
    listener.accepted.clear()
    code = f"""
import socket  # {guard.marker}
for port in ({listener.port}, 8000, 8080, 80):
    for host in ("127.0.0.1", "localhost", "::1"):
        try:
            socket.create_connection((host, port), timeout=1).close()
            print("CONNECTED", host, port)
        except OSError as e:
            print("blocked", host, port, e)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\0{listener.abstract}")
    print("CONNECTED abstract")
except OSError as e:
    print("blocked abstract", e)
"""
    r = await box.exec(["python3", "-c", code], timeout=10)
    assert r.ok and "blocked" in r.stdout and "CONNECTED" not in r.stdout, r
    await asyncio.sleep(0.2)
    assert listener.accepted == []
    await guard.check(r.stdout, r.stderr)


@pytest.mark.parametrize("backend_name", on_backends())
async def test_data_dir_unreachable(box: Sandbox, guard: Guard, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "packs").mkdir(parents=True)
    (data / "packs" / "secret.jsonl").write_text(f"answer-{guard.marker}\n")
    for p in (tmp_path, data, data / "packs"):
        p.chmod(0o755)
    (data / "packs" / "secret.jsonl").chmod(0o644)
    r = await box.exec(f"cat {data}/packs/secret.jsonl; ls -R {data} {tmp_path}")
    assert not r.ok and f"answer-{guard.marker}" not in r.stdout + r.stderr, r
    await guard.check(r.stdout, r.stderr)


@pytest.mark.parametrize("backend_name", on_backends())
async def test_one_megabyte_command(box: Sandbox, guard: Guard) -> None:
    # A model's command is data: too long for execve is a failed command, not a void episode.
    big = "echo " + "a" * (1 << 20) + " | wc -c  # " + guard.marker
    try:
        r = await box.exec(big, timeout=10)
    finally:
        await guard.check()
    check_result(r, DEFAULT_MAX_OUTPUT)
    assert (r.ok and r.stdout.strip() == str((1 << 20) + 1)) or not r.ok, r


@pytest.mark.parametrize("backend_name", on_backends())
async def test_one_megabyte_script_on_stdin(box: Sandbox, guard: Guard) -> None:
    script = f": {guard.marker}\n" + "echo line\n" * 100_000  # 1 MB of shell
    r = await box.exec(["sh"], stdin=script, timeout=20)
    assert r.ok and r.truncated and r.stdout.startswith("line\n"), r
    await guard.check(r.stdout, r.stderr)


@pytest.mark.parametrize("backend_name", on_backends())
async def test_invalid_utf8_argv(box: Sandbox, guard: Guard) -> None:
    # Lone surrogates are how Python spells undecodable bytes (os.fsencode: surrogateescape).
    try:
        r = await box.exec(["printf", "%s|%s", "a\udcff\udcfeb", guard.marker], timeout=5)
    except (ValueError, UnicodeError):
        r = None  # refusing the argv is fine; crashing or escaping is not
    if r is not None:
        assert r.ok and r.stdout.startswith("a\ufffd\ufffdb|"), r
    await guard.check()


@pytest.mark.parametrize("backend_name", on_backends())
async def test_invalid_utf8_file_names(box: Sandbox, guard: Guard) -> None:
    r = await box.exec(f"touch \"$(printf 'bad\\377name{guard.marker}')\" && ls | wc -l")
    assert r.ok, r
    data = await box.download_tar()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        names = tf.getnames()
    assert any(guard.marker in n for n in names), names
    name = f"w\udcff{guard.marker}.txt"
    try:
        await box.write_file(name, b"payload")
    except (SandboxPathError, ValueError, UnicodeError):
        pass
    else:
        assert await box.read_file(name) == b"payload"
        r = await box.exec(f"cat w*{guard.marker}.txt")
        assert r.stdout == "payload", r
    await guard.check()


# ---- escapes through the file API ------------------------------------------------------------

HOST_CANARY = "/tmp/palaestra-adversarial-canary"
# Backends whose file API is known to follow symlinks inside the sandbox (none now: docker's
# checks every component through the archive API's stat before it reads or writes).
FILE_API_FOLLOWS: dict[str, str] = {}


@dataclass(frozen=True)
class FileAttack:
    name: str
    setup: str  # shell run inside first; NEIGHBOUR is the neighbour's host workspace
    op: str  # read | write | download
    path: str
    xfail: dict[str, str] = field(default_factory=dict)


FILE_ATTACKS = [
    FileAttack("read_symlink_to_host_file", "ln -s /etc/shadow s", "read", "s"),
    FileAttack("read_through_dir_symlink", "ln -s /etc d", "read", "d/passwd"),
    FileAttack("read_dotdot", "true", "read", "../../../../etc/shadow"),
    FileAttack("read_absolute_outside", "true", "read", "/proc/1/environ"),
    FileAttack("write_symlink_to_host_file", f"ln -s {HOST_CANARY} s", "write", "s"),
    FileAttack("write_through_dir_symlink", "ln -s /tmp d", "write", "d/x"),
    FileAttack("write_through_relative_dir_symlink", "ln -s ../../.. up", "write", "up/tmp/x"),
    FileAttack("write_dotdot", "true", "write", "a/../../../tmp/x"),
    FileAttack("write_neighbour_workspace", "ln -s NEIGHBOUR n", "write", "n/pwned"),
    FileAttack("read_neighbour_workspace", "ln -s NEIGHBOUR n", "read", "n/secret"),
    FileAttack("write_fifo", "mkfifo f", "write", "f"),
    FileAttack("download_through_dir_symlink", "ln -s /etc d", "download", "d"),
]


@pytest.mark.parametrize(("backend_name", "attack"), cases(FILE_ATTACKS))
async def test_file_api_escape(
    backend_name: str, attack: FileAttack, box: Sandbox, neighbour: Sandbox, guard: Guard
) -> None:
    canary = Path(HOST_CANARY)
    canary.write_text("canary")
    canary.chmod(0o666)
    await neighbour.write_file("secret", f"neighbour-{guard.marker}")
    nws = getattr(neighbour, "workspace", "/nonexistent-neighbour")
    r = await box.exec(attack.setup.replace("NEIGHBOUR", str(nws)))
    assert r.ok, r
    followed = ""  # what the op did instead of refusing the path
    try:
        try:
            if attack.op == "read":
                data = await box.read_file(attack.path)
                followed = f"read_file returned {data[:60]!r}"
            elif attack.op == "write":
                await asyncio.wait_for(box.write_file(attack.path, "pwned"), 5)
                followed = "write_file succeeded"
            else:
                data = await box.download_tar(attack.path)
                assert b"root:" not in data, "download_tar followed a symlink out"
        except (SandboxPathError, FileNotFoundError):
            pass
        # The host and the neighbour first: an escape there is never an expected failure.
        assert canary.read_text() == "canary"
        assert not Path("/tmp/x").is_file() or Path("/tmp/x").read_text() != "pwned"
        r = await neighbour.exec("ls; cat secret")
        assert "pwned" not in r.stdout and r.stdout.endswith(f"neighbour-{guard.marker}"), r
    finally:
        canary.unlink()
    await guard.check()
    if followed:
        # The interface (DESIGN §5): a path that leaves the workspace is a SandboxPathError.
        reason = FILE_API_FOLLOWS.get(backend_name)
        if reason:
            pytest.xfail(f"{reason}: {followed}")
        pytest.fail(f"{attack.op} {attack.path!r} was not refused: {followed}")


def _tar(*members: tuple[str, bytes, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind, link in members:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.linkname = link
            data = b"pwned" if kind == tarfile.REGTYPE else b""
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


TAR_ATTACKS = {
    "dotdot_member": _tar(("../../../tmp/x", tarfile.REGTYPE, "")),
    "absolute_member": _tar(("/tmp/x", tarfile.REGTYPE, "")),
    "symlink_then_file": _tar(("l", tarfile.SYMTYPE, "/tmp"), ("l/x", tarfile.REGTYPE, "")),
    "relative_symlink_then_file": _tar(
        ("a/l", tarfile.SYMTYPE, "../.."), ("a/l/x", tarfile.REGTYPE, "")
    ),
    "chained_symlinks": _tar(
        ("s1", tarfile.SYMTYPE, "."),
        ("s1/s2", tarfile.SYMTYPE, ".."),
        ("s1/s2/x", tarfile.REGTYPE, ""),
    ),
    "hardlink_to_host": _tar(("h", tarfile.LNKTYPE, "/etc/shadow")),
    "device_node": _tar(("dev", tarfile.CHRTYPE, "")),
}


@pytest.mark.parametrize("backend_name", on_backends())
@pytest.mark.parametrize("tar_name", sorted(TAR_ATTACKS))
async def test_upload_tar_escape(
    backend_name: str, box: Sandbox, guard: Guard, tar_name: str
) -> None:
    target = Path("/tmp/x")
    before = target.read_bytes() if target.is_file() else None  # a folder: nothing to write
    refused = False
    try:
        await box.upload_tar(TAR_ATTACKS[tar_name])
    except SandboxError:
        refused = True
    assert (target.read_bytes() if target.is_file() else None) == before
    r = await box.exec("ls -la /tmp /work; cat /work/h 2>/dev/null")
    assert "root:" not in r.stdout, r
    await guard.check()
    if not refused:
        reason = FILE_API_FOLLOWS.get(backend_name)
        if reason:
            pytest.xfail(f"{reason}: tar {tar_name} was extracted")
        pytest.fail(f"tar {tar_name} was extracted, not refused")


# ---- the persistent shell ------------------------------------------------------------------


async def _shell_or_skip(box: Sandbox, backend_name: str) -> object:
    try:
        return await box.shell()
    except SandboxError as e:
        pytest.skip(f"{backend_name} sandbox.shell() unavailable: {e}")


@dataclass(frozen=True)
class ShellAttack:
    name: str
    cmd: str
    hangs: bool  # runs past its timeout=1 unless stopped
    xfail: dict[str, str] = field(default_factory=dict)


SHELL_ATTACKS = [
    ShellAttack("exit", "exit 7", False),
    ShellAttack("exec_replaces_shell", "exec sleep 99{M}", True),
    ShellAttack(
        "exec_other_shell",
        "exec sh -c 'echo replaced; sleep 99{M}'",
        True,
    ),
    ShellAttack("kill_own_shell", "kill -9 $$", False),
    ShellAttack("close_stdout", "exec 1>&- 2>&-; sleep 99{M}", True),
    ShellAttack("ignore_interrupt", "trap '' INT TERM; sleep 99{M}", True),
    ShellAttack("background_sleeper", "sleep 99{M} &", False),
    ShellAttack("stop_the_shell", "kill -STOP $$", True),
]


@pytest.mark.parametrize(("backend_name", "attack"), cases(SHELL_ATTACKS))
async def test_shell_attack(
    backend_name: str, attack: ShellAttack, box: Sandbox, guard: Guard
) -> None:
    from palaestra.sandbox.base import ShellSession

    session = await _shell_or_skip(box, backend_name)
    assert isinstance(session, ShellSession)
    cmd, hangs = attack.cmd, attack.hangs
    try:
        await session.run("cd /tmp && export KEEP=1")
        t0 = time.monotonic()
        r = await session.run(cmd.replace("{M}", guard.marker), timeout=1)
        assert time.monotonic() - t0 < 3.0
        if hangs:
            assert r.timed_out, r
        r = await session.run("echo ok; pwd", timeout=5)
        assert r.output.startswith("ok\n") and r.exit_code == 0, r
    finally:
        await session.close()
    # A background job may outlive its command while the session lives, never the session.
    await guard.check()


@pytest.mark.parametrize("backend_name", on_backends())
async def test_shell_forged_sentinels(backend_name: str, box: Sandbox, guard: Guard) -> None:
    from palaestra.sandbox.base import ShellSession

    session = await _shell_or_skip(box, backend_name)
    assert isinstance(session, ShellSession)
    try:
        # Whatever the shell wraps a command in, the command can print it back; a forged end
        # marker must neither end the command early nor change its exit code or cwd.
        r0 = await session.run("declare -p 2>/dev/null; set; trap -p; echo $PS1 $PROMPT_COMMAND")
        wrapper = "\n".join(line for line in r0.output.splitlines() if "PALAESTRA" in line.upper())
        forged = (
            f"printf '%s\\n' {shlex.quote(wrapper)}; "
            "printf '__PALAESTRA_DONE__ 0 /\\n__END__ 0 /\\n\\036Pdeadbeef\\037'; "
            "printf '0123456789abcdef0123456789abcdef 0 /\\0' >&2; "
            f"printf '\\n%s\\n' {shlex.quote(r0.output[-2000:])}; "
            f"sleep 0.3; echo after-{guard.marker}; cd /usr; false"
        )
        r = await session.run(forged, timeout=10)
        assert f"after-{guard.marker}" in r.output, r
        assert r.exit_code == 1 and r.cwd == "/usr" and not r.timed_out, r
        r = await session.run("echo ok")
        assert r.output == "ok\n" and r.exit_code == 0 and r.cwd == "/usr", r
    finally:
        await session.close()
    await guard.check()


def test_table_size() -> None:
    # The issue asks for at least 30 attacks: the table plus the dedicated tests above.
    dedicated = 9 + len(FILE_ATTACKS) + len(TAR_ATTACKS) + len(SHELL_ATTACKS) + 1
    assert len(ATTACKS) + dedicated >= 30
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)
