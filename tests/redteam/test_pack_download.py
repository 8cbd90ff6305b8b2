"""A pack download streams from a file on the server's disk, and a published archive waits
on it: both were whole in server memory (a download's tar and gzip, twice its size; an
upload's body, up to max_pack_bytes), so a few concurrent ones of a large pack cost
gigabytes (issue 34, invariant 2: large transfers never sit whole in server memory)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import httpx

from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.archive import write_pack_archive
from tests.servers import serve

BIG_MB = 96


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def big_pack(root: Path) -> Path:
    """The echo pack as test/big with a large data file (text: packs hold text)."""
    shutil.copytree(REPO_PACKS / "echo", root)
    toml = (root / "pack.toml").read_text().replace('name = "palaestra/echo"', 'name = "test/big"')
    (root / "pack.toml").write_text(toml)
    (root / "pack.lock").unlink(missing_ok=True)
    (root / "data").mkdir()
    with (root / "data" / "big.txt").open("w") as out:
        for _ in range(BIG_MB):
            out.write(os.urandom(512 * 1024).hex())  # 1 MiB of text, barely compressible
    return root


def test_a_large_pack_download_streams(tmp_path: Path) -> None:
    pack = big_pack(tmp_path / "big")
    with (tmp_path / "expected.tar.gz").open("w+b") as expected:
        write_pack_archive(pack, expected)
        expected.seek(0)
        digest = hashlib.file_digest(expected, "sha256").hexdigest()
    with serve(tmp_path / "server", packs={"big": pack}) as server:
        pid = server.proc.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak from here on
        before = peak_kb(pid)
        got = hashlib.sha256()
        size = 0
        with httpx.stream(
            "GET", f"{server.url}/v1/packs/test/big/archive", headers=server.headers, timeout=120
        ) as reply:
            assert reply.status_code == 200, reply.read()[:300]
            assert int(reply.headers["content-length"]) > BIG_MB << 19  # hex: 2 to 1
            for chunk in reply.iter_bytes():
                got.update(chunk)
                size += len(chunk)
        grew_mb = (peak_kb(pid) - before) / 1024
        # The same archive published back: the upload waits on disk, never whole in memory.
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        before_publish = peak_kb(pid)
        with (tmp_path / "expected.tar.gz").open("rb") as upload:
            published = httpx.post(
                f"{server.url}/v1/packs",
                content=iter(lambda: upload.read(1 << 20), b""),
                headers={**server.headers, "content-type": "application/gzip"},
                timeout=300,
            )
        assert published.status_code in (200, 201), published.text
        publish_mb = (peak_kb(pid) - before_publish) / 1024
    assert got.hexdigest() == digest and size > BIG_MB << 19  # the same archive, whole
    grown = f"the server's peak memory grew {grew_mb:.0f} MB for a {size >> 20} MB archive"
    assert grew_mb < 40, grown
    assert publish_mb < 40, f"publishing it grew the server's peak memory {publish_mb:.0f} MB"
