"""Episodes as the store has them: what a host answers for an episode it no longer holds
(ended long ago, ended under an earlier server, or hosted by a lost cluster worker)."""

from __future__ import annotations

from palaestra.sdk.errors import ConflictError, UnavailableError
from palaestra.sdk.models import EpisodeState, EpisodeStatus, StepResponse, Verdict
from palaestra.server.auth import Principal
from palaestra.server.episode import unknown_episode
from palaestra.server.store import Store
from palaestra.server.tenancy import candidate_keys


class StoredEpisodes:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def key(self, principal: Principal, episode_id: str) -> str:
        """The store key of the stored episode `episode_id` names for `principal`.

        Another token's episode answers exactly as an unknown id does (404, same message):
        no existence oracle, and no split oracle (the sealed check comes after ownership)."""
        keys = candidate_keys(principal.token_id, episode_id)
        found = await self.store.owners(keys)
        for key in keys:
            row = found.get(key)
            if row is None:
                continue
            if principal.is_admin:
                return key
            if row[0] == principal.token_id:
                principal.require_episodes(row[1], None)
                return key
        raise unknown_episode(episode_id)

    async def load(self, key: str, episode_id: str) -> EpisodeState:
        """The stored episode under `key`, shown under the id the caller used."""
        state = await self.store.load_episode(key)
        if state is None:
            raise unknown_episode(episode_id)
        state.episode_id = episode_id
        return state

    async def step(self, key: str, episode_id: str, request_id: str | None) -> StepResponse:
        """A step sent to an ended episode: the stored reply of a retried request, else 409."""
        if request_id:
            stored = await self.store.find_step(key, request_id)
            if stored is not None:
                return stored
        state = await self.load(key, episode_id)
        if state.status is EpisodeStatus.ACTIVE:
            # Stored as running but live on no host that was asked: in transit (a cluster
            # worker was lost and its checkpointed episode is being resumed elsewhere, or
            # its new placement is not on disk yet). Retryable, never "ended".
            raise UnavailableError(
                f"episode {episode_id} is not live here yet (being resumed or placed); "
                "retry the request",
                code="episode_in_transit",
                retryable=True,
                retry_after=1.0,
            )
        raise ConflictError(
            f"episode {episode_id} has ended ({state.status.value}); start a new one"
        )

    async def verdict(self, key: str, episode_id: str) -> Verdict:
        stored = await self.load(key, episode_id)
        if stored.verdict is None:
            raise ConflictError(f"episode {episode_id} ended ({stored.status.value}) unverified")
        return stored.verdict
