"""Group rewards (`POST /v1/groups/verify`): the ended episodes of one task judged together.

A trainer's group (G attempts at one task) is handed to a group scorer of
palaestra.verifiers.judge — a pairwise tournament with swap checks, or one ranking call in
the style of RULER — which compares their final answers against each other and gives each
a reward in [0, 1]. The family says what is compared (`Family.judged_subject`: rubric,
judge config, task, reference, the episode's answer); the server's judge endpoint
(`manager.judges`) does the judging.

Rules kept here (docs/reference/judges.md, "Group rewards and the pre-filter"):
- every id is the caller's own, else the one 404 of an unknown episode (no existence
  oracle); ownership of all ids is checked before anything else is said of any of them;
- members are ended, verified and not void (409 naming the id), of one task, distinct, at
  most `max_group_size` (422); the family must give a judged subject (422);
- a group is judged from its episodes in memory (the last ENDED_CACHE ended episodes): one
  the server no longer holds answers 409 `episode_not_held`;
- a judge that gives no verdict answers 503 `judge_unavailable` (retryable), nothing stored;
- a group reward is given once: the same ids (any order) and scorer again answer the stored
  result without a judge call; an episode already judged in another group answers 409;
- sealed splits: rewards only, never the judge's records or reasons (nor the reference);
- cluster mode (episodes on Ray workers) is refused (422): the front holds no episode state.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from palaestra.sdk.errors import (
    ConflictError,
    InvalidActionError,
    ServerError,
    UnavailableError,
)
from palaestra.sdk.groups import GroupVerifyRequest, GroupVerifyResponse
from palaestra.sdk.models import EpisodeStatus, GroupReward
from palaestra.server.auth import ADMIN_PRINCIPAL, Principal
from palaestra.server.db import IntegrityError
from palaestra.server.episode import Episode, log_crash
from palaestra.verifiers.judge import MAX_GROUP, JudgedSubject, judge_group
from palaestra.verifiers.judge_protocol import JudgeUnavailable

if TYPE_CHECKING:
    from palaestra.server.manager import EpisodeManager

log = logging.getLogger("palaestra.groups")

# The wire's scorer names → verifiers.judge.judge_group's methods.
METHODS: dict[str, Literal["rank", "tournament"]] = {"tournament": "tournament", "ranking": "rank"}


@dataclass(frozen=True)
class Member:
    """One id of a request: as the caller sent it, its store key, and the episode while the
    server holds it (None: known to the store only)."""

    wire_id: str
    key: str
    episode: Episode | None


def group_digest(scorer: str, keys: Sequence[str]) -> str:
    """The group's identity: its scorer and its episodes' store keys, in any order."""
    text = json.dumps([scorer, sorted(keys)], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class GroupVerifier:
    """The manager's group judging (`manager.groups`): one judging per group at a time."""

    def __init__(self, manager: EpisodeManager) -> None:
        self.manager = manager
        self._running: dict[str, asyncio.Task[dict[str, Any]]] = {}

    async def verify(
        self, request: GroupVerifyRequest, principal: Principal = ADMIN_PRINCIPAL
    ) -> GroupVerifyResponse:
        settings = self.manager.settings
        principal.require_episodes(False, None)  # 403 without `train` (or `eval`)
        if settings.ray:
            raise InvalidActionError(
                "group rewards are not served in cluster mode (--ray): the front holds no "
                "episode's final state; judge groups on an embedded server",
                code="unsupported_in_cluster",
            )
        ids = request.episode_ids
        repeated = sorted(eid for eid, n in Counter(ids).items() if n > 1)
        if repeated:
            raise InvalidActionError(
                f"episode ids appear more than once: {repeated[:5]}; a group lists each "
                "episode once",
                code="duplicate_episodes",
            )
        limit = min(settings.max_group_size, MAX_GROUP)
        if len(ids) > limit:
            raise InvalidActionError(
                f"a group may have at most {limit} episodes (max_group_size "
                f"{settings.max_group_size}, the judge's own limit {MAX_GROUP}); this one "
                f"has {len(ids)}",
                code="group_too_large",
            )
        members = [await self._member(principal, eid) for eid in ids]  # 404s first, all
        keys = [m.key for m in members]
        if len(set(keys)) != len(keys):  # two spellings of one episode (admin: key and id)
            raise InvalidActionError(
                "two of the ids name the same episode; a group lists each episode once",
                code="duplicate_episodes",
            )
        digest = group_digest(request.scorer, keys)
        stored = await self._stored(digest)
        if stored is not None:
            return self._reply(stored, members, digest, stored=True)
        running = self._running.get(digest)
        if running is None:
            running = asyncio.get_running_loop().create_task(
                self._judge(request.scorer, members, digest), name=f"group-{digest[7:19]}"
            )
            self._running[digest] = running
            running.add_done_callback(lambda done: self._done(digest, done))
            self.manager.detach(running)  # judged to its end though the caller went away
            fresh = True
        else:
            fresh = False
        result = await asyncio.shield(running)
        return self._reply(result, members, digest, stored=not fresh)

    def _done(self, digest: str, task: asyncio.Task[dict[str, Any]]) -> None:
        """Forget a finished judging; its error is its callers' (retrieved here too, for a
        judging whose callers all went away)."""
        self._running.pop(digest, None)
        if not task.cancelled():
            task.exception()

    async def _member(self, principal: Principal, episode_id: str) -> Member:
        episode, key = await self.manager.owned(principal, episode_id)  # 404: not its own
        return Member(episode_id, key, episode)

    async def _stored(self, digest: str) -> dict[str, Any] | None:
        text = await self.manager.store.group_result(digest)
        return None if text is None else dict(json.loads(text))

    async def _judge(self, scorer: str, members: list[Member], digest: str) -> dict[str, Any]:
        episodes = [self._judgeable(m) for m in members]
        tasks = sorted({e.task.ref for e in episodes})
        if len(tasks) > 1:
            raise InvalidActionError(
                f"a group is the episodes of one task; these are of {len(tasks)}: {tasks[:5]}",
                code="mixed_tasks",
            )
        taken = await self.manager.store.groups_of(tuple(m.key for m in members))
        for member in members:
            if member.key in taken:
                raise ConflictError(
                    f"episode {member.wire_id} was judged in another group already "
                    f"({taken[member.key]}); an episode gets one group reward",
                    code="group_taken",
                )
        first = episodes[0]
        subjects: list[JudgedSubject] = []
        for episode in episodes:
            try:
                subject = episode.family.judged_subject(episode.ctx)
            except Exception as exc:
                log_crash(episode, f"family {episode.family.name} crashed in judged_subject", exc)
                raise ServerError(
                    f"family {episode.family.name!r} crashed giving its judged subject "
                    f"({type(exc).__name__}); a bug in the family"
                ) from None
            if subject is None:
                raise InvalidActionError(
                    f"family {episode.family.name!r} gives no judged subject "
                    "(Family.judged_subject): its episodes cannot be judged as a group",
                    code="not_judgeable",
                )
            subjects.append(subject)
        lead = subjects[0]
        sealed = first.task.sealed
        try:
            chat = self.manager.judges.get(lead.config.judge)
            verdict = await judge_group(chat, subjects, METHODS[scorer])
        except JudgeUnavailable as exc:
            why = "sealed split: reason withheld" if sealed else exc.reason
            log.warning("group %s: judge %s unavailable (%s)", digest, exc.endpoint, why)
            raise UnavailableError(
                f"judge {exc.endpoint!r} unavailable ({why}); nothing was stored: retry later",
                code="judge_unavailable",
            ) from None
        except ValueError as exc:  # subjects that differ: the family's judged_subject is wrong
            raise ServerError(
                f"family {first.family.name!r} described one task's episodes differently "
                f"({exc}); a bug in its judged_subject"
            ) from None
        scores = list(verdict.scores)
        if len(scores) != len(members) or not all(
            math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores
        ):
            raise ServerError(
                f"the {scorer} scorer gave {len(scores)} scores for {len(members)} "
                "candidates, or one outside [0, 1] (a bug in the scorer)"
            )
        result: dict[str, Any] = {
            "rewards": {m.key: s for m, s in zip(members, scores, strict=True)},
            "scorer": scorer,
            "method": verdict.method,
            "task": first.task.ref,
            "sealed": sealed,
            "judge": {
                "records": [r.as_dict() for r in verdict.records],
                "config_digest": lead.config.digest(lead.rubric),
                "rubric": lead.rubric.name,
                "inconsistent_pairs": verdict.inconsistent,
            },
        }
        try:
            await self.manager.store.put_group(
                digest,
                first.task.ref,
                scorer,
                verdict.method,
                first.owner or None,
                json.dumps(result),
                result["rewards"],
            )
        except IntegrityError:  # another process judged it (or one of its episodes) first
            stored = await self._stored(digest)
            if stored is None:
                raise ConflictError(
                    "an episode of this group was judged in another group meanwhile; an "
                    "episode gets one group reward",
                    code="group_taken",
                ) from None
            return stored
        for member, episode in zip(members, episodes, strict=True):
            episode.state.group_reward = GroupReward(
                reward=result["rewards"][member.key],
                scorer=scorer,
                method=verdict.method,
                group_digest=digest,
            )
        return result

    @staticmethod
    def _judgeable(member: Member) -> Episode:
        """The member's episode, ended with a verdict and not void; else 409 naming it."""
        episode, eid = member.episode, member.wire_id
        if episode is None:
            raise ConflictError(
                f"episode {eid} has ended but the server no longer holds it in memory (it "
                "keeps the most recent ended episodes, none across a restart): a group is "
                "judged from its episodes' final answers, so verify a group soon after its "
                "episodes end",
                code="episode_not_held",
            )
        status = episode.state.status
        if status is EpisodeStatus.ACTIVE:
            raise ConflictError(
                f"episode {eid} is still active; end it (submit, or POST "
                f"/v1/episodes/{eid}/verify) before judging its group",
                code="episode_active",
            )
        if status is EpisodeStatus.VOID:
            raise ConflictError(
                f"episode {eid} is void ({episode.state.void_reason}); leave it out of the "
                "group, as a trainer drops void episodes",
                code="episode_void",
            )
        if episode.state.verdict is None:
            raise ConflictError(
                f"episode {eid} ended ({status.value}) unverified; only verified episodes "
                "are judged as a group",
                code="episode_unverified",
            )
        return episode

    @staticmethod
    def _reply(
        result: dict[str, Any], members: list[Member], digest: str, *, stored: bool
    ) -> GroupVerifyResponse:
        rewards = result["rewards"]
        return GroupVerifyResponse(
            rewards={m.wire_id: float(rewards[m.key]) for m in members},
            scorer=result["scorer"],
            method=result["method"],
            judge={} if result.get("sealed") else result["judge"],
            group_digest=digest,
            stored=stored,
        )
