"""Fair publishing (issue 34, invariant 4): one publisher's slow or repeated generator work
never makes another publisher wait; a publish that will be refused (a version published
with other bytes, a quota) is refused before any generator runs; the number of generator
splits a publish may run is capped."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from conftest import make_settings

from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.archive import pack_archive

from .publishers import archive, client, error, publish

SLOW_S = 6.0  # a slow generator split's sleep: what a refusal must not wait for


def generator_pack(
    root: Path, name: str, *, sleep_s: float = 0.0, splits: int = 1, note: str = ""
) -> bytes:
    """`test/<name>` with one generator of `splits` splits, each call sleeping `sleep_s`."""
    root.mkdir(parents=True)
    names = [f"s{i}" for i in range(splits)]
    declared = "".join(f"[splits.{n}]\nsealed = false\n\n" for n in names)
    generated = "".join(
        f"[generators.g.splits.{n}]\nseeds = [{100 * i}, {100 * i + 100}]\ncount = 1\n"
        for i, n in enumerate(names)
    )
    (root / "pack.toml").write_text(
        f'name = "test/{name}"\nversion = "1.0.0"\nfamilies = ["echo"]\n\n{declared}'
        '[generators.g]\nmodule = "gen.py"\nfamily = "echo"\ndomain = "fair/g"\n'
        f"{generated}"
    )
    (root / "gen.py").write_text(
        f"import time\n# {json.dumps(note)}\n\n\ndef generate(seed, index, level):\n"
        f"    time.sleep({sleep_s})\n"
        '    return {"public": {"instruction": "x"}, "private": {"answer": "x"}}\n'
    )
    return pack_archive(root)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """conftest's `manager`, without the publish-time cheat audit (it is not what is timed)."""
    return make_settings(
        data_dir=tmp_path / "data",
        generate_timeout_s=60.0,
        publish_check_tasks=0,
        generate_max_splits=3,
    )


async def test_a_slow_publisher_never_holds_up_another(
    manager: EpisodeManager, tmp_path: Path
) -> None:
    """Two slow generator publishes of one publisher used to take both install threads:
    every other publisher waited behind them."""
    async with (
        client(manager, ["publish"], orgs=("test",)) as slow,
        client(manager, ["publish"], orgs=("test",)) as quick,
    ):
        hog = [
            asyncio.create_task(
                publish(slow, generator_pack(tmp_path / f"slow{i}", f"slow{i}", sleep_s=SLOW_S))
            )
            for i in range(2)
        ]
        await asyncio.sleep(1.0)  # both of the slow publisher's publishes are in
        started = time.monotonic()
        reply = await publish(quick, archive(tmp_path, "test/quick"))
        waited = time.monotonic() - started
        assert reply.status_code == 201, reply.text
        assert waited < SLOW_S - 1.0, f"the quick publisher waited {waited:.1f} s behind another"
        assert not all(task.done() for task in hog)
        assert [r.status_code for r in await asyncio.gather(*hog)] == [201, 201]


async def test_a_publisher_queues_a_bounded_number(manager: EpisodeManager, tmp_path: Path) -> None:
    limit = manager.settings.publish_queue_per_publisher
    async with client(manager, ["publish"], orgs=("test",)) as http:
        packs = [generator_pack(tmp_path / f"q{i}", f"q{i}", sleep_s=2.0) for i in range(limit + 1)]
        replies = await asyncio.gather(*(publish(http, data) for data in packs))
    refused = [r for r in replies if r.status_code == 429]
    assert len(refused) == 1, [r.status_code for r in replies]
    _, code, message = error(refused[0])
    assert code == "publish_busy" and "publishes in progress" in message
    assert refused[0].headers.get("retry-after")
    assert sum(r.status_code == 201 for r in replies) == limit


async def test_refusals_come_before_any_generator_runs(
    manager: EpisodeManager, tmp_path: Path
) -> None:
    async with client(manager, ["publish"], orgs=("test",)) as http:
        first = await publish(http, generator_pack(tmp_path / "v1", "ver", sleep_s=0.0))
        assert first.status_code == 201, first.text
        # The same version with other bytes (and a slow generator): 409 at once.
        other = generator_pack(tmp_path / "v1b", "ver", sleep_s=SLOW_S * 3, note="other")
        started = time.monotonic()
        status, code, _ = error(await publish(http, other))
        assert (status, code) == (409, "version_exists")
        assert time.monotonic() - started < SLOW_S
        # The same bytes again: answered from the store, no generator run.
        again = await publish(http, generator_pack(tmp_path / "v1c", "ver", sleep_s=0.0))
        assert again.status_code == 200 and again.json()["created"] is False, again.text
        # Too many generator splits: refused before the first runs.
        started = time.monotonic()
        many = generator_pack(tmp_path / "many", "many", sleep_s=SLOW_S * 3, splits=4)
        status, code, message = error(await publish(http, many))
        assert (status, code) == (400, "generator_failed"), message
        assert "generate_max_splits" in message and time.monotonic() - started < SLOW_S


async def test_a_quota_refuses_before_generation(tmp_path: Path) -> None:
    settings = make_settings(
        data_dir=tmp_path / "data", publish_check_tasks=0, publisher_max_versions=0
    )
    from palaestra.server.runtime import build_manager

    manager = build_manager(settings)
    await manager.start()
    try:
        async with client(manager, ["publish"], orgs=("test",)) as http:
            started = time.monotonic()
            slow = generator_pack(tmp_path / "quota", "quota", sleep_s=SLOW_S * 3)
            status, code, message = error(await publish(http, slow))
            assert (status, code) == (413, "publish_quota"), message
            assert "publisher_max_versions" in message
            assert time.monotonic() - started < SLOW_S
    finally:
        await manager.shutdown()
