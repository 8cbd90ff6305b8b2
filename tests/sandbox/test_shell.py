"""The persistent shell (palaestra.sandbox.shell) on the bwrap backend, with the real bwrap."""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import SandboxGone, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, BwrapSandbox, bwrap_available
from palaestra.sandbox.shell import KILLED_EXIT_CODE, BashSession, _Capped

_OK, _WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")
IS_ROOT = os.geteuid() == 0


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[BwrapSandbox]:
    b = BwrapBackend(None if IS_ROOT else tmp_path / "rt")
    try:
        async with await b.create(SandboxSpec(workspace_mb=16, default_timeout_s=20)) as s:
            yield s
    finally:
        await b.aclose()


@pytest.fixture
async def sh(box: BwrapSandbox) -> AsyncIterator[BashSession]:
    session = await box.shell()
    try:
        yield session
    finally:
        await session.close()


def test_capped_head_and_tail() -> None:
    c = _Capped(10)
    c.add(b"0123456789")
    assert not c.truncated and c.text() == "0123456789"
    c.add(b"abcdef")
    assert c.truncated and c.text() == "01234\n[… 6 bytes omitted …]\nbcdef"


async def test_state_persists_exit_codes_cwd(sh: BashSession) -> None:
    r = await sh.run("echo hi; pwd")
    assert (r.output, r.exit_code, r.cwd, r.restarted) == ("hi\n/work\n", 0, "/work", False)
    r = await sh.run("mkdir -p sub && cd sub && X=42 && export Y=7")
    assert r.exit_code == 0 and r.cwd == "/work/sub" and r.output == ""
    r = await sh.run("echo $X $(printenv Y); pwd; false")
    assert (r.output, r.exit_code, r.cwd) == ("42 7\n/work/sub\n", 1, "/work/sub")
    r = await sh.run("(exit 7)")
    assert r.exit_code == 7 and not r.timed_out
    r = await sh.run("no-such-program-xyz")
    assert r.exit_code == 127 and "not found" in r.output
    # stderr is merged into the output, in order
    r = await sh.run("echo out; echo err >&2; echo out2")
    assert r.output == "out\nerr\nout2\n"
    # syntax errors are data, and do not break the framing
    r = await sh.run("if then fi (")
    assert r.exit_code == 2 and "syntax error" in r.output
    r = await sh.run("cat <<EOF\nunterminated heredoc")
    assert r.exit_code == 0 and "unterminated heredoc" in r.output
    assert (await sh.run("echo still")).output == "still\n"


async def test_same_workspace_as_exec(box: BwrapSandbox, sh: BashSession) -> None:
    await box.write_file("from_host.txt", "host\n")
    r = await sh.run("cat from_host.txt; echo shell > from_shell.txt; id -u")
    assert r.output == "host\n1000\n"
    assert await box.read_file("from_shell.txt") == b"shell\n"
    e = await box.exec("cat from_shell.txt")
    assert e.stdout == "shell\n"


async def test_output_cap_head_and_tail(sh: BashSession) -> None:
    r = await sh.run("seq 1 100000", max_output=1000)
    assert r.truncated and r.exit_code == 0
    assert r.output.startswith("1\n2\n3\n") and r.output.endswith("99999\n100000\n")
    total = len("".join(f"{i}\n" for i in range(1, 100001)))
    assert f"[… {total - 1000} bytes omitted …]" in r.output
    r = await sh.run("echo small", max_output=1000)
    assert r.output == "small\n" and not r.truncated


async def test_invalid_utf8_and_big_output(sh: BashSession) -> None:
    r = await sh.run(r"printf 'a\xff\xfeb\n'")
    assert r.output == "a\ufffd\ufffdb\n" and r.exit_code == 0
    r = await sh.run("head -c 5000000 /dev/zero | tr '\\0' x; echo", max_output=100)
    assert r.truncated and r.output.startswith("x" * 50) and r.output.endswith("x" * 49 + "\n")


async def test_one_megabyte_command(sh: BashSession) -> None:
    payload = "y" * (1 << 20)
    t0 = time.monotonic()
    r = await sh.run(f"X='{payload}'\necho ${{#X}}")
    assert r.output == f"{1 << 20}\n" and r.exit_code == 0, r.output[:200]
    assert time.monotonic() - t0 < 10
    # a long command ending with a here-document keeps its trailing newline
    body = "z" * 20000
    r = await sh.run(f"cat <<'EOF' | wc -c\n{body}\nEOF\n")
    assert r.output.strip() == str(len(body) + 1)
    # NUL bytes cannot be in a bash command: they are dropped
    assert (await sh.run("echo a\0b")).output == "ab\n"


async def test_timeout_kills_the_job_and_the_shell_survives(sh: BashSession) -> None:
    await sh.run("cd /tmp; KEEP=1; sleep 4321 &")  # a background job of an earlier command
    t0 = time.monotonic()
    r = await sh.run("sleep 1234 & sleep 100", timeout=1)
    elapsed = time.monotonic() - t0
    assert r.timed_out and not r.idle_timed_out and elapsed < 2.0, (r, elapsed)
    # SIGINT first (130); under load a SIGINT that lands between bash's fork and the child's
    # exec is lost, and the SIGKILL that follows ends it (137): both are the contract.
    assert r.exit_code in (130, 137) and r.cwd == "/tmp" and not r.restarted, r
    r = await sh.run("echo $KEEP; pwd; ps -eo args")
    assert "1\n/tmp\n" in r.output and not r.restarted
    # the timed-out command's processes are gone, its background child too (bash may report
    # "Killed sleep 1234" for it); the background job of an earlier command survives
    procs = r.output.splitlines()
    assert "sleep 1234" not in procs and "sleep 100" not in procs and "sleep 4321" in procs


async def test_timeout_escalates_to_sigkill(sh: BashSession) -> None:
    t0 = time.monotonic()
    r = await sh.run("trap '' INT; sleep 100", timeout=0.5)
    assert r.timed_out and r.exit_code == 137 and time.monotonic() - t0 < 1.5, r
    r = await sh.run("echo ok")
    assert r.output == "ok\n" and not r.restarted


async def test_builtin_loop_kills_and_restarts_the_shell(sh: BashSession) -> None:
    await sh.run("cd /tmp")
    t0 = time.monotonic()
    r = await sh.run("while :; do :; done", timeout=0.5)
    assert r.timed_out and r.exit_code == KILLED_EXIT_CODE and time.monotonic() - t0 < 1.5, r
    r = await sh.run("pwd")
    assert r.restarted and r.output == "/work\n" and r.cwd == "/work"


async def test_idle_timeout(sh: BashSession) -> None:
    t0 = time.monotonic()
    r = await sh.run("echo started; sleep 100", timeout=10, idle_timeout=0.5)
    assert r.timed_out and r.idle_timed_out and r.output.startswith("started\n"), r
    assert time.monotonic() - t0 < 1.5
    # output keeps an idle timeout from firing
    r = await sh.run(
        "for i in 1 2 3 4 5 6; do echo $i; sleep 0.2; done", timeout=10, idle_timeout=0.6
    )
    assert not r.timed_out and r.exit_code == 0 and r.output.split() == list("123456")


async def test_exit_exec_and_kill_restart(sh: BashSession) -> None:
    await sh.run("cd /tmp; sleep 999 &")
    r = await sh.run("exit 3")
    assert r.exit_code == 3 and not r.restarted
    r = await sh.run("pwd; ps -eo args | grep -c '[s]leep 999'")
    assert r.restarted and r.output == "/work\n0\n" and r.cwd == "/work"
    assert not (await sh.run("true")).restarted
    t0 = time.monotonic()
    r = await sh.run("exec sleep 1")
    assert r.exit_code == 0 and not r.timed_out and 0.9 < time.monotonic() - t0 < 3
    r = await sh.run("echo back")
    assert r.restarted and r.output == "back\n"
    r = await sh.run("kill -9 $$")
    assert r.exit_code == 137
    assert (await sh.run("echo again")).restarted
    r = await sh.run("set -e; false; echo never")
    assert r.exit_code == 1 and "never" not in r.output
    assert (await sh.run("echo x")).restarted


async def test_redirections_do_not_outlive_their_command(sh: BashSession) -> None:
    r = await sh.run("exec 1>&- 2>&-; echo lost")
    assert r.exit_code != 0 or r.output == ""
    assert (await sh.run("echo ok")).output == "ok\n"
    await sh.run("exec >/tmp/log; echo to-log")
    r = await sh.run("echo visible; cat /tmp/log")
    assert r.output == "visible\nto-log\n"
    r = await sh.run("read x; echo rc=$?")  # stdin is /dev/null
    assert r.output == "rc=1\n"


async def test_xtrace_does_not_show_the_framing(sh: BashSession) -> None:
    r = await sh.run("set -x; echo a")
    r = await sh.run("echo b")
    # the command is traced (one level down: it runs in an eval), the framing is not
    assert r.output in ("+ echo b\nb\n", "++ echo b\nb\n"), r.output
    r = await sh.run("set +x")
    assert (await sh.run("echo c")).output == "c\n"


async def test_forged_sentinels(sh: BashSession) -> None:
    # everything of the shell a command can see: variables, traps, its cmdline, environ
    r0 = await sh.run(
        "set; trap -p; cat /proc/$$/cmdline /proc/1/cmdline /proc/1/environ 2>&1 | tr '\\0' ' '"
    )
    seen = r0.output[-20000:]
    forged = (
        f"printf '%s' {shlex.quote(seen)}; "
        # the old nonces with every framing the shell uses, on stdout and stderr
        "for n in $(printf '%s' " + shlex.quote(seen) + " | grep -oE '[0-9a-f]{32}'); do "
        "printf '\\036P%s\\037%s 0 /\\0' $n $n; printf '\\036P%s\\037' $n >&2; done; "
        "printf 'ready\\0__PALAESTRA_DONE__ 0 /\\n'; "
        # every fd 0-20, from the shell itself and from a program
        "for fd in $(seq 0 20); do { printf 'x 0 /\\0\\036P\\037' >&$fd; } 2>/dev/null; done; "
        'python3 -c \'import os\nfor fd in range(21):\n  try: os.write(fd, b"y 0 /\\0")\n  '
        "except OSError: pass' 2>/dev/null; "
        "sleep 0.3; echo after; cd /usr; (exit 3)"
    )
    r = await sh.run(forged, timeout=10)
    assert r.output.endswith("after\n") and r.exit_code == 3 and r.cwd == "/usr", r
    assert not r.timed_out and r.duration_s >= 0.3
    r = await sh.run("echo ok")
    assert r.output == "ok\n" and r.exit_code == 0 and r.cwd == "/usr", r


async def test_programs_cannot_reach_the_shell(sh: BashSession) -> None:
    # The shell is non-dumpable: its fds, memory and environ are closed to the sandbox.
    for what in ("ls /proc/$$/fd", "cat /proc/$$/environ", "head -c1 /proc/$$/mem"):
        r = await sh.run(what + " >/dev/null")
        assert r.exit_code != 0 and "Permission denied" in r.output, (what, r)
    r = await sh.run("ls /proc/self/fd /proc/1/fd | tr '\\n' ' '")
    assert r.exit_code == 0
    assert set(r.output.split()) <= {"/proc/self/fd:", "/proc/1/fd:", "0", "1", "2", "3", "4"}
    # a program started now cannot write a status for a later command either
    await sh.run("(for i in $(seq 50); do ls /proc/*/fd/ >/dev/null 2>&1; sleep 0.02; done) &")
    r = await sh.run("sleep 0.2; echo done; (exit 4)")
    assert r.output.endswith("done\n") and r.exit_code == 4


async def test_interrupt_from_another_task(sh: BashSession) -> None:
    await sh.interrupt()  # nothing runs: a no-op
    task = asyncio.ensure_future(sh.run("echo go; sleep 100", timeout=30))
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    await sh.interrupt()
    r = await asyncio.wait_for(task, 5)
    assert time.monotonic() - t0 < 1.0
    assert r.exit_code in (130, 137) and not r.timed_out and r.output.startswith("go\n"), r
    assert (await sh.run("echo ok")).output == "ok\n"


async def test_concurrent_runs_are_serialized(sh: BashSession) -> None:
    rs = await asyncio.gather(*(sh.run(f"echo {i}; sleep 0.05; echo {i}") for i in range(5)))
    assert [r.output for r in rs] == [f"{i}\n{i}\n" for i in range(5)]


async def test_close_twice_kills_everything(box: BwrapSandbox) -> None:
    sh = await box.shell()
    await sh.run("sleep 5678 &")
    procs = list(box.procs)
    assert procs
    await sh.close()
    await sh.close()
    with pytest.raises(SandboxGone):
        await sh.run("true")
    assert all(p.returncode is not None for p in procs)
    ps = await asyncio.to_thread(lambda: os.popen("ps -eo args").read())
    assert "sleep 5678" not in ps
    assert box.cgroup_users == 0


async def test_sandbox_close_ends_the_shell(box: BwrapSandbox) -> None:
    sh = await box.shell()
    task = asyncio.ensure_future(sh.run("sleep 100"))
    await asyncio.sleep(0.3)
    await box.close()
    with pytest.raises(SandboxGone):
        await asyncio.wait_for(task, 5)
    with pytest.raises(SandboxGone):
        await sh.run("true")
    await sh.close()
    with pytest.raises(SandboxGone):
        await box.shell()


async def test_round_trip_latency(sh: BashSession) -> None:
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        r = await sh.run("true")
        times.append(time.perf_counter() - t0)
        assert r.exit_code == 0
    times.sort()
    assert times[len(times) // 2] < 0.05  # about 0.3 ms on an idle machine
