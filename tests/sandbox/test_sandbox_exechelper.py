"""The bwrap backend's exec helper and its jails started ahead (palaestra.sandbox.exechelper).

The same exec behaviour with and without the helper (which falls back to the sh + setpriv
launcher), the stub's descriptor hygiene, and the life of a waiting jail: replaced when it
died, killed on close, bounded per backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from palaestra.sandbox import exechelper
from palaestra.sandbox.base import ExecResult, SandboxSpec, default_cache
from palaestra.sandbox.bwrap import BwrapBackend, BwrapSandbox, bwrap_available

_OK, _WHY = bwrap_available()
_HELPER, _NO_HELPER = exechelper.helper_binary(default_cache())
pytestmark = [
    pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}"),
    pytest.mark.skipif(_HELPER is None, reason=f"no exec helper here: {_NO_HELPER}"),
]
IS_ROOT = os.geteuid() == 0
SPEC = SandboxSpec(workspace_mb=8, default_timeout_s=20)


def _backend(tmp_path: Path, **kwargs: object) -> BwrapBackend:
    return BwrapBackend(None if IS_ROOT else tmp_path / "rt", **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["stub", "one-shot", "no-helper"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BwrapBackend]:
    """stub: every exec runs in a jail started ahead; one-shot: the helper's launcher with the
    command on bwrap's command line (back-to-back execs); no-helper: the sh + setpriv chain."""
    b = _backend(tmp_path, exec_helper=request.param != "no-helper")
    b.mode = request.param  # type: ignore[attr-defined]
    yield b
    await b.aclose()
    assert b.live_count == 0


def _waiting(box: BwrapSandbox) -> asyncio.subprocess.Process | None:
    """The process of the jail waiting for `box`'s next exec, if one is up."""
    fut = box.jails.ahead
    if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
        return None
    return fut.result().proc


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class _Box:
    """Runs each exec in a jail started ahead (mode "stub"), or as it comes."""

    def __init__(self, box: BwrapSandbox, stub: bool) -> None:
        self.box, self.stub = box, stub

    async def exec(self, *args: Any, **kwargs: Any) -> ExecResult:
        if self.stub:
            await self.box.wait_ready()
            assert _waiting(self.box) is not None
        return await self.box.exec(*args, **kwargs)


async def test_same_results_either_way(backend: BwrapBackend) -> None:
    async with await backend.create(SPEC) as sandbox:
        box = _Box(sandbox, backend.mode == "stub")  # type: ignore[attr-defined]
        assert ("exec helper /" in backend.helper_status) == (backend._helper is not None)
        assert (backend._helper is None) == (backend.mode == "no-helper")  # type: ignore[attr-defined]
        r = await box.exec(["sh", "-c", 'echo "$0" "$1"; echo e >&2; exit 3', "a b", "c"])
        assert (r.exit_code, r.stdout, r.stderr) == (3, "a b c\n", "e\n")
        r = await box.exec("cat; pwd; echo $FOO $HOME", stdin="in\n", cwd="/tmp", env={"FOO": "x"})
        assert r.ok and r.stdout == "in\n/tmp\nx /work\n", r
        r = await box.exec("cat", stdin=None)  # no stdin: end of file at once
        assert r.ok and r.stdout == "", r
        assert (await box.exec(["no-such-program"])).exit_code == 127
        r = await box.exec("pwd", cwd="no/such/dir")
        assert r.exit_code == 1 and "chdir" in r.stderr
        r = await box.exec(["echo", "x" * (200 * 1024)])  # one argument over MAX_ARG_STRLEN
        assert r.exit_code == 126 and "too long" in r.stderr, r
        r = await box.exec("kill -TERM $$")
        assert r.exit_code == 128 + 15
        # the command runs as pid 2 under bwrap's init, as a fresh bwrap exec always did
        assert (await box.exec("echo $$")).stdout == "2\n"
        # a background process that let go of stdout dies with the exec all the same
        r = await box.exec("sleep 31.4159 >/dev/null 2>&1 & echo bg")
        assert r.ok and r.stdout == "bg\n"
        ps = subprocess.run(["pgrep", "-f", "sleep 31.4159"], capture_output=True, text=True)
        assert ps.stdout == "", ps.stdout
        # a timed-out exec kills what it started; the next exec sees none of it
        r = await box.exec("sleep 300 & echo started; wait", timeout=0.5)
        assert r.timed_out and r.stdout == "started\n"
        assert "sleep" not in (await box.exec("ps -eo args")).stdout


async def test_stub_leaves_only_stdio_open(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    try:
        async with await backend.create(SPEC) as box:
            r = await box.exec(
                ["python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"]
            )
            assert r.stdout == "['0', '1', '2', '3']\n", r  # 3: the listdir itself
            # the helper is inside, read-only
            r = await box.exec("touch /.palaestra/exec; echo $?")
            assert r.stdout.strip() != "0"
    finally:
        await backend.aclose()


async def test_a_jail_that_died_waiting_is_replaced(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    try:
        async with await backend.create(SPEC) as box:
            assert _waiting(box) is None, "a plain create starts nothing"
            await box.wait_ready()
            proc = _waiting(box)
            assert proc is not None
            os.killpg(proc.pid, 9)
            await proc.wait()
            r = await box.exec(["echo", "still here"])
            assert r.ok and r.stdout == "still here\n", r
    finally:
        await backend.aclose()


async def test_waiting_jails_die_with_their_sandbox(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    try:
        box = await backend.create(SPEC)
        assert (await box.exec("true")).ok
        await asyncio.sleep(0.3)  # the next exec's jail comes up in the background
        proc = _waiting(box)
        assert proc is not None and _alive(proc.pid)
        await box.close()
        assert proc.returncode is not None, "close returned before its jail was reaped"
        left = subprocess.run(
            ["pgrep", "-f", str(box.root)], capture_output=True, text=True, check=False
        ).stdout
        assert left == "", left
    finally:
        await backend.aclose()


def _running_transports() -> list[asyncio.SubprocessTransport]:
    """This loop's subprocess transports whose process it has not seen exit: left so when the
    loop closes, each one's finalizer fails ("Event loop is closed")."""
    loop = asyncio.get_running_loop()
    return [
        o
        for o in gc.get_objects()
        # type(), not isinstance: the heap holds dead weak proxies, which isinstance trips on
        if issubclass(type(o), asyncio.SubprocessTransport)
        and getattr(o, "_loop", None) is loop
        and o.get_returncode() is None
        and not o.is_closing()
    ]


@pytest.mark.parametrize("wait_s", [0.0, 0.002, 0.01, 0.03])
async def test_close_while_a_jail_comes_up_reaps_it(tmp_path: Path, wait_s: float) -> None:
    backend = _backend(tmp_path)
    try:
        box = await backend.create(SPEC)
        ready = asyncio.ensure_future(box.wait_ready())
        await asyncio.sleep(wait_s)
        await box.close()
        with contextlib.suppress(asyncio.CancelledError):
            await ready
        assert _running_transports() == []
    finally:
        await backend.aclose()


async def test_waiting_jails_are_bounded(tmp_path: Path) -> None:
    backend = _backend(tmp_path, max_ready_jails=1)
    try:
        a = await backend.create(SPEC)
        b = await backend.create(SPEC)
        await a.wait_ready()
        await b.wait_ready()  # over the bound: nothing started, no error
        assert _waiting(a) is not None and _waiting(b) is None
        assert backend.jails.used == 1
        assert (await b.exec(["echo", "b"])).stdout == "b\n"  # starts its own jail
        await a.close()  # gives its place back
        await b.wait_ready()
        assert _waiting(b) is not None and backend.jails.used == 1
        assert (await b.exec(["echo", "b"])).stdout == "b\n"
        await b.close()
        assert backend.jails.used == 0
    finally:
        await backend.aclose()


async def test_warm_pool_hands_out_ready_jails(tmp_path: Path) -> None:
    from palaestra.sandbox.pool import WarmPool

    pool = WarmPool(_backend(tmp_path), size=2)
    try:
        pool.prewarm(SPEC)
        for _ in range(500):
            if pool.pooled == 2:
                break
            await asyncio.sleep(0.01)
        assert pool.pooled == 2
        async with await pool.create(SPEC) as box:
            assert isinstance(box, BwrapSandbox)
            fut = box.jails.ahead
            assert fut is not None and fut.done() and fut.result().ready
            assert (await box.exec(["echo", "warm"])).stdout == "warm\n"
    finally:
        await pool.aclose()
