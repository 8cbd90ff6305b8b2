"""The failure vocabulary (sdk/failures.py): every kind has a boundary and a NeMo Gym name,
every shared failure class is an agent kind, and the boundary cannot contradict the kind."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from palaestra.sdk.failures import (
    BOUNDARIES,
    NEMO_GYM,
    Boundary,
    Failure,
    FailureKind,
    is_infrastructure,
    kind_of_class,
)
from palaestra.sdk.models import FAILURE_CLASSES, EpisodeState, Verdict

# NeMo Gym 0.7.0's registered names (nemo_gym/failure_kinds.py FAILURE_KINDS).
NEMO_GYM_07 = {
    "transport_unreachable",
    "transport_peer_drop",
    "transport_timeout",
    "transport_local_resource",
    "agent_run_error",
    "agent_request_failed",
    "agent_timeout",
    "agent_command_not_allowed",
    "judge_failed",
    "judge_unparseable",
    "verifier_error",
    "provider_unavailable",
    "provider_quota_exhausted",
    "provider_oom_killed",
    "session_lost",
    "session_expired",
    "session_release_failed",
    "cancelled",
    "kill_shaped",
    "shutdown",
    "persistence_failed",
    "cohort_incomplete",
}


def test_the_vocabulary_is_small_and_complete() -> None:
    assert 10 <= len(FailureKind) <= 15
    assert set(BOUNDARIES) == set(FailureKind) == set(NEMO_GYM)
    assert {b for b in BOUNDARIES.values()} == set(Boundary)


def test_every_nemo_gym_name_is_registered_or_namespaced() -> None:
    for kind, name in NEMO_GYM.items():
        if name is None:
            assert not is_infrastructure(kind), kind  # NeMo Gym scores it: an agent kind
        elif ":" in name:
            assert name == f"palaestra:{kind.value}"
        else:
            assert name in NEMO_GYM_07, name


def test_failure_classes_are_agent_kinds_never_void() -> None:
    for failure_class in FAILURE_CLASSES:
        kind = kind_of_class(failure_class)
        assert BOUNDARIES[kind] is Boundary.AGENT and not is_infrastructure(kind)
    assert kind_of_class("a_family_own_class") is FailureKind.BAD_ANSWER
    assert kind_of_class("missing_file") is FailureKind.NO_ANSWER
    assert kind_of_class("oom") is FailureKind.AGENT_RESOURCES


def test_infrastructure_is_every_boundary_but_the_agent() -> None:
    for kind, boundary in BOUNDARIES.items():
        assert is_infrastructure(kind) == (boundary is not Boundary.AGENT)
    assert is_infrastructure("sandbox_failed") and not is_infrastructure("agent_crash")


def test_the_boundary_follows_from_the_kind() -> None:
    failure = Failure.model_validate({"kind": "worker_lost", "exit_code": 137, "reason": "x"})
    assert failure.boundary is Boundary.SERVER and failure.infrastructure
    with pytest.raises(ValidationError, match="boundary"):
        Failure.model_validate({"kind": "worker_lost", "boundary": "agent"})
    with pytest.raises(ValidationError):
        Failure.model_validate({"kind": "not_a_kind"})
    with pytest.raises(ValidationError):
        Failure.model_validate({"kind": "judge_unavailable", "status": 42})
    assert Failure.model_validate_json(failure.model_dump_json()) == failure


def test_agent_failure_names_its_class_only() -> None:
    failure = Failure.of_class("load_error")
    assert failure.kind is FailureKind.BAD_ANSWER and failure.reason == "load_error"
    assert failure.failure_class == "load_error"


def test_wire_models_carry_it_and_stay_backward_compatible() -> None:
    """Old payloads (no failure fields) still validate; new ones round-trip."""
    old = {"reward": 0.0, "passed": False, "verifier": {"name": "v", "version": "1"}}
    assert Verdict.model_validate(old).failure_kind is None
    state = EpisodeState.model_validate(
        {
            "episode_id": "e",
            "task": "t",
            "family": "f",
            "status": "void",
            "step_count": 1,
            "created_at": 0.0,
            "updated_at": 0.0,
            "failure": {"kind": "sandbox_failed", "reason": "sandbox failed: gone"},
        }
    )
    assert state.failure is not None and state.failure.boundary is Boundary.SANDBOX
    again = EpisodeState.model_validate_json(state.model_dump_json())
    assert again.failure == state.failure
