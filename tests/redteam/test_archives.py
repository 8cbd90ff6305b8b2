"""Pack archives (POST /v1/packs) are checked while they inflate: a compression bomb is
refused (413, naming the limit) after its first megabytes, and never holds other requests.

Before: the extractor listed every member first (`getmembers`, which inflates the whole
stream to seek past the data), checked the sizes only then, had no ratio check and read
pax records of any size into memory; installs ran on asyncio's shared thread pool, so a
few bombs at once starved every store flush (every reset and close waits on one).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import tarfile
import time
from pathlib import Path

import httpx
import pytest
from conftest import make_settings

from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.archive import (
    ArchiveError,
    ArchiveLimits,
    ArchiveTooLarge,
    extract_archive,
    pack_archive,
)

MiB = 1 << 20
GZIP = {"content-type": "application/gzip"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(data_dir=tmp_path / "data", max_pack_files=50)


def zeros_bomb(mib: int, name: str = "pack.toml") -> bytes:
    """A tar.gz whose one entry is `mib` MiB of zeros: ~1 KiB of gzip per MiB."""
    info = tarfile.TarInfo(name)
    info.size = mib * MiB
    head = gzip.compress(info.tobuf(tarfile.PAX_FORMAT), 9, mtime=0)
    return head + gzip.compress(bytes(MiB), 9, mtime=0) * mib


def tar_gz(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for info, data in entries:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def tiny_pack(root: Path, name: str = "test/tiny") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pack.toml").write_text(
        f'name = "{name}"\nversion = "1.0.0"\ndescription = "tiny"\nlicense = "MIT"\n'
        'families = ["echo"]\n\n[splits.train]\nsealed = false\n'
    )
    task = {
        "id": "say-oak",
        "family": "echo",
        "split": "train",
        "public": {"instruction": "Submit 'oak' backwards."},
        "private": {"answer": "kao"},
    }
    (root / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    return root


# -- the extractor ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("archive", "words"),
    [
        pytest.param(lambda: zeros_bomb(4096), "max_pack_unpacked_bytes", id="declared-4GiB"),
        pytest.param(lambda: zeros_bomb(1900), "max_pack_ratio", id="ratio-1.9GiB"),
    ],
)
def test_bombs_are_refused_while_inflating(tmp_path: Path, archive: object, words: str) -> None:
    data = archive()  # type: ignore[operator]
    start = time.monotonic()
    with pytest.raises(ArchiveTooLarge, match=words):
        extract_archive(data, tmp_path / "x")
    assert time.monotonic() - start < 2.0, "the bomb was inflated before it was refused"
    written = sum(p.stat().st_size for p in (tmp_path / "x").rglob("*") if p.is_file())
    assert written < 64 * MiB, f"{written} bytes of a bomb reached the disk"


def test_an_oversized_pax_record_is_refused_before_it_is_read(tmp_path: Path) -> None:
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = 1 << 30  # tarfile would read this whole record into memory
    data = (
        gzip.compress(pax.tobuf(tarfile.USTAR_FORMAT), mtime=0)
        + gzip.compress(bytes(MiB), 9, mtime=0) * 1024
    )
    start = time.monotonic()
    with pytest.raises(ArchiveTooLarge, match="extended header"):
        extract_archive(data, tmp_path / "x")
    assert time.monotonic() - start < 2.0


def test_entry_count_and_compressed_size_are_bounded(tmp_path: Path) -> None:
    many = [(tarfile.TarInfo(f"f{i}"), b"x") for i in range(60)]
    with pytest.raises(ArchiveTooLarge, match="max_pack_files"):
        extract_archive(tar_gz(many), tmp_path / "a", ArchiveLimits(max_files=50))
    with pytest.raises(ArchiveTooLarge, match="max_pack_bytes"):
        extract_archive(b"\0" * 2048, tmp_path / "b", ArchiveLimits(max_compressed=1024))


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("fifo", tarfile.FIFOTYPE),
        ("blk", tarfile.BLKTYPE),
        ("a\nb", tarfile.REGTYPE),
        ("a\x00b", tarfile.REGTYPE),
        ("x" * 5000, tarfile.REGTYPE),
        ("a\\..\\b", tarfile.REGTYPE),
    ],
)
def test_odd_members_and_names_are_refused(tmp_path: Path, name: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    with pytest.raises(ArchiveError):
        extract_archive(tar_gz([(info, b"")]), tmp_path / "x")


def test_a_truncated_or_garbage_archive_is_a_clean_error(tmp_path: Path) -> None:
    good = pack_archive(tiny_pack(tmp_path / "src"))
    for data in (good[: len(good) // 2], b"not gzip at all", good[:10]):
        with pytest.raises(ArchiveError):
            extract_archive(data, tmp_path / f"x{len(data)}")
    assert (extract_archive(good, tmp_path / "ok") / "pack.toml").is_file()


# -- over HTTP ---------------------------------------------------------------------------------
async def test_publishing_a_bomb_is_413_and_the_server_goes_on(
    api: httpx.AsyncClient, manager: EpisodeManager, tmp_path: Path
) -> None:
    bomb = zeros_bomb(4096)
    reply = await api.post("/v1/packs", content=bomb, headers=GZIP)
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert error["code"] == "archive_too_large" and "max_pack_unpacked_bytes" in error["message"]
    many = tar_gz([(tarfile.TarInfo(f"f{i}"), b"x") for i in range(60)])
    reply = await api.post("/v1/packs", content=many, headers=GZIP)
    assert reply.status_code == 413 and "max_pack_files" in reply.text
    # Nothing is left behind in the pack store's scratch space.
    assert manager.registry is not None
    assert not any(manager.registry.store.tmp.iterdir())
    good = pack_archive(tiny_pack(tmp_path / "tiny"))
    reply = await api.post("/v1/packs", content=good, headers=GZIP)
    assert reply.status_code == 201, reply.text


async def test_many_bombs_at_once_never_hold_other_requests(
    api: httpx.AsyncClient, manager: EpisodeManager
) -> None:
    bomb = zeros_bomb(1900)

    async def publish() -> int:
        return (await api.post("/v1/packs", content=bomb, headers=GZIP)).status_code

    async def reset() -> float:
        start = time.monotonic()
        reply = await api.post("/v1/episodes", json={"task": "palaestra/echo:say-birch"})
        assert reply.status_code == 200, reply.text
        return time.monotonic() - start

    bombs = [asyncio.ensure_future(publish()) for _ in range(16)]
    await asyncio.sleep(0.05)
    took = await reset()  # its store flush needs a thread of asyncio's pool
    statuses = await asyncio.gather(*bombs)
    assert set(statuses) <= {413, 429}, statuses
    assert took < 3.0, f"a reset waited {took:.1f} s behind the bombs"
