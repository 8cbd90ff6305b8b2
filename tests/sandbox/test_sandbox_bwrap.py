"""The bwrap sandbox backend, against the real bwrap (skipped where it cannot run)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import (
    SandboxCreateError,
    SandboxError,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    WorkspaceFull,
)
from palaestra.sandbox.bwrap import BwrapBackend, BwrapSandbox, bwrap_available
from palaestra.sandbox.bwrap import backend as backend_mod

_OK, _WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")
IS_ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[BwrapBackend]:
    # As root the default runtime dir is under /run (tmp_path lives under /tmp, fine too,
    # but the host uid 1000 must be able to traverse it, which pytest's 0700 dirs forbid).
    b = BwrapBackend(None if IS_ROOT else tmp_path / "rt")
    yield b
    await b.aclose()
    assert b.live_count == 0


@pytest.fixture
async def box(backend: BwrapBackend) -> AsyncIterator[BwrapSandbox]:
    async with await backend.create(SandboxSpec(workspace_mb=16, default_timeout_s=20)) as s:
        yield s


async def test_echo_exit_codes_stderr(box: BwrapSandbox) -> None:
    r = await box.exec(["echo", "hello"])
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (0, "hello\n", "", True)
    r = await box.exec("echo oops >&2; exit 7")
    assert r.exit_code == 7 and r.stderr == "oops\n" and not r.ok and not r.timed_out
    r = await box.exec(["no-such-program"])
    assert r.exit_code == 127
    # a user exit 1 that prints something bwrap-like is still data, not a setup failure
    r = await box.exec("echo 'bwrap: Cannot find source path' >&2; exit 1")
    assert r.exit_code == 1 and r.stderr.startswith("bwrap:") and not r.timed_out
    r = await box.exec("pwd", cwd="no/such/dir")
    assert r.exit_code == 1 and "chdir" in r.stderr


async def test_bwrap_setup_failure_is_sandbox_error(box: BwrapSandbox) -> None:
    args = box.jails.static
    box.jails.static = [*args, "--ro-bind", "/nonexistent-palaestra", "/x"]
    with pytest.raises(SandboxError) as ei:
        await box.exec(["true"])
    assert not isinstance(ei.value, SandboxGone)
    box.jails.static = ["/nonexistent/bwrap", *args[1:]]
    with pytest.raises(SandboxError):
        await box.exec(["true"])
    box.jails.static = args
    assert (await box.exec(["true"])).ok


async def test_create_without_bwrap(backend: BwrapBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_mod, "bwrap_available", lambda: (False, "bwrap not found"))
    with pytest.raises(SandboxCreateError, match="bwrap not found"):
        await backend.create(SandboxSpec())
    assert backend.live_count == 0


async def test_stdin_cwd_env(box: BwrapSandbox) -> None:
    r = await box.exec(["cat"], stdin="from stdin")
    assert r.stdout == "from stdin"
    r = await box.exec(["cat"])  # stdin None -> /dev/null, so cat ends at once
    assert r.exit_code == 0 and r.stdout == ""
    assert (await box.exec("pwd")).stdout == "/work\n"
    await box.exec("mkdir -p sub/dir")
    assert (await box.exec("pwd", cwd="sub/dir")).stdout == "/work/sub/dir\n"
    assert (await box.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    r = await box.exec("echo $FOO:$HOME:$LANG:$PATH", env={"FOO": "bar"})
    assert r.stdout == "bar:/work:C.UTF-8:/usr/local/bin:/usr/bin:/bin\n"


async def test_spec_env_and_exec_env_precedence(backend: BwrapBackend) -> None:
    spec = SandboxSpec(env=(("A", "spec"), ("B", "spec")))
    async with await backend.create(spec) as s:
        r = await s.exec("echo $A $B", env={"B": "exec"})
        assert r.stdout == "spec exec\n"


async def test_python_and_uid(box: BwrapSandbox) -> None:
    r = await box.exec(["python3", "-c", "import ssl, json, os; print(os.getuid(), os.getgid())"])
    assert r.ok, r
    assert r.stdout == "1000 1000\n"
    assert (await box.exec(["id", "-un"])).stdout == "sandbox\n"
    r = await box.exec("touch /usr/pwned")
    assert r.exit_code != 0
    assert not Path("/usr/pwned").exists()
    assert (await box.exec("echo x > /etc/passwd")).exit_code != 0
    assert (await box.exec("unshare -U true")).exit_code != 0  # no nested user namespaces
    r = await box.exec("grep CapEff /proc/self/status")
    assert r.stdout.split() == ["CapEff:", "0000000000000000"]


async def test_files_persist_between_execs(box: BwrapSandbox) -> None:
    assert (await box.exec("echo persisted > f.txt && mkdir -p d && echo 2 > d/g")).ok
    r = await box.exec("cat f.txt d/g")
    assert r.stdout == "persisted\n2\n"
    assert await box.read_file("f.txt") == b"persisted\n"
    assert await box.read_file("/work/d/g") == b"2\n"
    # /tmp inside is per-exec
    await box.exec("echo t > /tmp/x")
    assert (await box.exec("cat /tmp/x")).exit_code != 0


async def test_read_write_roundtrip(box: BwrapSandbox) -> None:
    payload = bytes(range(256)) * 10
    await box.write_file("deep/er/file.bin", payload)
    assert await box.read_file("deep/er/file.bin") == payload
    r = await box.exec("wc -c < deep/er/file.bin && echo more >> deep/er/file.bin && echo ok")
    assert r.stdout == "2560\nok\n", r  # writable by the sandbox user
    await box.write_file("/work/script.sh", "#!/bin/sh\necho run\n", mode=0o755)
    assert (await box.exec("./script.sh")).stdout == "run\n"
    await box.write_file("deep/er/file.bin", "short")  # truncates
    assert await box.read_file("deep/er/file.bin") == b"short"
    with pytest.raises(FileNotFoundError):
        await box.read_file("missing.txt")
    with pytest.raises(SandboxPathError):
        await box.read_file("deep")  # a directory


async def test_tar_roundtrip(box: BwrapSandbox) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in [("pkg/a.py", b"A = 1\n"), ("pkg/sub/b.txt", b"bee")]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        link = tarfile.TarInfo("pkg/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.py"
        tf.addfile(link)
    await box.upload_tar(buf.getvalue(), dest="proj")
    r = await box.exec("cat proj/pkg/a.py proj/pkg/sub/b.txt proj/pkg/link && touch proj/pkg/new")
    assert r.stdout == "A = 1\nbeeA = 1\n" and r.ok, r
    out = await box.download_tar("proj")
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        names = set(tf.getnames())
        assert {"proj", "proj/pkg/a.py", "proj/pkg/sub/b.txt", "proj/pkg/link"} <= names
        assert "proj/pkg/new" in names
        f = tf.extractfile("proj/pkg/sub/b.txt")
        assert f is not None and f.read() == b"bee"
        assert tf.getmember("proj/pkg/link").issym()
    whole = await box.download_tar()
    with tarfile.open(fileobj=io.BytesIO(whole)) as tf:
        assert "proj/pkg/a.py" in tf.getnames()


@pytest.mark.parametrize(
    ("name", "linkname", "kind"),
    [
        ("../evil", "", tarfile.REGTYPE),
        ("/abs/evil", "", tarfile.REGTYPE),
        ("out", "/etc/passwd", tarfile.SYMTYPE),
        ("out", "../../../etc", tarfile.SYMTYPE),
        ("hard", "/etc/passwd", tarfile.LNKTYPE),
    ],
)
async def test_upload_tar_rejects_escapes(
    box: BwrapSandbox, name: str, linkname: str, kind: bytes
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(name)
        ti.type = kind
        ti.linkname = linkname
        tf.addfile(ti, io.BytesIO(b""))
    with pytest.raises(SandboxPathError):
        await box.upload_tar(buf.getvalue())


async def test_upload_tar_does_not_follow_planted_symlink(box: BwrapSandbox) -> None:
    assert (await box.exec("ln -s /etc d")).ok
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("d/pwned")
        ti.size = 1
        tf.addfile(ti, io.BytesIO(b"x"))
    with pytest.raises(SandboxPathError):
        await box.upload_tar(buf.getvalue())
    assert not Path("/etc/pwned").exists()


async def test_symlinks_and_escapes_are_path_errors(box: BwrapSandbox) -> None:
    assert (await box.exec("ln -s /etc/shadow x && ln -s /etc dir && mkfifo fifo")).ok
    with pytest.raises(SandboxPathError):
        await box.read_file("x")
    with pytest.raises(SandboxPathError):
        await box.read_file("dir/passwd")
    with pytest.raises(SandboxPathError):
        await box.write_file("x", "overwrite shadow?")
    with pytest.raises(SandboxPathError):
        await box.write_file("dir/new", "x")
    with pytest.raises(SandboxPathError):
        await box.read_file("fifo")  # would block forever if opened blindly
    for bad in ("../../etc/passwd", "/etc/passwd", "/work/../etc/passwd", "a/../../x"):
        with pytest.raises(SandboxPathError):
            await box.read_file(bad)
        with pytest.raises(SandboxPathError):
            await box.write_file(bad, "x")
    with pytest.raises(SandboxPathError):
        await box.download_tar("../..")
    # download_tar stores symlinks as symlinks, never their targets' contents
    out = await box.download_tar()
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        assert tf.getmember("x").issym()
        assert "dir/passwd" not in tf.getnames()


async def test_network_is_unreachable(box: BwrapSandbox) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        srv.settimeout(3)
        with contextlib.suppress(OSError):
            accepted.append(srv.accept())

    t = threading.Thread(target=accept)
    t.start()
    code = (
        "import socket, sys\n"
        "fails = 0\n"
        f"for host, port in [('1.1.1.1', 53), ('127.0.0.1', {port})]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close()\n"
        "        print('connected', host)\n"
        "    except OSError as e:\n"
        "        fails += 1\n"
        "        print('failed', host, e)\n"
        "sys.exit(0 if fails == 2 else 1)\n"
    )
    try:
        r = await box.exec(["python3", "-c", code])
    finally:
        t.join()
        srv.close()
    assert r.exit_code == 0, r
    assert "connected" not in r.stdout
    assert not accepted


async def test_host_secrets_invisible(box: BwrapSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PALAESTRA_SECRET_TEST", "hunter2")
    r = await box.exec(["env"])
    assert r.ok and "PALAESTRA_SECRET_TEST" not in r.stdout and "hunter2" not in r.stdout
    assert "PATH=" in r.stdout  # the check above really read the environment

    store = Path("/tmp") / f"palaestra-packstore-{os.getpid()}"
    store.mkdir(exist_ok=True)
    secret = store / "secret.txt"
    secret.write_text("pack answer")
    secret.chmod(0o644)
    store.chmod(0o755)
    try:
        r = await box.exec(["cat", str(secret)])
        assert r.exit_code != 0 and "pack answer" not in r.stdout
    finally:
        secret.unlink()
        store.rmdir()
    for path in ("/root", "/home", str(REPO), str(REPO / "pyproject.toml"), "/run/palaestra"):
        r = await box.exec(["ls", "-la", path])
        assert r.exit_code != 0, (path, r)
    r = await box.exec("ls /etc")
    assert "shadow" not in r.stdout and "passwd" in r.stdout


async def test_timeout_kills_everything(box: BwrapSandbox) -> None:
    marker = "1234.5"
    t0 = time.monotonic()
    r = await box.exec(f"sleep {marker} & sleep {marker}", timeout=0.5)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code == -9 and not r.ok
    assert elapsed < 2.0
    assert 0.4 < r.duration_s < 2.0
    found = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert found.stdout == "", found.stdout
    # the sandbox stays usable
    assert (await box.exec("echo alive")).stdout == "alive\n"


async def test_background_process_dies_with_command(box: BwrapSandbox) -> None:
    marker = "4321.5"
    r = await box.exec(f"(sleep {marker} &) ; echo started")
    assert r.ok and r.stdout == "started\n"
    found = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert found.stdout == ""


async def test_timeout_keeps_partial_output(box: BwrapSandbox) -> None:
    r = await box.exec("echo before; sleep 30", timeout=0.5)
    assert r.timed_out and r.stdout == "before\n"


async def test_output_cap(box: BwrapSandbox) -> None:
    cap = 64 * 1024
    r = await box.exec(
        [
            "python3",
            "-c",
            "import sys; sys.stdout.write('x' * 5_000_000); print('E', file=sys.stderr)",
        ],
        max_output=cap,
    )
    assert r.exit_code == 0 and r.truncated
    assert 0 < len(r.stdout) <= cap and set(r.stdout) == {"x"}
    assert r.stderr == "E\n"
    small = await box.exec(["echo", "hi"], max_output=cap)
    assert not small.truncated


async def test_close_idempotent_and_dead_after(backend: BwrapBackend) -> None:
    s = await backend.create(SandboxSpec())
    assert backend.live_count == 1 and s.alive
    ws = s.workspace
    assert ws.is_dir()
    if IS_ROOT:
        assert s.tmpfs
        assert str(ws) in Path("/proc/mounts").read_text()
    await s.close()
    await s.close()
    assert not s.alive and backend.live_count == 0
    assert not s.root.exists()
    assert str(ws) not in Path("/proc/mounts").read_text()
    with pytest.raises(SandboxGone):
        await s.exec("true")
    with pytest.raises(SandboxGone):
        await s.read_file("x")


async def test_close_during_exec(backend: BwrapBackend) -> None:
    s = await backend.create(SandboxSpec())
    task = asyncio.create_task(s.exec("sleep 30"))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await s.close()
    with pytest.raises(SandboxGone):
        await task
    assert time.monotonic() - t0 < 2


@pytest.mark.skipif(not IS_ROOT, reason="tmpfs workspace needs root")
async def test_workspace_size_limit(backend: BwrapBackend) -> None:
    async with await backend.create(SandboxSpec(workspace_mb=4)) as s:
        r = await s.exec("dd if=/dev/zero of=big bs=1M count=8")
        assert r.exit_code != 0
        r = await s.exec("rm big && dd if=/dev/zero of=ok bs=1M count=1 2>/dev/null && echo fine")
        assert r.stdout == "fine\n", r
        # the host side sees the same limit, and says it is the workspace's (the agent's) fault
        with pytest.raises(WorkspaceFull):
            await s.write_file("big2", b"\0" * (8 * 1024 * 1024))


async def test_memory_limit(backend: BwrapBackend) -> None:
    async with await backend.create(SandboxSpec(memory_mb=256)) as s:
        r = await s.exec(["python3", "-c", "b = bytearray(512 * 1024 * 1024)"])
        assert r.exit_code != 0 and r.oom_killed
        r = await s.exec(["python3", "-c", "b = bytearray(32 * 1024 * 1024)"])
        assert r.ok, r


async def test_create_rejects_unsupported(backend: BwrapBackend) -> None:
    with pytest.raises(SandboxCreateError):
        await backend.create(SandboxSpec(image="python:3.11"))
    with pytest.raises(SandboxCreateError):
        await backend.create(SandboxSpec(network=True))
    assert backend.live_count == 0


async def test_concurrent_execs_and_aclose(backend: BwrapBackend) -> None:
    boxes = await asyncio.gather(*(backend.create(SandboxSpec()) for _ in range(4)))
    assert backend.live_count == 4
    results = await asyncio.gather(*(b.exec(["echo", b.id]) for b in boxes))
    assert [r.stdout for r in results] == [b.id + "\n" for b in boxes]
    await backend.aclose()
    assert backend.live_count == 0
    assert all(not b.alive and not b.root.exists() for b in boxes)


def test_bwrap_available() -> None:
    ok, detail = bwrap_available()
    assert ok and detail.endswith("bwrap")
