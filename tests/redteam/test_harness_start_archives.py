"""A harness episode's start workspace (`checkpoint_harness`, on by default) is archived as its
harness starts, so that it can be checkpointed. An episode that ends without a checkpoint
must not leave that archive on the server's disk: a server whose clients never checkpoint
(the default) kept one archive per harness episode until some checkpointed episode ended
or the server restarted, so plain training filled the disk.

The real app over a real manager (bwrap sandbox); the start is kept the way the harness
runner keeps it (`CheckpointManager.keep_start`), without a model in the loop."""

from __future__ import annotations

from pathlib import Path

from conftest import make_settings

from tests.server.test_checkpoint import HE, Servers


def archives(folder: Path) -> list[Path]:
    return [p for p in (folder / "sha256").rglob("*") if p.is_file()]


async def test_an_ended_episodes_start_archive_goes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    servers = Servers(make_settings(data_dir=data))
    manager = await servers.start()
    try:
        me = servers.tenant(["train"])
        host = manager.host
        kept = []
        for _ in range(2):
            eid = await me.start(task=HE)
            episode = host._live[eid]  # type: ignore[attr-defined]
            await host.checkpoints.keep_start(episode)  # type: ignore[attr-defined]
            kept.append(eid)
        assert len(archives(data / "snapshots")) >= 1
        # One episode ends (no prune's grace is waited for: its start is dropped at once).
        assert (await me.http.delete(f"/v1/episodes/{kept[0]}")).status_code == 204
        await host.reap()
        # The live episode's start stays; the ended one's is gone unless they share bytes.
        starts = host.checkpoints._starts  # type: ignore[attr-defined]
        assert kept[1] in starts and kept[0] not in starts
        live = starts[kept[1]][0].removeprefix("sha256:")
        assert [p.name for p in archives(data / "snapshots")] == [live[2:]]
        assert (await me.http.delete(f"/v1/episodes/{kept[1]}")).status_code == 204
        await host.reap()
        assert archives(data / "snapshots") == [], archives(data / "snapshots")
    finally:
        await servers.stop()
        for t in servers.tenants:
            await t.http.aclose()


async def test_a_shared_checkpoint_dir_keeps_it_for_the_prune(tmp_path: Path) -> None:
    """A `checkpoint_dir` other nodes mount may hold another node's live start of the same
    bytes, unknown here: the archive is left to the prune (its grace), never dropped at once."""
    shared = tmp_path / "shared"
    servers = Servers(make_settings(data_dir=tmp_path / "data", checkpoint_dir=shared))
    manager = await servers.start()
    try:
        me = servers.tenant(["train"])
        eid = await me.start(task=HE)
        host = manager.host
        await host.checkpoints.keep_start(host._live[eid])  # type: ignore[attr-defined]
        assert (await me.http.delete(f"/v1/episodes/{eid}")).status_code == 204
        await host.reap()
        assert len(archives(shared)) == 1
    finally:
        await servers.stop()
        for t in servers.tenants:
            await t.http.aclose()
