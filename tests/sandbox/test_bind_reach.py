"""A read-only bind from under a folder closed to the sandbox uid (a checkout or venv in a
0700 home) reaches the sandbox: bwrap as root runs as uid 1000, which cannot traverse it,
so the backend binds the folder where that uid can (sandbox/bwrap/mounts.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sandbox.bwrap.host import is_root

_OK, _WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")


async def test_a_bind_under_a_closed_folder_is_read_inside(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lib = home / "checkout" / "lib"
    lib.mkdir(parents=True)
    (lib / "hello.py").write_text("print('served')\n")
    os.chmod(home, 0o700)
    backend = BwrapBackend(None if is_root() else tmp_path / "rt")
    spec = SandboxSpec(ro_binds=((str(lib), "/opt/lib"),))
    try:
        async with await backend.create(spec) as box:
            result = await box.exec(["/usr/bin/python3", "/opt/lib/hello.py"], timeout=60)
            assert (result.exit_code, result.stdout) == (0, "served\n"), result.stderr
            wrote = await box.exec(["/bin/sh", "-c", "echo x > /opt/lib/new"], timeout=60)
            assert wrote.exit_code != 0  # read-only
    finally:
        await backend.aclose()
    assert not (lib / "new").exists()
