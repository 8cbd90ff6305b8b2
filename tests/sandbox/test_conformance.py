"""One conformance suite (DESIGN §5) that every backend passes (see sandbox_backends.py)."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from palaestra.sandbox.base import (
    Backend,
    SandboxError,
    SandboxFileTooLarge,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    spool_file,
)
from sandbox.sandbox_backends import backend_fixture, spec_fixture  # noqa: F401  (fixtures)


async def test_exec_argv_shell_and_exit_codes(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        r = await box.exec(["echo", "hello world", "$HOME"])
        assert (r.exit_code, r.stdout, r.stderr, r.ok) == (0, "hello world $HOME\n", "", True)
        r = await box.exec("echo a b | tr a-z A-Z; exit 3")
        assert (r.exit_code, r.stdout, r.ok, r.timed_out) == (3, "A B\n", False, False)
        r = await box.exec(["no-such-program-palaestra"])
        assert r.exit_code == 127 and not r.timed_out
        r = await box.exec("kill -9 $$")
        assert r.exit_code == 137


async def test_stdout_stderr_separate(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        r = await box.exec("echo out; echo err >&2; echo out2")
        assert r.stdout == "out\nout2\n" and r.stderr == "err\n"


async def test_stdin_bytes_str_none(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        r = await box.exec(["cat"], stdin=b"\x00bin\xff")
        assert r.stdout.encode("utf-8", "replace") == "\x00bin\ufffd".encode()
        r = await box.exec(["wc", "-c"], stdin=b"\x00\x01\xfe\xff" * 1000)
        assert r.stdout.strip() == "4000"
        r = await box.exec("tr a-z A-Z", stdin="héllo\n")
        assert r.stdout == "HéLLO\n"
        r = await box.exec(["cat"], timeout=10)  # no stdin: EOF at once, never a hang
        assert r.ok and r.stdout == ""


async def test_cwd_and_env(backend: Backend) -> None:
    spec = SandboxSpec(workspace_mb=32, default_timeout_s=20, env=(("SPEC_VAR", "from-spec"),))
    async with await backend.create(spec) as box:
        assert (await box.exec(["mkdir", "-p", "sub/deeper"])).ok
        r = await box.exec(["pwd"])
        assert r.stdout.strip() == spec.workdir
        r = await box.exec(["pwd"], cwd="sub/deeper")
        assert r.stdout.strip() == f"{spec.workdir}/sub/deeper"
        r = await box.exec(["pwd"], cwd="no/such/dir")
        assert r.exit_code != 0 and not r.timed_out
        r = await box.exec(
            'echo "$SPEC_VAR|$MY_VAR|$HOME"', env={"MY_VAR": "x y", "SPEC_VAR": "over"}
        )
        assert r.stdout == f"over|x y|{spec.workdir}\n"
        r = await box.exec('echo "$SPEC_VAR|${MY_VAR-unset}"')
        assert r.stdout == "from-spec|unset\n"


async def test_files_persist_between_execs(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        assert (await box.exec("mkdir -p d && echo 42 > d/f && chmod +x d")).ok
        r = await box.exec(["cat", "d/f"])
        assert r.stdout == "42\n"
        assert await box.read_file("d/f") == b"42\n"
        assert await box.read_file(f"{spec.workdir}/d/f") == b"42\n"


async def test_read_write_roundtrip(backend: Backend, spec: SandboxSpec) -> None:
    blob = bytes(range(256)) * 300
    async with await backend.create(spec) as box:
        await box.write_file("bin/blob.dat", blob)
        await box.write_file("t.txt", "héllo\n")
        await box.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
        assert await box.read_file("bin/blob.dat") == blob
        assert await box.read_file("t.txt") == "héllo\n".encode()
        r = await box.exec("sha256sum bin/blob.dat | cut -c1-64; ./run.sh")
        import hashlib

        assert r.stdout == f"{hashlib.sha256(blob).hexdigest()}\nran\n"
        await box.write_file("t.txt", "short")  # overwrite truncates
        assert await box.read_file("t.txt") == b"short"
        with pytest.raises(FileNotFoundError):
            await box.read_file("missing.txt")
        with pytest.raises(FileNotFoundError):
            await box.read_file("nodir/missing.txt")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "/tmp/x", "..", "a\0b"])
async def test_path_escapes(backend: Backend, spec: SandboxSpec, path: str) -> None:
    async with await backend.create(spec) as box:
        with pytest.raises(SandboxPathError):
            await box.read_file(path)
        with pytest.raises(SandboxPathError):
            await box.write_file(path, b"x")
        r = await box.exec(["ls", "-a"])
        assert r.ok and "x" not in r.stdout.split()


def _tar(members: dict[str, bytes | None], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            if data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
                tf.addfile(ti, io.BytesIO(data))
        for name, target in (links or {}).items():
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = tarfile.SYMTYPE, target
            tf.addfile(ti)
    return buf.getvalue()


def _untar(data: bytes) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf:
            f = tf.extractfile(m) if m.isreg() else None
            out[m.name] = f.read() if f is not None else None
    return out


async def test_tar_roundtrip(backend: Backend, spec: SandboxSpec) -> None:
    blob = bytes(range(256)) * 10
    data = _tar(
        {
            "pkg": None,
            "pkg/a.txt": b"alpha\n",
            "pkg/b.bin": blob,
            "pkg/go.sh": b"#!/bin/sh\necho go\n",
        }
    )
    async with await backend.create(spec) as box:
        await box.upload_tar(data, "up")
        r = await box.exec("cat up/pkg/a.txt && ./up/pkg/go.sh")
        assert r.stdout == "alpha\ngo\n"
        assert await box.read_file("up/pkg/b.bin") == blob
        got = _untar(await box.download_tar("up/pkg"))
        assert got["pkg/a.txt"] == b"alpha\n" and got["pkg/b.bin"] == blob
        await box.upload_tar(_tar({"top.txt": b"top"}))
        whole = _untar(await box.download_tar())
        assert whole["top.txt"] == b"top" and whole["up/pkg/b.bin"] == blob
        with pytest.raises(SandboxPathError):
            await box.upload_tar(_tar({"../evil.txt": b"x"}))
        with pytest.raises(SandboxPathError):
            await box.upload_tar(_tar({}, {"ln": "/etc/passwd"}))
        with pytest.raises(FileNotFoundError):
            await box.download_tar("no-such-dir")
        assert (await box.exec("test -e ../evil.txt || echo clean")).stdout == "clean\n"


def _listing(data: bytes) -> dict[str, tuple[str, int, bytes | str | None]]:
    """name -> (kind, permission bits, contents or link target) of a tar."""
    out: dict[str, tuple[str, int, bytes | str | None]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf:
            if m.isreg():
                f = tf.extractfile(m)
                assert f is not None
                out[m.name] = ("file", m.mode & 0o777, f.read())
            elif m.issym():
                out[m.name] = ("link", 0, m.linkname)
            else:
                out[m.name] = ("dir" if m.isdir() else "other", m.mode & 0o777, None)
    return out


async def test_tar_streams_through_a_file(
    backend: Backend, spec: SandboxSpec, tmp_path: Path
) -> None:
    """download_tar_to / upload_tar_from (a workspace moved through a file on the server's
    disk) write what download_tar would, and a round trip into a fresh sandbox keeps
    files, folders, modes and in-workspace symlinks; a tar over the cap is refused naming
    the limit, and upload_tar's rules hold for a file too."""
    make = (
        "mkdir -p pkg/sub empty && printf alpha > pkg/a.txt && printf '#!/bin/sh\necho go\n'"
        " > pkg/go.sh && chmod 755 pkg/go.sh && printf secret > pkg/sub/key && chmod 600"
        " pkg/sub/key && ln -s a.txt pkg/link && head -c 300000 /dev/urandom > pkg/blob"
    )
    async with await backend.create(spec) as src, await backend.create(spec) as dst:
        assert (await src.exec(make)).ok
        with spool_file(tmp_path / "spool") as f:
            n = await src.download_tar_to(f)
            f.seek(0)
            streamed = f.read()
            assert n == len(streamed) > 300000
            assert _listing(streamed) == _listing(await src.download_tar())
            await dst.upload_tar_from(f, "copy")
        assert os.listdir(tmp_path / "spool") == []  # nothing left behind, nothing named
        moved = _listing(await dst.download_tar("copy"))
        want = {f"copy/{k}": v for k, v in _listing(streamed).items()}
        assert {k: v for k, v in moved.items() if k != "copy"} == want
        assert moved["copy/pkg/go.sh"][1] == 0o755 and moved["copy/pkg/link"][0] == "link"
        r = await dst.exec("cat copy/pkg/link && ./copy/pkg/go.sh")
        assert r.stdout == "alphago\n", r

        with spool_file(tmp_path / "spool") as f, pytest.raises(SandboxFileTooLarge) as big:
            await src.download_tar_to(f, limit=100_000)
        assert big.value.failure == "too_large" and "limit of 100000 bytes" in str(big.value)
        with spool_file(tmp_path / "spool") as f:
            f.write(_tar({"big.bin": bytes(200_000)}))
            with pytest.raises(SandboxFileTooLarge, match="limit of 100000 bytes"):
                await dst.upload_tar_from(f, limit=100_000)
            assert (await dst.exec("test -e big.bin || echo absent")).stdout == "absent\n"
        for evil in (_tar({"../evil.txt": b"x"}), _tar({}, {"ln": "/etc/passwd"})):
            with spool_file(tmp_path / "spool") as f:
                f.write(evil)
                with pytest.raises(SandboxPathError):
                    await dst.upload_tar_from(f)
        with spool_file(tmp_path / "spool") as f, pytest.raises(FileNotFoundError):
            await src.download_tar_to(f, "no-such-dir")


async def test_timeout_kills_everything(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        t0 = time.monotonic()
        r = await box.exec(
            "(while true; do echo t >> ticks; sleep 0.05; done) & echo started; sleep 100",
            timeout=1.0,
        )
        took = time.monotonic() - t0
        assert r.timed_out and not r.ok and r.exit_code != 0
        assert took < 2.0, took  # DESIGN §10: everything dead by timeout + 1 s
        assert 0.9 <= r.duration_s < 2.0
        assert r.stdout == "started\n"
        before = await box.read_file("ticks")
        assert before  # the background loop did run
        await asyncio.sleep(0.4)
        assert await box.read_file("ticks") == before, "a background process survived"
        assert (await box.exec(["echo", "still usable"])).stdout == "still usable\n"


async def test_output_cap(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        r = await box.exec("head -c 300000 /dev/zero | tr '\\0' a; echo e >&2", max_output=1000)
        assert r.truncated and r.exit_code == 0
        assert r.stdout == "a" * 1000 and r.stderr == "e\n"
        r = await box.exec("head -c 999 /dev/zero | tr '\\0' b", max_output=1000)
        assert not r.truncated and r.stdout == "b" * 999


async def test_no_network(backend: Backend, spec: SandboxSpec) -> None:
    probe = (
        "import socket\n"
        "for host in ('1.1.1.1', '8.8.8.8'):\n"
        "    try:\n"
        "        socket.create_connection((host, 53), timeout=3).close(); print('connected')\n"
        "    except OSError:\n"
        "        print('blocked')\n"
    )
    async with await backend.create(spec) as box:
        r = await box.exec(["python3", "-c", probe])
        assert r.stdout == "blocked\nblocked\n", (r.stdout, r.stderr)


async def test_host_environment_invisible(
    backend: Backend, spec: SandboxSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PALAESTRA_HOST_SECRET", "s3cr3t-host-value")
    async with await backend.create(spec) as box:
        r = await box.exec("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
        assert r.exit_code == 0
        assert "PATH=" in r.stdout  # the probe did see an environment
        assert "s3cr3t-host-value" not in r.stdout and "PALAESTRA_HOST_SECRET" not in r.stdout


async def test_close_idempotent_and_gone(backend: Backend, spec: SandboxSpec) -> None:
    box = await backend.create(spec)
    assert box.alive and backend.live_count >= 1
    await box.close()
    await box.close()
    assert not box.alive
    with pytest.raises(SandboxGone):
        await box.exec(["true"])
    with pytest.raises(SandboxGone):
        await box.read_file("x")
    with pytest.raises(SandboxGone):
        await box.write_file("x", b"")


async def test_async_with_closes(backend: Backend, spec: SandboxSpec) -> None:
    before = backend.live_count
    async with await backend.create(spec) as box:
        assert backend.live_count == before + 1
        assert (await box.exec(["true"])).ok
    assert not box.alive and backend.live_count == before
    with pytest.raises(SandboxGone):
        await box.exec(["true"])


async def test_duration_and_concurrent_execs(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        t0 = time.monotonic()
        a, b = await asyncio.gather(box.exec("sleep 0.5; echo a"), box.exec("sleep 0.5; echo b"))
        wall = time.monotonic() - t0
        assert (a.stdout, b.stdout) == ("a\n", "b\n")
        assert 0.45 <= a.duration_s <= wall + 0.05 and 0.45 <= b.duration_s <= wall + 0.05
        r = await box.exec(["true"])
        assert 0 <= r.duration_s < 5


async def test_sandboxes_are_separate(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as one, await backend.create(spec) as two:
        assert one.id != two.id
        await one.write_file("mine.txt", b"1")
        with pytest.raises(FileNotFoundError):
            await two.read_file("mine.txt")
        assert (await two.exec("ls")).stdout == ""


async def test_shell_session_keeps_state(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        try:
            sh = await box.shell()
        except SandboxError as e:
            pytest.skip(f"{type(box).__name__} has no persistent shell: {e}")
        try:
            r = await sh.run("mkdir -p d && cd d && X=42")
            assert r.exit_code == 0 and not r.timed_out
            r = await sh.run('echo "$X $(pwd)"')
            assert r.output.strip() == f"42 {spec.workdir}/d" and r.cwd == f"{spec.workdir}/d"
            r = await sh.run("false")
            assert r.exit_code == 1
            t0 = time.monotonic()
            r = await sh.run("sleep 30", timeout=1)
            assert r.timed_out and time.monotonic() - t0 < 3
            r = await sh.run("echo ok")
            assert r.output.strip() == "ok"  # usable after a timeout
        finally:
            await sh.close()


async def test_shell_state_survives_timeout(backend: Backend, spec: SandboxSpec) -> None:
    async with await backend.create(spec) as box:
        try:
            sh = await box.shell()
        except SandboxError as e:
            pytest.skip(f"{type(box).__name__} has no persistent shell: {e}")
        try:
            await sh.run("X=42")
            r = await sh.run("sleep 30", timeout=1)
            assert r.timed_out
            r = await sh.run("echo $X")
            assert r.output.strip() == "42" and not r.restarted, r
        finally:
            await sh.close()
