"""Yanking a published version (issue 22): only its publisher or an admin may; a yanked
version is what neither `name` nor sampling reaches, while exact pins (`name@version`, the
digest) still do, as pip and cargo treat a yanked release.

Attacks: another tenant's publish token (even one granted the same org) and a train token
try to withdraw a version a trainer depends on; both are refused and nothing changes.
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
from conftest import make_settings

from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.registry import PackRegistry

from .publishers import archive, client, echo_task, error, publish

NAME = "acme/tools"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(data_dir=tmp_path / "data", packs_dirs=[], pool_size=0)


def drawn_versions(manager: EpisodeManager, **filters: str) -> set[str]:
    rng = random.Random(7)
    return {manager.sampler.sample(rng, **filters)[0].version for _ in range(40)}


async def test_only_the_publisher_or_an_admin_yanks_and_exact_pins_keep_working(
    manager: EpisodeManager, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    async with (
        client(manager, ["publish"], ("acme",)) as alice,
        client(manager, ["publish"], ("acme",)) as mallory,  # same org, another tenant
        client(manager, ["train"]) as trainer,
    ):
        digests = {}
        for version in ("1.0.0", "1.1.0"):
            reply = await publish(alice, archive(tmp_path, NAME, version, tasks=[echo_task()]))
            assert reply.status_code == 201, reply.text
            digests[version] = reply.json()["digest"]
        assert (await api.post(f"/v1/packs/{NAME}/enable")).status_code == 200
        assert drawn_versions(manager) == {"1.1.0"}

        for who, code in ((mallory, "not_owner"), (trainer, "missing_scope")):
            status, got, _ = error(await who.post(f"/v1/packs/{NAME}@1.1.0/yank"))
            assert (status, got) == (403, code)
        assert drawn_versions(manager) == {"1.1.0"}  # nothing changed
        status, code, message = error(await alice.post(f"/v1/packs/{NAME}@9.9.9/yank"))
        assert (status, code) == (404, "not_found") and "9.9.9" in message

        yanked = await alice.post(f"/v1/packs/{NAME}@1.1.0/yank")
        assert yanked.json() == {
            "name": NAME,
            "version": "1.1.0",
            "yanked": True,
            "changed": True,
        }
        assert (await alice.post(f"/v1/packs/{NAME}@1.1.0/yank")).json()["changed"] is False
        # `name` resolves to the newest version not yanked; sampling never draws 1.1.0.
        latest = (await trainer.get(f"/v1/packs/{NAME}")).json()
        assert latest["version"] == "1.0.0" and latest["yanked"] is None
        assert drawn_versions(manager) == drawn_versions(manager, pack=NAME) == {"1.0.0"}
        # Exact pins still reach it, with the reason beside it.
        pinned = (await trainer.get(f"/v1/packs/{NAME}@1.1.0")).json()
        assert pinned["version"] == "1.1.0" and "yanked" in pinned["yanked"]
        reset = await trainer.post("/v1/episodes", json={"task": f"{NAME}@1.1.0:say-oak"})
        assert reset.status_code == 200, reset.text
        assert "yanked" in reset.json()["info"]["yanked"]
        by_digest = await api.get(f"/v1/packs/{NAME}@{digests['1.1.0']}/archive")
        assert by_digest.status_code == 200
        assert by_digest.headers["x-palaestra-digest"] == digests["1.1.0"]

        # It survives a restart: the registry's index says so.
        again = PackCatalog()
        PackRegistry(manager.settings.data_dir, manager.store.db).load_into(again, ["echo"])
        assert again.get(NAME).version == "1.0.0" and again.get(f"{NAME}@1.1.0")

        status, code, _ = error(await mallory.post(f"/v1/packs/{NAME}@1.1.0/unyank"))
        assert (status, code) == (403, "not_owner")
        assert (await alice.post(f"/v1/packs/{NAME}@1.1.0/unyank")).json()["yanked"] is False
        assert drawn_versions(manager) == {"1.1.0"}
        # An admin may yank what anyone published.
        assert (await api.post(f"/v1/packs/{NAME}@1.1.0/yank")).json()["changed"] is True
        assert manager.packs.get(NAME).version == "1.0.0"
