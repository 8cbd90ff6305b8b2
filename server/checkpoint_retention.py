"""How long a resumable episode waits for its resume (`checkpoint_retention_hours`;
server/checkpoint.py keeps the checkpoints).

A `resumable` episode (its server stopped) that has waited longer than the retention since
it became resumable has its checkpoint deleted, snapshot and all, and becomes `expired`
with failure kind `expired`, its reason naming the setting: nobody resumed it in time, and
a checkpoint nobody comes back for would hold its workspace archive on disk for ever. Its
resume then answers 409 `checkpoint_expired` saying so. A live episode's checkpoint is not
aged: it is replaced at each checkpoint and dropped when the episode ends.
"""

from __future__ import annotations

import time

from palaestra.sdk.errors import ConflictError
from palaestra.sdk.failures import Failure, FailureKind
from palaestra.server.db import Connection, Database

HOUR_S = 3600.0
EXPIRED_BY = "checkpoint_retention_hours"  # in the reason, so a resume can say why


def retention_reason(hours: float) -> str:
    return (
        f"its checkpoint was not resumed within {EXPIRED_BY}={hours:g}; the checkpoint was deleted"
    )


STALE = (
    "SELECT c.episode_id, c.workspace, c.created_at FROM checkpoints c JOIN episodes e"
    " ON e.id = c.episode_id WHERE e.status='resumable' AND e.updated_at < ?"
)


def expire_stale(db: Database, hours: float) -> list[tuple[str, float]]:
    """`expire` in a transaction of its own (blocking: call it in a thread), taken only when
    a read finds an episode past the retention: the reaper calls this every tick."""
    if db.one(STALE + " LIMIT 1", (time.time() - hours * HOUR_S,)) is None:
        return []
    with db.transaction() as conn:
        return expire(conn, hours)


def expire(conn: Connection, hours: float, now: float | None = None) -> list[tuple[str, float]]:
    """Expire the episodes resumable for longer than `hours` (their `updated_at` is when
    they became so), in one transaction; the (snapshot digest, checkpoint time) of each
    deleted checkpoint."""
    now = time.time() if now is None else now
    rows = conn.all(STALE, (now - hours * HOUR_S,))
    failure = Failure.of(FailureKind.EXPIRED, retention_reason(hours)).model_dump_json()
    dropped: list[tuple[str, float]] = []
    for key, digest, created in rows:
        conn.execute(
            "UPDATE episodes SET status='expired', ended_at=?, updated_at=?, failure=?"
            " WHERE id=? AND status='resumable'",
            (now, now, failure, key),
        )
        conn.execute("DELETE FROM checkpoints WHERE episode_id=?", (key,))
        if digest is not None:
            dropped.append((str(digest), float(created)))
    return dropped


def expired_error(episode_id: str, reason: str) -> ConflictError:
    """The 409 of a resume of an episode whose checkpoint the retention deleted."""
    return ConflictError(
        f"episode {episode_id} can no longer be resumed: {reason}",
        code="checkpoint_expired",
    )
