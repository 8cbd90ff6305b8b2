"""Group rewards for the collector: a finished group's episodes judged together.

With `CollectorConfig.group_scorer` set ("tournament" or "ranking"), the collector sends a
complete group's episodes to `POST /v1/groups/verify` and trains on the rewards it gives;
each trajectory keeps its own verifier's reward in `verifier_reward`. A judge that is down
(503 `judge_unavailable`) or a group the server cannot judge (409: an episode it no longer
holds) drops the group, counted, as a void episode is dropped: it is never trained on with
rewards of another scale. A refusal of the request itself (401/403/422) is raised, since
every group would be refused the same way.
"""

from __future__ import annotations

from collections import Counter

from palaestra.sdk.client import AsyncClient, AsyncServerClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.groups import GroupScorer
from palaestra.sdk.train.types import Group

SCORERS: tuple[GroupScorer, ...] = ("tournament", "ranking")
REFUSED = frozenset({401, 403, 422})


def group_client(client: AsyncClient, scorer: str) -> AsyncServerClient:
    """`client`, checked to serve group rewards with `scorer` (ValueError else)."""
    if scorer not in SCORERS:
        raise ValueError(f"group_scorer must be one of {list(SCORERS)}; got {scorer!r}")
    if not isinstance(client, AsyncServerClient):
        raise ValueError("group_scorer needs a client with verify_group (HTTP or in-process)")
    return client


async def apply_group_rewards(
    client: AsyncServerClient, scorer: GroupScorer, group: Group, stats: Counter[str]
) -> bool:
    """Replace the group's rewards by the group judge's; False: drop the group (counted).

    Prefiltered trajectories (sdk/train/prefilter.py) were never verified: they keep their
    0 and stay out of the judged group. With fewer than two judged episodes the group keeps
    its verifiers' rewards (counted `group_verify_skipped`)."""
    judged = [t for t in group.trajectories if t.episode_id and not t.prefiltered]
    ids = list(dict.fromkeys(t.episode_id for t in judged))
    if len(ids) < 2:
        stats["group_verify_skipped"] += 1
        return True
    try:
        reply = await client.verify_group(ids, scorer)
    except PalaestraError as exc:
        if exc.status in REFUSED:
            raise
        stats[f"groups_dropped:{exc.code}"] += 1
        stats["groups_dropped"] += 1
        return False
    for trajectory in judged:
        trajectory.verifier_reward = trajectory.reward
        trajectory.reward = reply.rewards[trajectory.episode_id]
    stats["groups_judged"] += 1
    return True
