"""A checkpoint's tar restored (`Sandbox.restore_workspace`) keeps links out of the
workspace as they were (a venv's absolute `python`), so the unpack must never follow one: a
tar that names a link and then a file through it (a snapshot made by hand, or tampered
with on disk) writes nothing on the host, and neither does a `..` name.

Real sandboxes of every backend here."""

from __future__ import annotations

import contextlib
import io
import tarfile
from pathlib import Path

import pytest

from palaestra.sandbox.base import AgentFault, Backend, SandboxError

from .harness import ATTACK_SPEC, on_backends


def crafted(host_dir: Path) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        link = tarfile.TarInfo("esc")
        link.type, link.linkname = tarfile.SYMTYPE, str(host_dir)
        tf.addfile(link)
        for name in ("esc/pwned", "../pwned-up", "ok.txt"):
            data = b"owned"
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tf.addfile(member, io.BytesIO(data))
    buf.seek(0)
    return buf


@pytest.mark.parametrize("backend_name", on_backends())
async def test_a_restore_never_writes_through_a_link(backend: Backend, tmp_path: Path) -> None:
    host_dir = tmp_path / "host"
    host_dir.mkdir(mode=0o777)
    box = await backend.create(ATTACK_SPEC)
    try:
        with contextlib.suppress(AgentFault, SandboxError):  # refused: as good as inside
            await box.restore_workspace(crafted(host_dir))
        assert list(host_dir.iterdir()) == []
        assert not (tmp_path / "pwned-up").exists()
        r = await box.exec("ls -A", timeout=10)
        assert r.exit_code == 0 and "pwned" not in r.stdout
    finally:
        await box.close()
