"""Pack names have owners (DESIGN §5b, issue 14 invariant 5).

Before: any publish token could publish any name, the built-in orgs included: a foreign
`openai/humaneval@9.9.9` became what the unpinned `openai/humaneval` (and the sampler)
resolved to; a new pack joined unfiltered sampling at once; nothing bounded what one
publisher stored.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import BIN, ServerProcess, make_settings

from palaestra.sdk.errors import NotFoundError
from palaestra.server.auth import create_token
from palaestra.server.config import Settings
from palaestra.server.db import Database
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.registry import PackRegistry

from .publishers import archive, client, echo_task, error, publish

HUMANEVAL = "openai/humaneval"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(
        data_dir=tmp_path / "data", publisher_max_versions=3, publisher_max_bytes=4000
    )


def resolved_version(manager: EpisodeManager, name: str) -> str:
    return str(manager.packs.get(name).version)


async def test_a_publisher_cannot_take_a_builtin_org(
    manager: EpisodeManager, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    before = resolved_version(manager, HUMANEVAL)
    task_id = next(iter(manager.packs.get(HUMANEVAL).tasks))
    # Even a token an admin granted the org by mistake: built-in orgs are admin-only.
    for orgs in ((), ("openai",)):
        async with client(manager, ["publish"], orgs) as pub:
            tasks = [echo_task(task_id)]
            reply = await publish(pub, archive(tmp_path, HUMANEVAL, "9.9.9", tasks=tasks))
            status, code, message = error(reply)
            assert (status, code) == (403, "org_not_granted"), reply.text
            assert "'openai'" in message and "admin" in message
    assert resolved_version(manager, HUMANEVAL) == before != "9.9.9"
    assert manager.packs.resolve(f"{HUMANEVAL}:{task_id}").version == before
    listed = await api.get(f"/v1/packs/{HUMANEVAL}")
    assert "9.9.9" not in listed.json()["versions"]
    for _ in range(50):  # the sampler never draws it either
        task, _ = manager.sampler.sample(pack=HUMANEVAL)
        assert task.version == before
    assert not list((manager.settings.data_dir / "packs" / "sha256").glob("*"))


async def test_an_org_belongs_to_the_tokens_granted_it(
    manager: EpisodeManager, tmp_path: Path
) -> None:
    async with (
        client(manager, ["publish"], ("acme",)) as alice,
        client(manager, ["publish"], ("bobco",)) as bob,
        client(manager, ["publish"]) as nobody,
    ):
        reply = await publish(bob, archive(tmp_path, "acme/tool"))
        status, code, message = error(reply)
        assert (status, code) == (403, "org_not_granted")
        assert "'acme'" in message and "--org acme" in message and "bobco" in message
        assert error(await publish(nobody, archive(tmp_path, "acme/tool")))[0] == 403
        assert (await publish(alice, archive(tmp_path, "acme/tool"))).status_code == 201
        # The owner's name cannot be hijacked: a foreign newer version is refused, so the
        # unpinned ref keeps resolving to the owner's.
        refused = await publish(bob, archive(tmp_path, "acme/tool", "2.0.0"))
        assert error(refused)[:2] == (403, "org_not_granted")
        assert resolved_version(manager, "acme/tool") == "1.0.0"
        assert (await publish(bob, archive(tmp_path, "bobco/tool"))).status_code == 201
        assert (await publish(alice, archive(tmp_path, "acme/tool", "1.1.0"))).status_code == 201
        assert resolved_version(manager, "acme/tool") == "1.1.0"


async def test_a_published_pack_is_sampled_only_once_an_admin_enables_it(
    manager: EpisodeManager, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    async with client(manager, ["publish"], ("acme",)) as alice:
        assert (await publish(alice, archive(tmp_path, "acme/bait"))).status_code == 201
        rng = random.Random(7)
        drawn = {manager.sampler.sample(rng)[0].pack for _ in range(400)}
        assert "acme/bait" not in drawn and len(drawn) > 2
        # A domain filter without a pack is not a way in either.
        with pytest.raises(NotFoundError, match="nothing to sample"):
            manager.sampler.sample(rng, domain="bait/echo")
        # Explicit refs and pack= still work for anyone allowed.
        assert manager.sampler.sample(rng, pack="acme/bait")[0].pack == "acme/bait"
        started = await api.post("/v1/episodes", json={"task": "acme/bait:say-oak"})
        assert started.status_code == 200, started.text
        # Only an admin enables it.
        denied = await alice.post("/v1/packs/acme/bait/enable")
        assert error(denied)[0] == 403
    unknown = await api.post("/v1/packs/acme/nothing/enable")
    assert error(unknown)[0] == 404
    enabled = await api.post("/v1/packs/acme/bait/enable")
    assert enabled.status_code == 200 and enabled.json()["changed"] is True
    assert (await api.post("/v1/packs/acme/bait/enable")).json()["changed"] is False
    drawn = {manager.sampler.sample(rng)[0].pack for _ in range(400)}
    assert "acme/bait" in drawn
    # The choice survives a restart: the store's index says which names are enabled.
    again = PackCatalog()
    registry = PackRegistry(manager.settings.data_dir, manager.store.db)
    registry.load_into(again, [f.name for f in manager.families.all()])
    assert again.sampled("acme/bait")


async def test_an_admin_published_pack_is_enabled_at_once(
    manager: EpisodeManager, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    reply = await api.post("/v1/packs", content=archive(tmp_path, "palaestra/extra"))
    assert reply.status_code == 201, reply.text
    assert manager.packs.sampled("palaestra/extra")


async def test_the_version_quota_refuses_with_413(manager: EpisodeManager, tmp_path: Path) -> None:
    async with (
        client(manager, ["publish"], ("acme",)) as alice,
        client(manager, ["publish"], ("acme",)) as carol,
    ):
        for v in ("1.0.0", "1.0.1", "1.0.2"):
            assert (await publish(alice, archive(tmp_path, "acme/q", v))).status_code == 201
        reply = await publish(alice, archive(tmp_path, "acme/q", "1.0.3"))
        status, code, message = error(reply)
        assert (status, code) == (413, "publish_quota")
        assert "publisher_max_versions=3" in message and not reply.json()["error"]["retryable"]
        assert "1.0.3" not in {p.version for p in manager.packs.all() if p.name == "acme/q"}
        # The quota is the publisher's: another token of the same org still publishes.
        assert (await publish(carol, archive(tmp_path, "acme/q", "1.0.3"))).status_code == 201


async def test_the_byte_quota_refuses_with_413(manager: EpisodeManager, tmp_path: Path) -> None:
    objects = manager.settings.data_dir / "packs" / "sha256"
    async with client(manager, ["publish"], ("acme",)) as alice:
        small = archive(tmp_path, "acme/small")
        assert (await publish(alice, small)).status_code == 201
        installed = sorted(objects.iterdir())
        big = [echo_task("say-oak", padding="x" * 5000)]
        reply = await publish(alice, archive(tmp_path, "acme/big", tasks=big))
        status, code, message = error(reply)
        assert (status, code) == (413, "publish_quota")
        assert "4000 bytes" in message
        assert sorted(objects.iterdir()) == installed  # nothing of it stored
        assert not list((manager.settings.data_dir / "packs" / "tmp").iterdir())


def test_pack_enable_cli(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        token, _ = create_token(
            Database.open(server.data_dir / "palaestra.sqlite3"),
            ["publish"],
            name="cli-pub",
            orgs=["acme"],
        )
        src = archive(tmp_path, "acme/cli")
        (tmp_path / "p.tar.gz").write_bytes(src)
        cli = [str(BIN / "palaestra"), "pack"]
        done = subprocess.run(
            [*cli, "publish", str(tmp_path / "p.tar.gz"), "--url", server.url, "--token", token],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        denied = subprocess.run(
            [*cli, "enable", "acme/cli", "--url", server.url, "--token", token],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert denied.returncode != 0 and "admin" in denied.stderr + denied.stdout
        ok = subprocess.run(
            [*cli, "enable", "acme/cli", "--url", server.url, "--token", str(server.token)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ok.returncode == 0 and "acme/cli enabled" in ok.stdout, ok.stderr
    finally:
        server.stop()
