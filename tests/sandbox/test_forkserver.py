"""The Python fork server: one-shot sandboxes forked from a jailed zygote."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from palaestra.sandbox import ExecResult, SandboxError, SandboxPathError
from palaestra.sandbox.forkrun import PythonRun
from palaestra.sandbox.forkserver import ForkServerUnavailable, PythonForkServer


@pytest.fixture
async def fs() -> AsyncIterator[PythonForkServer]:
    server = PythonForkServer()
    try:
        await server.start()
    except ForkServerUnavailable as exc:
        pytest.skip(f"fork server unavailable here: {exc}")
    try:
        yield server
    finally:
        await server.aclose()


async def run(
    fs: PythonForkServer,
    code: str,
    *,
    files: dict[str, bytes] | None = None,
    stdin: bytes = b"",
    timeout: float = 10.0,
    max_output: int = 1 << 20,
    memory_mb: int = 512,
    workspace_mb: int = 16,
) -> ExecResult:
    job = PythonRun(code, files or {}, stdin, timeout, max_output, memory_mb, workspace_mb)
    return await fs.run(job)


def last_json(result: ExecResult) -> Any:
    assert result.exit_code == 0, result
    return json.loads(result.stdout.strip().splitlines()[-1])


async def test_exit_codes_output_and_stdin(fs: PythonForkServer) -> None:
    r = await run(fs, "import sys\nprint('out', sys.argv)\nprint('err', file=sys.stderr)")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out ['-c']\n", "err\n")
    assert (await run(fs, "import sys; sys.exit(3)")).exit_code == 3
    assert (await run(fs, "raise SystemExit")).exit_code == 0
    r = await run(fs, "raise SystemExit('bye')")
    assert (r.exit_code, r.stderr) == (1, "bye\n")
    r = await run(fs, "def f():\n    1 / 0\nf()")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr and "Traceback" in r.stderr
    r = await run(fs, "import sys; print(sys.stdin.read()[::-1])", stdin=b"hello")
    assert r.stdout == "olleh\n"
    r = await run(fs, "print(__name__, sorted(k for k in globals() if not k.startswith('__')))")
    assert r.stdout == "__main__ []\n"
    r = await run(fs, "import os; os._exit(7)")
    assert r.exit_code == 7


async def test_workspace_holds_exactly_the_files(fs: PythonForkServer) -> None:
    files = {"solution.py": b"x = 1\n", "data/in.txt": b"abc"}
    code = (
        "import os, json\nout = []\n"
        "for d, _, names in os.walk('.'):\n"
        "    out += [os.path.join(d, n) for n in names]\n"
        "print(json.dumps([os.getcwd(), sorted(out), open('data/in.txt').read()]))"
    )
    cwd, listing, text = last_json(await run(fs, code, files=files))
    assert cwd == "/work"
    assert listing == ["./data/in.txt", "./solution.py"]
    assert text == "abc"
    with pytest.raises(SandboxPathError):
        await run(fs, "pass", files={"../escape": b""})
    with pytest.raises(SandboxPathError):
        await run(fs, "pass", files={"/etc/passwd": b""})


async def test_no_network(fs: PythonForkServer) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    code = (
        "import socket, json\nres = {}\n"
        f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 53), ('1.1.1.1', 443)):\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n"
        "        s.connect((host, port)); res[host] = 'connected'\n"
        "    except OSError as e:\n"
        "        res[host] = type(e).__name__\n"
        "print(json.dumps(res))"
    )
    try:
        res = last_json(await run(fs, code))
    finally:
        listener.close()
    assert "connected" not in res.values(), res


async def test_host_is_invisible(
    fs: PythonForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "packs"
    store.mkdir()
    (store / "hidden.json").write_text("{}")
    monkeypatch.setenv("PALAESTRA_TEST_SECRET", "hunter2")
    code = (
        "import os, json\n"
        f"paths = ['/work/main', '/root', {str(store)!r}, {str(tmp_path)!r}, '/home']\n"
        "env1 = open('/proc/1/environ', 'rb').read().decode(errors='replace')\n"
        "print(json.dumps([{p: os.path.exists(p) for p in paths}, dict(os.environ), env1]))"
    )
    exists, env, env1 = last_json(await run(fs, code))
    assert not any(exists.values()), exists
    assert "PALAESTRA_TEST_SECRET" not in env and "hunter2" not in env1
    assert "hunter2" not in json.dumps(env)


async def test_unprivileged(fs: PythonForkServer) -> None:
    code = (
        "import os, json, ctypes\n"
        "caps = {l.split(':')[0]: l.split()[1] for l in open('/proc/self/status') "
        "if l.startswith('Cap')}\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "userns = libc.unshare(0x10000000)\n"
        "print(json.dumps([os.getuid(), os.getgid(), os.geteuid(), caps, userns]))"
    )
    uid, gid, euid, caps, userns = last_json(await run(fs, code))
    assert (uid, gid, euid) == (1000, 1000, 1000)
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == "0000000000000000"
    assert userns != 0  # no nested user namespaces: max_user_namespaces is 0


async def test_runs_cannot_see_each_other_or_the_zygote(fs: PythonForkServer) -> None:
    code = (
        "import os, json, signal, time\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "killed = []\n"
        "for pid in range(2, 300):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL); killed.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(0.5)\n"
        "print(json.dumps([os.getpid(), pids, killed]))"
    )
    starts = fs.starts
    a, b = await asyncio.gather(run(fs, code), run(fs, code))
    for result in (a, b):
        me, pids, killed = last_json(result)
        assert me == 1 and pids == [1], pids
        assert killed == []
    assert fs.alive and fs.starts == starts
    assert (await run(fs, "print('still here')")).stdout == "still here\n"


async def test_nothing_survives_a_run(fs: PythonForkServer) -> None:
    code = (
        "import os\n"
        "for p in ('/work/x', '/tmp/x', '/dev/shm/x'):\n"
        "    print(p, os.path.exists(p))\n"
        "    open(p, 'w').write('left behind')\n"
        "for p in ('/x', '/usr/x', '/dev/x', '/etc/x'):\n"
        "    try:\n"
        "        open(p, 'w'); print('WROTE', p)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    first = await run(fs, code)
    second = await run(fs, code)
    for r in (first, second):
        assert r.exit_code == 0, r
        assert "True" not in r.stdout and "WROTE" not in r.stdout, r.stdout


# Scans this process's memory for A immediately followed by B (never building A + B itself).
SCAN = r"""
import re, json, sys
A, B = sys.argv_a, sys.argv_b
found = 0
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        addr, perms = line.split()[:2]
        if not perms.startswith('r'):
            continue
        lo, hi = (int(x, 16) for x in addr.split('-'))
        try:
            mem.seek(lo)
            data = mem.read(hi - lo)
        except (OSError, OverflowError, ValueError):
            continue
        for m in re.finditer(re.escape(A), data):
            if data[m.end():m.end() + len(B)] == B:
                found += 1
print(json.dumps(found))
"""


def scan_code(a: bytes, b: bytes, prefix: str = "") -> str:
    return prefix + f"import sys\nsys.argv_a, sys.argv_b = {a!r}, {b!r}\n" + SCAN


async def test_zygote_memory_holds_no_task_data(fs: PythonForkServer) -> None:
    half_a, half_b = secrets.token_hex(16).encode(), secrets.token_hex(16).encode()
    secret = half_a + half_b
    # Positive control: a run that has the secret (in its files and stdin) finds it.
    holder = await run(
        fs,
        scan_code(half_a, half_b, "import sys\nkept = [sys.stdin.read(), open('s.txt').read()]\n"),
        files={"s.txt": secret},
        stdin=secret,
    )
    assert last_json(holder) >= 1
    # A later run, forked from the same zygote, finds no trace of it.
    assert last_json(await run(fs, scan_code(half_a, half_b))) == 0


async def test_timeout_kills_everything(fs: PythonForkServer) -> None:
    t = time.monotonic()
    r = await run(fs, "while True: pass", timeout=1.0)
    assert r.timed_out and r.exit_code == -9
    assert time.monotonic() - t < 2.0
    marker = f"{secrets.randbelow(10**6) + 10**6}.5"
    code = (
        "import subprocess, time\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "print('started', flush=True)\n"
        "while True: time.sleep(1)"
    )
    t = time.monotonic()
    r = await run(fs, code, timeout=1.0)
    assert r.timed_out and r.stdout == "started\n"
    assert time.monotonic() - t < 2.0

    def sleepers() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
        return found

    deadline = time.monotonic() + 1.0
    while sleepers() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sleepers() == []


async def test_memory_limit(fs: PythonForkServer) -> None:
    r = await run(fs, "b = bytearray(600 << 20)\nprint(len(b))", memory_mb=256)
    assert r.exit_code == 1 and "MemoryError" in r.stderr and r.oom_killed
    ok = await run(fs, "b = bytearray(64 << 20)\nprint(len(b))", memory_mb=256)
    assert ok.exit_code == 0


async def test_workspace_limit(fs: PythonForkServer) -> None:
    r = await run(fs, "open('big', 'wb').write(b'x' * (40 << 20))", workspace_mb=8)
    assert r.exit_code != 0


async def test_output_cap(fs: PythonForkServer) -> None:
    r = await run(fs, "print('x' * 100000)", max_output=1000)
    assert r.truncated and r.stdout == "x" * 1000 and r.exit_code == 0


async def test_zygote_death_restarts(fs: PythonForkServer) -> None:
    assert fs.pid is not None
    in_flight = asyncio.ensure_future(run(fs, "import time; time.sleep(5)"))
    await asyncio.sleep(0.3)
    starts = fs.starts
    os.killpg(fs.pid, signal.SIGKILL)
    with pytest.raises(SandboxError):
        await asyncio.wait_for(in_flight, 5.0)
    r = await run(fs, "print('again')")
    assert r.stdout == "again\n" and fs.starts == starts + 1


async def test_cancelled_run_is_killed(fs: PythonForkServer) -> None:
    task = asyncio.ensure_future(run(fs, "import time; time.sleep(30)", timeout=30))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The zygote reaps it and keeps serving.
    assert (await run(fs, "print(1)")).stdout == "1\n"


async def test_many_at_once(fs: PythonForkServer) -> None:
    results = await asyncio.gather(
        *(run(fs, f"import sys; print({i}); sys.exit({i % 7})") for i in range(40))
    )
    for i, r in enumerate(results):
        assert (r.exit_code, r.stdout) == (i % 7, f"{i}\n")


async def test_unavailable_is_reported() -> None:
    server = PythonForkServer()
    server.unavailable = "no user namespaces here (test)"
    with pytest.raises(ForkServerUnavailable):
        await run(server, "pass")
    await server.aclose()
