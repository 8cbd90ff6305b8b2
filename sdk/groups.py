"""Wire models of group rewards (`POST /v1/groups/verify`, DESIGN §3).

A group is the episodes of one task that a trainer compares (GRPO's group): a group scorer
(a pairwise tournament with swap checks, or one ranking call in the style of RULER) judges
their final answers against each other and gives each a reward in [0, 1].
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from palaestra.sdk.models import PlainStr, WireModel

GroupScorer = Literal["tournament", "ranking"]
# Ids a request may carry at all; the server's `max_group_size` ceiling is usually lower.
MAX_GROUP_IDS = 1024


class GroupVerifyRequest(WireModel):
    episode_ids: list[PlainStr] = Field(
        min_length=2,
        max_length=MAX_GROUP_IDS,
        description="the ended episodes of one task (each the caller's own); order is free",
    )
    scorer: GroupScorer = Field(description="tournament: round-robin pairs; ranking: one call")


class GroupVerifyResponse(WireModel):
    rewards: dict[str, float] = Field(description="episode id (as sent) → reward in [0, 1]")
    scorer: GroupScorer
    method: str = Field(description="the scorer's own name for how it scored")
    judge: dict[str, Any] = Field(
        default_factory=dict,
        description="the judge's records (endpoint, model, prompt digests, config digest); "
        "empty for a sealed split's episodes",
    )
    group_digest: str = Field(description="sha256 over the scorer and the episodes, any order")
    stored: bool = Field(
        default=False, description="true: judged by an earlier call, this is its stored result"
    )
