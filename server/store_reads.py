"""The store's reads, as blocking calls on its database (server/store.py).

They see what the store's writer has committed. The server reads through `Store`'s async
methods, which first wait for every write queued before them and run these off the event
loop; code already on a thread of its own (the cluster's pack depot, tests) calls these
directly, after `Store.flush()` where it must see its own queued writes.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from palaestra.sdk.failures import Failure
from palaestra.sdk.models import (
    EpisodeMetrics,
    EpisodeState,
    GroupReward,
    StepRecord,
    StepResponse,
    Verdict,
)
from palaestra.server.db import Connection, Database

_CHUNK = TypeAdapter(list[StepRecord])


def expand(rows: list[Any]) -> list[tuple[int, str | None, StepRecord]]:
    """(index, request id, record) of each step in `rows` of (idx, request_id, record), in
    index order: a row is one step, or a chunk (a JSON array of consecutive steps from its
    index, their request ids joined by newlines: server/store_rows.py's `_chunked`). An index held
    twice is its later row's (a rewrite)."""
    steps: dict[int, tuple[str | None, StepRecord]] = {}
    for start, request_id, record in rows:
        if record.startswith("["):
            ids = request_id.split("\n") if request_id is not None else []
            for offset, step in enumerate(_CHUNK.validate_json(record)):
                one = ids[offset] if offset < len(ids) and ids[offset] else None
                steps[start + offset] = (one, step)
        else:
            steps[start] = (request_id, StepRecord.model_validate_json(record))
    return [(index, rid, step) for index, (rid, step) in sorted(steps.items())]


def _group_reward(row: Any) -> GroupReward | None:
    """An episode's group reward from its (reward, scorer, method, digest) row."""
    if row is None:
        return None
    return GroupReward(reward=row[0], scorer=row[1], method=row[2], group_digest=row[3])


class StoreReads:
    """Every read of the store, by what it answers."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def group_result(self, digest: str) -> str | None:
        """The stored result (JSON) of the group `digest` (None: never judged)."""
        row = self.db.one("SELECT result FROM group_verdicts WHERE digest=?", (digest,))
        return str(row[0]) if row else None

    def groups_of(self, keys: tuple[str, ...]) -> dict[str, str]:
        """The group digest of each episode among `keys` judged in a group already."""
        marks = ",".join("?" * len(keys))
        rows = self.db.all(
            f"SELECT episode_id, group_digest FROM group_rewards WHERE episode_id IN ({marks})",
            keys,
        )
        return {row[0]: row[1] for row in rows}

    def load_episode(self, episode_id: str, with_trajectory: bool = True) -> EpisodeState | None:
        with self.db.connection() as db:
            row = db.execute(
                "SELECT id, task, family, domain, split, status, step_count, created_at,"
                " updated_at, ended_at, void_reason, timings, metrics, failure FROM episodes"
                " WHERE id=?",
                (episode_id,),
            ).fetchone()
            if row is None:
                return None
            verdict_row = db.execute(
                "SELECT verdict FROM verdicts WHERE episode_id=?", (episode_id,)
            ).fetchone()
            steps = self._steps(db, episode_id) if with_trajectory else []
            group = db.execute(
                "SELECT r.reward, g.scorer, g.method, g.digest FROM group_rewards r"
                " JOIN group_verdicts g ON g.digest = r.group_digest WHERE r.episode_id=?",
                (episode_id,),
            ).fetchone()
        return EpisodeState(
            episode_id=row[0],
            task=row[1],
            family=row[2],
            domain=row[3],
            split=row[4],
            status=row[5],
            step_count=row[6],
            created_at=row[7],
            updated_at=row[8],
            ended_at=row[9],
            void_reason=row[10],
            timings=json.loads(row[11]),
            metrics=EpisodeMetrics.model_validate_json(row[12] or "{}"),
            failure=Failure.model_validate_json(row[13]) if row[13] else None,
            verdict=Verdict.model_validate_json(verdict_row[0]) if verdict_row else None,
            trajectory=steps,
            group_reward=_group_reward(group),
        )

    def load_steps(self, episode_id: str, count: int | None = None) -> list[StepRecord]:
        """An episode's trajectory, its first `count` steps (flush first to see the latest)."""
        with self.db.connection() as db:
            return self._steps(db, episode_id, count)

    @staticmethod
    def _steps(db: Connection, episode_id: str, count: int | None = None) -> list[StepRecord]:
        limit = 2**62 if count is None else count
        rows = db.execute(
            "SELECT idx, request_id, record FROM step_records WHERE episode=(SELECT number"
            " FROM episodes WHERE id=?) AND idx < ? ORDER BY idx",
            (episode_id, limit),
        ).fetchall()
        return [step for index, _, step in expand(rows) if index < limit]

    def find_step(self, episode_id: str, request_id: str) -> StepResponse | None:
        # A chunk row holds its steps' request ids joined by newlines (server/store.py).
        rows = self.db.all(
            "SELECT idx, request_id, record FROM step_records WHERE episode=(SELECT number"
            " FROM episodes WHERE id=?) AND request_id LIKE ? ORDER BY idx",
            (episode_id, f"%{request_id}%"),
        )
        found = [step for _, rid, step in expand(rows) if rid == request_id]
        if not found:
            return None
        record = found[-1]
        return StepResponse(
            observation=record.observation,
            reward=record.reward,
            terminated=record.terminated,
            truncated=record.truncated,
            info=record.info,
        )

    def is_sealed(self, episode_id: str) -> bool:
        """Whether a stored episode ran on a sealed split (unknown episodes: False)."""
        row = self.db.one("SELECT sealed FROM episodes WHERE id=?", (episode_id,))
        return bool(row and row[0])

    def owners(self, keys: tuple[str, ...]) -> dict[str, tuple[str | None, bool]]:
        """(owner token id, sealed) of the stored episodes among `keys` (absent: unknown)."""
        marks = ",".join("?" * len(keys))
        rows = self.db.all(f"SELECT id, owner, sealed FROM episodes WHERE id IN ({marks})", keys)
        return {row[0]: (row[1], bool(row[2])) for row in rows}

    def starts_since(self, since: float) -> list[tuple[str, float]]:
        """(owner, created_at) of the episodes started since `since` (quota windows)."""
        rows = self.db.all(
            "SELECT owner, created_at FROM episodes WHERE created_at > ? AND owner IS NOT NULL",
            (since,),
        )
        return [(row[0], float(row[1])) for row in rows]

    def placement(self, episode_id: str) -> tuple[str, str] | None:
        """(worker, node) the episode was placed on (None: never placed)."""
        row = self.db.one("SELECT worker, node FROM placements WHERE episode_id=?", (episode_id,))
        return (row[0], row[1]) if row else None

    def active_on(self, worker: str) -> list[str]:
        """Ids of the `active` episodes placed on `worker`."""
        rows = self.db.all(
            "SELECT p.episode_id FROM placements p JOIN episodes e ON e.id = p.episode_id"
            " WHERE p.worker=? AND e.status='active' ORDER BY p.episode_id",
            (worker,),
        )
        return [row[0] for row in rows]

    def final_state(self, episode_id: str) -> str | None:
        """The episode's kept final state record (JSON, server/final_state.py), if any."""
        row = self.db.one("SELECT final_state FROM episodes WHERE id=?", (episode_id,))
        return str(row[0]) if row and row[0] is not None else None

    def get_blob(self, digest: str) -> bytes | None:
        row = self.db.one("SELECT data FROM blobs WHERE digest=?", (digest,))
        return bytes(row[0]) if row else None

    def sampler_history(self, limit: int) -> list[tuple[float, str, str, float, bool, str | None]]:
        """The last `limit` done/void episodes and the admin releases since, oldest first:
        (ended_at, task, status, reward, passed, void_reason); status `release` for a release."""
        if limit <= 0:
            return []
        with self.db.connection() as db:
            reward = db.json_field("v.verdict", "reward")
            passed = db.json_field("v.verdict", "passed")
            rows = db.execute(
                f"SELECT e.ended_at, e.task, e.status, {reward}, {passed}, e.void_reason"
                " FROM episodes e LEFT JOIN verdicts v ON v.episode_id = e.id"
                " WHERE e.ended_at IS NOT NULL AND e.status IN ('done', 'void')"
                " ORDER BY e.ended_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
            since = rows[-1][0] if rows else 0.0
            releases = db.execute(
                "SELECT at, task FROM sampler_releases WHERE at >= ?", (since,)
            ).fetchall()
        history = [(r[0], r[1], r[2], float(r[3] or 0.0), r[4] in (1, "true"), r[5]) for r in rows]
        history += [(at, task, "release", 0.0, False, None) for at, task in releases]
        history.sort(key=lambda h: h[0])
        return history

    def count_by_status(self) -> dict[str, int]:
        return dict(self.db.all("SELECT status, COUNT(*) FROM episodes GROUP BY status"))
