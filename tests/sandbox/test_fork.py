"""`Backend.fork` on every backend (see sandbox_backends.py): a new sandbox whose workdir is
a copy of the parent's (files, folders, modes, symlinks as links), after which each goes
on alone; what the agent left that cannot be copied is its fault, and leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.sandbox.base import AgentFault, Backend, SandboxSpec
from palaestra.sandbox.bwrap.sandbox import BwrapSandbox
from sandbox.sandbox_backends import (  # noqa: F401  (fixtures)
    backend_fixture,
    make,
    spec_fixture,
)

SETUP = (
    "mkdir -p sub/deeper && echo hello > a.txt && printf '#!/bin/sh\\necho ran\\n' > sub/run.sh"
    " && chmod 755 sub/run.sh && echo deep > sub/deeper/d.txt && ln -s sub/deeper/d.txt link"
)


async def test_a_fork_copies_the_workdir_and_then_goes_its_own_way(
    backend: Backend, spec: SandboxSpec, tmp_path: Path
) -> None:
    async with await backend.create(spec) as parent:
        assert (await parent.exec(SETUP)).ok
        async with await backend.fork(parent, tmp_path / "spool") as child:
            assert child.id != parent.id and child.spec == parent.spec
            r = await child.exec("cat a.txt link && ./sub/run.sh && readlink link")
            assert (r.exit_code, r.stdout) == (0, "hello\ndeep\nran\nsub/deeper/d.txt\n"), r
            await child.write_file("only-child.txt", "c")
            await parent.write_file("a.txt", "changed in the parent")
            assert await child.read_file("a.txt") == b"hello\n"
            with pytest.raises(FileNotFoundError):
                await parent.read_file("only-child.txt")
            # A fork of the fork holds what the fork held then.
            async with await backend.fork(child, tmp_path / "spool") as grandchild:
                assert await grandchild.read_file("only-child.txt") == b"c"
        assert (await parent.exec("cat a.txt")).stdout == "changed in the parent"


async def test_what_cannot_be_copied_is_the_agents_and_leaves_nothing(
    backend: Backend, spec: SandboxSpec, tmp_path: Path
) -> None:
    async with await backend.create(spec) as parent:
        # Sparse files far over the workspace together: no copy of them fits (read_limit).
        assert (await parent.exec("truncate -s 30M s1 s2 s3")).ok
        live = backend.live_count
        with pytest.raises(AgentFault):
            await backend.fork(parent, tmp_path / "spool")
        assert backend.live_count == live  # the half-made fork was closed
        assert (await parent.exec("ls")).stdout == "s1\ns2\ns3\n"  # the parent goes on


@pytest.mark.parametrize("kind", ["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
async def test_links_are_copied_as_links_and_fifos_skipped(kind: str, tmp_path: Path) -> None:
    """bwrap's host-side copy and docker's engine copy keep a link the agent made as a link
    (to a host path too: never followed, wherever it points) and copy no fifo (as a
    download skips it); the mode of a folder is kept."""
    backend = make(kind, tmp_path)
    try:
        async with await backend.create(SandboxSpec(workspace_mb=16)) as parent:
            setup = "ln -s /etc dir-link && mkfifo pipe && mkdir d && chmod 700 d && touch d/f"
            assert (await parent.exec(setup)).ok
            async with await backend.fork(parent, tmp_path / "spool") as child:
                r = await child.exec("readlink dir-link; ls -A; stat -c %a d; ls d")
                assert r.stdout == "/etc\nd\ndir-link\n700\nf\n", r
                if isinstance(child, BwrapSandbox):
                    assert (child.workspace / "dir-link").is_symlink()
    finally:
        await backend.aclose()
    assert backend.live_count == 0
