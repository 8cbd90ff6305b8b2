"""A workspace moved between sandboxes never sits whole in server memory (issue 34, bounded
bytes): it streams through an anonymous file in the server's tmp dir, and one over its
limit is the agent's fault, refused naming the limit, never read without bound.

Peak memory is the process's VmHWM, reset first (/proc/self/clear_refs, "5"), so what
the copy held at its worst is measured, not what was left once it finished.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from palaestra.envs.base import AgentFault, EpisodeContext
from palaestra.envs.sandboxes import Sandboxes
from palaestra.envs.terminal import TerminalFamily
from palaestra.envs.terminal.family import TerminalState
from palaestra.sandbox.base import Backend, SandboxError, SandboxFileTooLarge, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sdk.task import Task

from .harness import make_backend

OK, WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"bwrap unusable: {WHY}")
IS_ROOT = os.geteuid() == 0

BIG = 200_000_000  # the workspace's bytes: far more than the allowed growth below
GROWTH_MB = 50
# The agent's workspace: a big file, a script, a private file, a folder and a link in it.
FILL = (
    f"head -c {BIG} /dev/zero > big && printf 'echo go\\n' > go.sh && chmod 755 go.sh"
    " && printf k > key && chmod 600 key && mkdir -p sub && ln -s ../go.sh sub/run"
)
CHECK = (
    f'[ "$(stat -c %s big)" = {BIG} ] && [ "$(stat -c %a go.sh)" = 755 ]'
    ' && [ "$(stat -c %a key)" = 600 ] && [ "$(readlink sub/run)" = ../go.sh ]'
    ' && [ "$(sh sub/run)" = go ]'
)


def _mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> float:
    """Reset this process's peak RSS (VmHWM) to its RSS now, and return that."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS here: {e}")
    return _mb("VmRSS")


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[BwrapBackend]:
    b = BwrapBackend(None if IS_ROOT else tmp_path / "rt")
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
async def any_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    b = make_backend(request.param)
    try:
        yield b
    finally:
        await b.aclose()


async def test_a_big_workspace_moves_without_being_held(
    any_backend: Backend, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    sandboxes = Sandboxes(any_backend.create, spool_dir=spool)
    spec = SandboxSpec(workspace_mb=256, default_timeout_s=60)
    try:
        src, dst = await sandboxes.verifier(spec), await sandboxes.verifier(spec)
        assert (await src.exec(FILL)).ok
        before = _reset_peak()
        await sandboxes.copy_workspace(src, dst)
        grew = _mb("VmHWM") - before
        assert grew < GROWTH_MB, f"moving a {BIG >> 20} MiB workspace held {grew:.0f} MiB"
        r = await dst.exec(CHECK)
        assert r.ok, r
        assert os.listdir(spool) == []  # the spool file is gone (it never had a name)
    finally:
        await sandboxes.aclose()


def _terminal_task(public: dict[str, object]) -> Task:
    test_sh = f"#!/bin/bash\nset -e\n{CHECK}\n"
    return Task(
        "big", "terminal", "d", "train", "p/q", "1",
        {"instruction": "fill it", **public}, {"verifier": {"test.sh": test_sh}},
    )  # fmt: skip


async def _verify(backend: BwrapBackend, spool: Path, fill: str, **public: object) -> object:
    """The terminal family's verify of an episode whose agent ran `fill`, its peak memory
    growth checked; the assessment (or the agent fault it raised)."""
    family = TerminalFamily()
    task = _terminal_task(dict(public))
    sandboxes = Sandboxes(backend.create, spool_dir=spool)
    try:
        await sandboxes.start(family.sandbox_spec(task))
        ctx = EpisodeContext("e", task, None, {}, sandboxes, state=TerminalState())
        assert sandboxes.episode is not None
        assert (await sandboxes.episode.exec(fill, timeout=60)).ok
        before = _reset_peak()
        try:
            result: object = await family.verify(ctx)
        except AgentFault as fault:
            result = fault
        grew = _mb("VmHWM") - before
        assert grew < GROWTH_MB, f"the verify of a {BIG >> 20} MiB workspace held {grew:.0f} MiB"
        assert os.listdir(spool) == []
        return result
    finally:
        await sandboxes.aclose()


async def test_the_terminal_verify_streams_the_workspace(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    """The family's own path (download, retire, fresh verifier sandbox, sanitize, upload)
    holds none of the workspace whole, and the tests see it as the agent left it."""
    verdict = await _verify(backend, tmp_path / "spool", FILL, workspace_mb=256)
    assert getattr(verdict, "reward", None) == 1.0, verdict


async def test_a_workspace_over_its_limit_is_the_agents_fault(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    """Hard links make a tar bigger than the workspace holding them: the copy stops at
    the limit (nothing read past it) with an agent fault that names it: reward 0, never
    void."""
    fill = "head -c 20000000 /dev/zero > huge && for i in 1 2 3 4; do ln huge huge$i; done"
    fault = await _verify(backend, tmp_path / "spool", fill, workspace_mb=32)
    assert isinstance(fault, SandboxFileTooLarge), fault
    assert fault.failure == "too_large"
    limit = (32 + 16) << 20
    assert f"limit of {limit} bytes" in str(fault) and "huge" in str(fault)


class _FullDisk(io.BytesIO):
    """A spool file on a server disk with no space left."""

    def write(self, data: object, /) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


async def test_a_full_server_disk_is_ours_not_the_agents(backend: BwrapBackend) -> None:
    """ENOSPC writing the server's spool file is an infrastructure fault (void), never
    taken for the workspace's own ENOSPC (WorkspaceFull, the agent's)."""
    async with await backend.create(SandboxSpec(workspace_mb=16)) as box:
        assert (await box.exec("echo x > f")).ok
        with pytest.raises(SandboxError) as refused:
            await box.download_tar_to(_FullDisk())
        assert not isinstance(refused.value, AgentFault), refused.value
        assert "spool" in str(refused.value)
