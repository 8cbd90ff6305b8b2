"""Red team: the served copy of palaestra's sandbox programs (server/served.py) is checked
for ownership at its base folder only, never above it. As a non-root server the base is
the predictable ``/tmp/palaestra-<uid>/lib``: another local user who made
``/tmp/palaestra-<uid>`` first (writable by them) lets the server create ``lib`` inside,
then renames it away and puts a ``lib/lib-<digest>`` of their own (the digest is that of the
released code) in its place. `library()` is cached and sandboxes bind the path, so every
later generator sandbox runs the substituted palaestra package."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from palaestra.server import served


def test_a_base_under_a_folder_others_can_write_is_refused() -> None:
    where = Path(tempfile.mkdtemp(prefix="served-rt-"))
    try:
        os.chmod(where, 0o755)
        planted = where / "palaestra-1000"  # made first by someone else: anyone may write
        planted.mkdir()
        os.chmod(planted, 0o777)
        base = planted / "lib"
        try:
            lib = served.library(base)
        except served.ServeError:
            return  # refused: what should happen
        # accepted: the folder above is not ours alone, so the copy can be swapped
        os.rename(base, planted / "old")  # allowed to anyone by planted's mode
        fake = lib.root / "palaestra" / "sdk"
        fake.mkdir(parents=True)
        (fake / "task.py").write_text("raise SystemExit('substituted')\n")
        assert (lib.packages / "sdk" / "task.py").read_text().startswith("raise SystemExit")
        pytest.fail(
            f"served.library accepted {base} under {planted} (mode 0777): its copy "
            f"{lib.root} was replaced by a foreign one at the same path"
        )
    finally:
        for dirpath, _, _ in os.walk(where):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(where)
