"""The copy of palaestra's sandbox programs (server/served.py): content-addressed, read-only,
made once, and refused where the sandbox uid could not reach it or someone else could
change it, with the path and the fix in the message."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from palaestra.sandbox.bwrap.host import is_root
from palaestra.sandbox.readable import unreadable_by_others
from palaestra.server import served


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder every uid can traverse (pytest's own tmp folder is 0700)."""
    where = Path(tempfile.mkdtemp(prefix="served-"))
    os.chmod(where, 0o755)
    yield where
    for dirpath, _, _ in os.walk(where):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(where)


def test_the_copy_is_content_addressed_read_only_and_made_once(open_tmp: Path) -> None:
    base = open_tmp / "lib"
    lib = served.library(base)
    assert lib.root.parent == base and lib.root.name.startswith("lib-")
    assert (lib.packages / "sdk" / "task.py").is_file()
    assert (lib.packages / "__init__.py").is_file()  # a regular package, first on the path
    assert (lib.harness / "bash_agent.py").is_file()
    files = [p for p in lib.root.rglob("*") if p.is_file()]
    assert files and not [p for p in files if "__pycache__" in p.parts or p.suffix == ".pyc"]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o444}
    dirs = [lib.root, *(p for p in lib.root.rglob("*") if p.is_dir())]
    assert {p.stat().st_mode & 0o777 for p in dirs} == {0o555}
    assert unreadable_by_others(lib.packages) is None
    served.library.cache_clear()  # a second server process: the same folder, not a new one
    assert served.library(base) == lib and len(list(base.iterdir())) == 1


@pytest.mark.skipif(not is_root(), reason="as a user, bwrap reads what the user reads")
def test_a_base_the_sandbox_uid_cannot_reach_is_refused(open_tmp: Path) -> None:
    closed = open_tmp / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(served.ServeError) as caught:
        served.library(closed / "lib")
    assert f"{closed} lacks o+x" in str(caught.value)
    assert f"chmod o+x {closed}" in str(caught.value)


def test_a_base_others_can_write_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "shared"
    base.mkdir()
    os.chmod(base, 0o777)
    with pytest.raises(served.ServeError, match=f"{base} belongs to another user or is writable"):
        served.library(base)


def test_an_install_closed_to_others_is_told(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "pydantic").mkdir(parents=True)
    assert unreadable_by_others(site) is None
    os.chmod(site / "pydantic", 0o700)
    assert unreadable_by_others(site) == f"{site / 'pydantic'} lacks o+rx (mode 0700)"
