"""A step to an episode this host does not hold (server/stored_episodes.py): 409 when the
store says it ended, 503 `episode_in_transit` (retryable) when the store still has it
running, as for a lost cluster worker's episode before the front resumed it elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.sdk.errors import ConflictError, UnavailableError
from palaestra.sdk.models import EpisodeState, EpisodeStatus
from palaestra.server.db import Database
from palaestra.server.store import Store
from palaestra.server.stored_episodes import StoredEpisodes


def state(status: EpisodeStatus) -> EpisodeState:
    return EpisodeState(
        episode_id="e1",
        task="palaestra/echo:t",
        family="echo",
        domain="echo",
        split="train",
        status=status,
        step_count=1,
        created_at=0.0,
        updated_at=0.0,
    )


async def test_a_stored_running_episode_is_in_transit_and_an_ended_one_conflicts(
    tmp_path: Path,
) -> None:
    store = Store(Database.open(tmp_path / "store.sqlite3"))
    try:
        store.create_episode(state(EpisodeStatus.ACTIVE), "sha256:x", False)
        await store.commit()
        stored = StoredEpisodes(store)
        with pytest.raises(UnavailableError) as moving:
            await stored.step("e1", "e1", None)
        assert moving.value.code == "episode_in_transit" and moving.value.retryable
        assert moving.value.retry_after == 1.0
        store.update_episode(state(EpisodeStatus.VOID))
        with pytest.raises(ConflictError, match=r"has ended \(void\)"):
            await stored.step("e1", "e1", None)
    finally:
        await store.aclose()
