"""The NeMo Gym door's session book (server/doors/nemo_gym.py `Sessions`), in process: its
caps answer 429 and never end another session, closed ids refuse late seeds, boundedly;
and the verdict's failure kind as NeMo Gym names it."""

from __future__ import annotations

import pytest

from palaestra.sdk.errors import CapacityError, ConflictError
from palaestra.sdk.failures import FailureKind
from palaestra.sdk.models import Verdict
from palaestra.server.doors.nemo_gym import (
    CLOSED_KEPT,
    SeedRequest,
    Sessions,
    aggregate,
    failure_kind,
)


def seed(sid: str, rollout: str = "r") -> SeedRequest:
    return SeedRequest.model_validate(
        {
            "resources_session_id": sid,
            "episode_id": {"rollout_id": rollout},
            "task_id": {"taskset": "palaestra/echo", "task_id": "say-birch"},
            "task_data": {},
        }
    )


async def test_a_repeated_seed_is_the_session_and_a_conflicting_one_409() -> None:
    book = Sessions(per_token=4, limit=8, ttl_s=60)
    first, new = book.claim("a", seed("s1"))
    again, new_again = book.claim("a", seed("s1"))
    assert new and not new_again and again is first
    with pytest.raises(ConflictError, match="another episode"):
        book.claim("a", seed("s1", rollout="other"))
    other, new_other = book.claim("b", seed("s1"))  # another token's id space
    assert new_other and other is not first
    assert book.total == 2


async def test_caps_refuse_and_never_end_another_session() -> None:
    book = Sessions(per_token=2, limit=3, ttl_s=60)
    book.claim("a", seed("1"))
    book.claim("a", seed("2"))
    with pytest.raises(CapacityError, match="ors_sessions_per_token"):
        book.claim("a", seed("3"))
    book.claim("b", seed("1"))
    with pytest.raises(CapacityError, match="ors_sessions_max"):
        book.claim("c", seed("1"))
    assert book.seeded("a", "1") is not None and book.seeded("b", "1") is not None
    book.close("a", "1")  # a close frees a place
    book.claim("c", seed("1"))
    assert book.total == 3


async def test_closed_ids_refuse_late_seeds_and_are_bounded() -> None:
    book = Sessions(per_token=1, limit=8, ttl_s=60)
    assert book.close("a", "never-seeded") is None  # NeMo Gym: a close of an unknown id is fine
    with pytest.raises(ConflictError, match="seed after close"):
        book.claim("a", seed("never-seeded"))
    for n in range(CLOSED_KEPT + 3):
        book.close("a", f"c{n}")
    book.claim("a", seed("never-seeded"))  # remembered no longer: CLOSED_KEPT per token
    with pytest.raises(ConflictError):
        book.claim("a", seed(f"c{CLOSED_KEPT + 2}"))


async def test_idle_sessions_count_as_closed_at_the_cap() -> None:
    book = Sessions(per_token=1, limit=8, ttl_s=0.0)
    book.claim("a", seed("1"))
    book.claim("a", seed("2"))  # the first was idle past the TTL: swept, closed
    with pytest.raises(ConflictError, match="closed"):
        book.claim("a", seed("1"))


def verdict(status: str, kind: FailureKind | None, failure: str | None = None) -> Verdict:
    return Verdict.model_validate(
        {
            "reward": 0.0,
            "passed": False,
            "status": status,
            "failure": failure,
            "failure_kind": kind,
            "verifier": {"name": "v", "version": "1"},
        }
    )


def test_failure_kinds_go_out_by_nemo_gyms_names() -> None:
    assert failure_kind(verdict("ok", None)) is None
    assert failure_kind(verdict("ok", FailureKind.NO_ANSWER, "no_answer")) is None  # a scored 0
    assert failure_kind(verdict("ok", FailureKind.AGENT_TIMEOUT, "timeout")) == "agent_timeout"
    assert failure_kind(verdict("void", FailureKind.SANDBOX_FAILED)) == "provider_unavailable"
    assert failure_kind(verdict("void", FailureKind.ENV_CRASHED)) == "palaestra:env_crashed"


def test_aggregate_metrics_leave_masked_samples_out_of_the_mean() -> None:
    rows = [
        {"_ng_task_index": 0, "reward": 1.0},
        {"_ng_task_index": 0, "reward": 0.0},
        {"_ng_task_index": 1, "reward": 0.0, "mask_sample": True, "failure_kind": "verifier_error"},
    ]
    got = aggregate(rows)
    assert got.agent_metrics == {
        "mean/reward": 0.5,
        "num_samples": 3,
        "num_masked": 1,
        "failure_kind/verifier_error": 1,
    }
    assert got.key_metrics == {"mean/reward": 0.5}
    assert [g["mean/reward"] for g in got.group_level_metrics] == [0.5, None]
