"""`sandbox.spawn`: a subprocess start that a cancellation cannot wedge, and that leaves no
child behind when it is cancelled."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from palaestra.sandbox.spawn import spawn


def _running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def test_spawn_returns_the_process() -> None:
    proc = await spawn("sh", "-c", "echo hi", stdout=subprocess.PIPE, start_new_session=True)
    out, _ = await proc.communicate()
    assert out == b"hi\n" and proc.returncode == 0


@pytest.mark.parametrize("ticks", range(6))
async def test_a_cancelled_spawn_ends_and_leaves_no_child(ticks: int) -> None:
    marker = f"{30 + ticks / 1000 + os.getpid() % 997 / 1e6:.6f}"  # a unique `sleep` argument
    task = asyncio.ensure_future(
        spawn(
            "sleep",
            marker,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    )
    for _ in range(ticks):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the cancelled spawn never returned"
    if task.cancelled():
        assert _running(marker) == []  # killed and reaped before the cancellation was raised
    else:  # it had already returned the process when the cancel came
        proc = task.result()
        proc.kill()
        await proc.wait()
