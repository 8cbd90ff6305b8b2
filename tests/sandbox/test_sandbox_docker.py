"""The docker backend against the local engine (scripts/docker-up.sh starts it in `make test`).

Skipped, with the reason in the summary (`-rs`), where no engine answers or the base image
is not built."""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import make_settings

from palaestra.sandbox import SandboxGone, SandboxPathError, SandboxSpec, SandboxSpecError
from palaestra.sandbox.docker import BASE_IMAGE, DockerBackend, DockerSandbox
from tests.conftest import docker_skip_reason
from tests.hosts import local_host

WHY = docker_skip_reason(BASE_IMAGE)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]

SPEC = SandboxSpec(memory_mb=128, pids=64, workspace_mb=16, default_timeout_s=10.0)


@pytest.fixture
async def backend() -> AsyncIterator[DockerBackend]:
    b = DockerBackend()
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture
async def box(backend: DockerBackend) -> AsyncIterator[DockerSandbox]:
    async with await backend.create(SPEC) as sandbox:
        yield sandbox


def user_procs(box: DockerSandbox) -> list[str]:
    """The container's processes of the sandbox user, as the host sees them (docker top)."""
    top = box._container.top(ps_args="-eo uid,pid,args")
    return [" ".join(p) for p in top["Processes"] if p[0] == "1000"]


async def test_exec_output_and_exit_codes(box: DockerSandbox) -> None:
    r = await box.exec(["echo", "hi"])
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (0, "hi\n", "", True)
    r = await box.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    r = await box.exec("id -u; pwd; echo $HOME")
    assert r.stdout.split() == ["1000", "/work", "/work"]
    assert (await box.exec(["no-such-program"])).exit_code == 127
    assert (await box.exec("pwd", cwd="missing")).exit_code == 1
    r = await box.exec("echo $A$B", env={"A": "x", "B": "y"})
    assert r.stdout == "xy\n"


async def test_stdin(box: DockerSandbox) -> None:
    r = await box.exec(["cat"], stdin=b"hello")
    assert r.stdout == "hello"
    big = "x" * 300_000
    r = await box.exec(["python3", "-c", "import sys; print(len(sys.stdin.read()))"], stdin=big)
    assert r.stdout.strip() == "300000"


async def test_files_roundtrip(box: DockerSandbox) -> None:
    await box.write_file("d/e/f.txt", "content", mode=0o600)
    assert await box.read_file("d/e/f.txt") == b"content"
    assert await box.read_file("/work/d/e/f.txt") == b"content"
    r = await box.exec("stat -c '%u %a' d/e/f.txt; echo more >> d/e/f.txt")
    assert r.stdout == "1000 600\n", r
    assert await box.read_file("d/e/f.txt") == b"contentmore\n"
    with pytest.raises(FileNotFoundError):
        await box.read_file("missing.txt")
    with pytest.raises(SandboxPathError):
        await box.read_file("../etc/passwd")
    with pytest.raises(SandboxPathError):
        await box.write_file("/etc/x", "no")
    await box.exec("ln -s /etc/passwd link")
    with pytest.raises(SandboxPathError):
        await box.read_file("link")
    with pytest.raises(SandboxPathError):
        await box.read_file("d")


async def test_tar_roundtrip(box: DockerSandbox) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("a.py", b"print(1)\n"), ("pkg/b.txt", b"bee")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    await box.upload_tar(buf.getvalue(), "up")
    assert (await box.exec(["python3", "up/a.py"])).stdout == "1\n"
    with tarfile.open(fileobj=io.BytesIO(await box.download_tar()), mode="r:") as tf:
        names = set(tf.getnames())
    assert {"up", "up/a.py", "up/pkg", "up/pkg/b.txt"} <= names
    with tarfile.open(fileobj=io.BytesIO(await box.download_tar("up/pkg")), mode="r:") as tf:
        assert tf.getnames() == ["pkg", "pkg/b.txt"]
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tf:
        ti = tarfile.TarInfo("../escape")
        tf.addfile(ti, io.BytesIO(b""))
    with pytest.raises(SandboxPathError):
        await box.upload_tar(evil.getvalue())


async def test_timeout_kills_everything(box: DockerSandbox) -> None:
    started = time.monotonic()
    r = await box.exec("sleep 100 & (setsid sleep 101 &); sleep 102", timeout=1.0)
    elapsed = time.monotonic() - started
    assert r.timed_out and r.exit_code == -9 and not r.ok
    assert elapsed < 2.0, elapsed
    assert user_procs(box) == []
    assert (await box.exec(["true"])).exit_code == 0  # the sandbox still works


async def test_nothing_survives_an_exec(box: DockerSandbox) -> None:
    r = await box.exec("sleep 100 & (setsid sleep 101 &); echo started")
    assert r.stdout == "started\n" and r.exit_code == 0
    assert user_procs(box) == []


async def test_fork_bomb_times_out_and_is_cleared(box: DockerSandbox) -> None:
    r = await box.exec("f() { f | f & }; f; sleep 30", timeout=2.0)
    # The pids limit stops it: by the timeout, or sooner where even `sleep` cannot fork.
    assert r.timed_out or (r.exit_code != 0 and "fork" in r.stderr), r
    assert user_procs(box) == []
    assert (await box.exec(["echo", "ok"])).stdout == "ok\n"


async def test_output_cap(box: DockerSandbox) -> None:
    r = await box.exec("yes | head -c 1000000; echo tail >&2", max_output=1000)
    assert r.truncated and len(r.stdout) == 1000 and r.stderr == "tail\n"


async def test_network_none(box: DockerSandbox) -> None:
    code = (
        "import socket\ns=socket.socket()\ns.settimeout(2)\n"
        "try:\n s.connect(('1.1.1.1', 80)); print('connected')\n"
        "except OSError as e: print('blocked', e)\n"
    )
    r = await box.exec(["python3", "-c", code])
    assert r.stdout.startswith("blocked"), r
    r = await box.exec("cat /proc/net/dev")
    assert "eth0" not in r.stdout


async def test_read_only_root_writable_workdir(box: DockerSandbox) -> None:
    r = await box.exec("touch /usr/x")
    assert r.exit_code != 0 and "Read-only" in r.stderr
    r = await box.exec("touch /etc/x || touch /x")
    assert r.exit_code != 0
    r = await box.exec("echo a > /work/a && echo b > /tmp/b && cat /work/a /tmp/b")
    assert r.stdout == "a\nb\n"


async def test_workspace_size_limit(box: DockerSandbox) -> None:
    r = await box.exec("head -c 40000000 /dev/zero > big")
    assert r.exit_code != 0 and "No space" in r.stderr


async def test_memory_limit(box: DockerSandbox) -> None:
    r = await box.exec(["python3", "-c", "x = bytearray(400 * 1024 * 1024); print('alive')"])
    assert r.oom_killed and not r.ok and "alive" not in r.stdout, r
    assert (await box.exec(["true"])).ok


async def test_pids_limit(box: DockerSandbox) -> None:
    r = await box.exec("for i in $(seq 100); do sleep 5 & done 2>&1; echo done")
    assert "fork" in r.stdout + r.stderr.lower() or "resource" in (r.stdout + r.stderr).lower()
    assert user_procs(box) == []


async def test_close_idempotent_and_gone(backend: DockerBackend) -> None:
    box = await backend.create(SPEC)
    assert backend.live_count == 1
    cid = box.container_id
    await box.close()
    await box.close()
    assert not box.alive and backend.live_count == 0
    with pytest.raises(SandboxGone):
        await box.exec(["true"])
    with pytest.raises(SandboxGone):
        await box.read_file("x")
    import docker

    client = docker.from_env()
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(cid)
    client.close()


async def test_container_killed_is_gone(backend: DockerBackend) -> None:
    box = await backend.create(SPEC)
    await asyncio.to_thread(box._container.remove, force=True)
    with pytest.raises(SandboxGone):
        await box.exec(["true"])
    await box.close()


async def test_spec_too_large(backend: DockerBackend) -> None:
    with pytest.raises(SandboxSpecError, match="memory_mb"):
        await backend.create(SandboxSpec(memory_mb=10**8))
    with pytest.raises(SandboxSpecError, match="cpus"):
        await backend.create(SandboxSpec(cpus=1000))
    with pytest.raises(SandboxSpecError, match="pids"):
        await backend.create(SandboxSpec(pids=10**7))


async def test_coding_episodes_on_docker(tmp_path: Path) -> None:
    """`palaestra serve --sandbox docker`: the oracle on two HumanEval tasks scores 1."""
    from palaestra.sdk.evaluation.runner import run_eval
    from palaestra.sdk.policies.base import OraclePolicy
    from palaestra.server.inprocess import AsyncInProcessClient
    from palaestra.server.runtime import build_manager

    manager = build_manager(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await manager.start()
    try:
        assert (
            local_host(manager).sandboxes.backend is not None
            and local_host(manager).sandboxes.backend.name == "docker"
        )
        client = AsyncInProcessClient(manager)
        listing = await client.tasks(pack="openai/humaneval", limit=1000)
        tasks = [t for t in listing.tasks if t.id.split(":")[-1] in ("HumanEval-0", "HumanEval-2")]
        assert len(tasks) == 2
        attempts = await run_eval(client, OraclePolicy(), tasks, concurrency=2)
        assert [a.reward for a in attempts] == [1.0, 1.0], [
            (a.task, a.status, a.feedback) for a in attempts
        ]
    finally:
        await manager.shutdown()


# ---- the persistent shell ------------------------------------------------------------------


def shell_procs(box: DockerSandbox) -> list[str]:
    """The sandbox user's processes with a shell's gid (docker top: uid, gid, pid, args)."""
    top = box._container.top(ps_args="-eo uid,gid,pid,args")
    return [" ".join(p) for p in top["Processes"] if p[0] == "1000" and p[1] != "1000"]


async def test_shell_state_output_cap_and_latency(box: DockerSandbox) -> None:
    sh = await box.shell()
    try:
        r = await sh.run("cd /tmp && X=42; echo hi; echo err >&2")
        assert (r.output, r.exit_code, r.cwd, r.restarted) == ("hi\nerr\n", 0, "/tmp", False)
        r = await sh.run("echo $X; id -u; false")
        assert (r.output, r.exit_code) == ("42\n1000\n", 1)
        r = await sh.run("head -c 300000 /dev/zero | tr '\\0' a; echo END", max_output=1000)
        assert r.truncated and r.output.startswith("a" * 500) and r.output.endswith("END\n")
        # The shell is non-dumpable (the execute-only bash): its fds and memory are closed.
        r = await sh.run("cat /proc/$$/environ; ls /proc/$$/fd")
        assert "Permission denied" in r.output and r.exit_code != 0, r
        # Files are shared with exec, both ways.
        await sh.run("echo from-shell > /work/s.txt")
        assert (await box.exec("cat s.txt")).stdout == "from-shell\n"
        await box.write_file("h.txt", "from-host")
        assert (await sh.run("cat /work/h.txt")).output == "from-host"
        # A round trip needs no extra exec.
        times = []
        for _ in range(20):
            t0 = time.monotonic()
            assert (await sh.run("true")).exit_code == 0
            times.append(time.monotonic() - t0)
        assert sorted(times)[10] < 0.05, times
    finally:
        await sh.close()


async def test_shell_survives_execs_and_dies_on_close(box: DockerSandbox) -> None:
    sh = await box.shell()
    try:
        r = await sh.run("sleep 91 & (setsid sleep 92 &); echo bg")
        assert r.output == "bg\n"
        r = await box.exec("sleep 93 & echo exec")  # its sweep spares the live shell
        assert r.stdout == "exec\n"
        procs = " ".join(shell_procs(box))
        assert "sleep 91" in procs and "sleep 92" in procs, procs
        assert "sleep 93" not in " ".join(user_procs(box))
        assert (await sh.run("echo still")).output == "still\n"
    finally:
        await sh.close()
    await sh.close()  # idempotent
    assert user_procs(box) == []
    with pytest.raises(SandboxGone):
        await sh.run("true")


async def test_shell_timeouts_and_restart(box: DockerSandbox) -> None:
    sh = await box.shell()
    try:
        await sh.run("X=1")
        t0 = time.monotonic()
        r = await sh.run("sleep 60 & setsid sleep 61 & sleep 62", timeout=1)
        assert r.timed_out and not r.restarted and time.monotonic() - t0 < 2.5, r
        # the timed-out command's background jobs (setsid or not) died with it
        assert not [p for p in user_procs(box) if "sleep 6" in p], user_procs(box)
        r = await sh.run("echo $X")  # (after bash's "Killed" notes for those jobs)
        assert r.output.endswith("\n1\n") and not r.restarted, r
        r = await sh.run("while :; do echo -n; done", timeout=30, idle_timeout=0.5)
        assert r.idle_timed_out and r.timed_out
        r = await sh.run("trap '' INT; exec sleep 99", timeout=1)
        assert r.timed_out and r.exit_code == -9, r
        r = await sh.run("echo $X; pwd")
        assert r.restarted and r.output == "\n/work\n", r
        r = await sh.run("exit 7")
        assert r.exit_code == 7
        r = await sh.run("echo back")
        assert r.restarted and r.output == "back\n"
    finally:
        await sh.close()
    assert user_procs(box) == []


async def test_shell_gone_with_the_sandbox(backend: DockerBackend) -> None:
    box = await backend.create(SPEC)
    sh = await box.shell()
    await sh.run("sleep 99 &")
    await box.close()
    with pytest.raises(SandboxGone):
        await sh.run("true")
    await sh.close()
