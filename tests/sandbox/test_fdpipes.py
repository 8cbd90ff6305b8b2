"""sandbox/fdpipes.py: the pipes the server's loop serves are closed once, by their owner.

Under uvloop a pipe transport closed its descriptor twice (libuv, then the file object),
and a worker thread's ``rmtree`` that was handed the number in between failed with EBADF
(a server log's traceback, 2026-12-05)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sandbox.fdpipes import PipeReader, PipeWriter

PROGRAM = Path(__file__).parent / "programs" / "pipes_under_uvloop.py"


async def test_reader_pauses_over_its_limit_and_reads_to_the_end() -> None:
    r, w = os.pipe()
    pipe, stream = PipeReader.open(r, limit=1024)
    writer = PipeWriter(w)
    data = os.urandom(1 << 20)
    writer.write(data)
    sent = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0.05)
    assert not sent.done()  # the stream holds at most ~2 KiB; the pipe filled, the drain waits
    got = bytearray()
    while len(got) < len(data):
        got += await stream.read(4096)
    await sent
    writer.close()
    assert bytes(got) == data and await stream.read() == b""  # the write end closed: EOF
    with pytest.raises(OSError):
        os.fstat(r)  # closed at end of file, by the reader
    pipe.close()  # and a second close is a no-op, never a close() of a reused number


async def test_writer_close_ends_a_waiting_write_and_a_gone_reader_breaks_the_pipe() -> None:
    r, w = os.pipe()
    writer = PipeWriter(w)
    writer.write(b"x" * (1 << 20))  # over a pipe's buffer and the high-water mark
    waiting = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0.05)
    writer.close()
    writer.close()
    with pytest.raises(ConnectionResetError):
        await waiting
    os.close(r)
    r2, w2 = os.pipe()
    os.close(r2)
    gone = PipeWriter(w2)
    gone.write(b"x")
    with pytest.raises(BrokenPipeError):
        await gone.drain()
    gone.close()


async def test_a_cancelled_drain_never_cuts_a_message() -> None:
    """A shell's command is one control message: cancelling the wait for room (the command
    was cancelled) must not leave half of it in the pipe for the next one to follow."""
    r, w = os.pipe()
    pipe, stream = PipeReader.open(r, limit=1 << 20)
    pipe.pause_reading()  # a shell busy with something else: nothing is read yet
    writer = PipeWriter(w)
    message = b"m" * (300 << 10) + b"\0"
    writer.write(message)
    drained = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0.05)
    drained.cancel()
    writer.write(b"next\0")
    pipe.resume_reading()
    got = bytearray()
    while not got.endswith(b"next\0"):
        got += await stream.read(1 << 16)
    assert bytes(got) == message + b"next\0"
    writer.close()
    pipe.close()


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.skipif(not bwrap_available()[0], reason="bwrap is unusable here")
def test_the_fork_server_and_shell_pipes_are_closed_once_under_uvloop(tmp_path: Path) -> None:
    trace = tmp_path / "closes.txt"
    args = ["root"] if os.geteuid() == 0 else []
    done = subprocess.run(
        ["strace", "-Z", "-e", "trace=close", "-e", "signal=none", "-o", str(trace),
         sys.executable, str(PROGRAM), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    failed = [line for line in trace.read_text().splitlines() if "EBADF" in line]
    # close(-1) is the interpreter's own no-op; any other is a number closed twice
    assert [line for line in failed if not line.startswith("close(-1)")] == []
