"""The Gymnasium vector env over the batch routes (sdk/integrations/gym_vector.py), against
a real `palaestra serve`: it matches Gymnasium's own SyncVectorEnv (SAME_STEP) over the
single env step for step, Gymnasium's vector wrappers and benchmark accept it, autoreset
and terminated/truncated hold step by step, and a 429 becomes a clear error."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ServerProcess
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.utils.performance import benchmark_vector_step
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics

from palaestra.sdk.errors import CapacityError
from palaestra.sdk.gym import PalaestraEnv
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.integrations.gym_vector import PalaestraVectorEnv

BIRCH = "palaestra/echo:say-birch"
COBALT = "palaestra/echo:say-cobalt"
LIMIT = {"max_steps": 3}


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def act(tool: str, **arguments: object) -> str:
    return json.dumps({"tool": tool, "arguments": arguments})


ECHO = act("echo", text="x")
RIGHT = {BIRCH: act("submit", answer="hcrib"), COBALT: act("submit", answer="tlaboc")}
WRONG = act("submit", answer="nope")


VARY = {"episode_id", "duration_s", "episode"}  # ids, timings, and RecordEpisodeStatistics'


def without_ids(infos: dict[str, Any]) -> dict[str, Any]:
    """The infos less what differs between two runs of the same episodes (ids, timings)."""
    return {
        k: without_ids(v) if isinstance(v, dict) else v
        for k, v in infos.items()
        if k.removeprefix("_") not in VARY
    }


def diff(a: Any, b: Any, at: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in set(a) | set(b) for d in diff(a.get(k), b.get(k), f"{at}.{k}")]
    return [] if data_equivalence(a, b) else [at]


def test_matches_gymnasiums_sync_vector_env(http: HTTPClient) -> None:
    tasks = [BIRCH, COBALT, BIRCH]
    ours = RecordEpisodeStatistics(PalaestraVectorEnv(http, tasks, options=LIMIT))
    theirs = SyncVectorEnv(
        [lambda t=t: PalaestraEnv(http, task=t, options=LIMIT) for t in tasks],  # type: ignore[misc]
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    assert ours.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert ours.single_observation_space == theirs.single_observation_space
    script = [
        (RIGHT[BIRCH], ECHO, "not json"),
        (ECHO, ECHO, WRONG),
        (ECHO, act("echo", text=5), ECHO),
        (ECHO, ECHO, ECHO),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a_obs, a_info = ours.reset(seed=3)
        b_obs, b_info = theirs.reset(seed=3)
        assert data_equivalence(a_obs, b_obs) and ours.observation_space.contains(a_obs)
        assert data_equivalence(without_ids(a_info), without_ids(b_info))
        for actions in script:
            a, b = ours.step(actions), theirs.step(actions)
            assert ours.observation_space.contains(a[0])
            for x, y in zip(a[:4], b[:4], strict=True):
                assert data_equivalence(x, y), (actions, x, y)
            x, y = without_ids(a[4]), without_ids(b[4])
            assert data_equivalence(x, y), diff(x, y)
    # Episode statistics as Gymnasium's wrapper counts them in SAME_STEP mode.
    assert list(ours.return_queue) == [1.0, 0.0, 0.0, 0.0]
    assert list(ours.length_queue) == [1, 2, 3, 4]
    ours.close()
    theirs.close()
    # Random actions (sampled text: not JSON) are no steps; Gymnasium's benchmark runs.
    bench = PalaestraVectorEnv(http, [BIRCH, BIRCH])
    assert benchmark_vector_step(bench, target_duration=0.2, seed=1) > 0
    assert all(http.state(e).step_count == 0 for e in bench.episode_ids if e)
    bench.close()


def test_autoreset_step_by_step(http: HTTPClient) -> None:
    envs = PalaestraVectorEnv(http, [BIRCH, COBALT, BIRCH], options={"max_steps": 2})
    obs, infos = envs.reset(seed=0)
    first = list(infos["episode_id"])
    assert "birch" in obs[0] and "cobalt" in obs[1] and len(set(first)) == 3
    assert infos["_episode_id"].all() and {t["name"] for t in infos["tools"][0]} >= {"submit"}

    # Step 1: sub-env 0 finishes (right answer); the others go on.
    obs, rewards, terminated, truncated, infos = envs.step((RIGHT[BIRCH], ECHO, ECHO))
    assert rewards.tolist() == [1.0, 0.0, 0.0]
    assert terminated.tolist() == [True, False, False] and not truncated.any()
    assert infos["_final_obs"].tolist() == [True, False, False]
    assert infos["final_info"]["verdict"]["passed"][0]
    assert infos["final_info"]["_verdict"].tolist() == [True, False, False]
    assert obs[0].startswith("Submit the word 'birch'") and obs[1:] == ("x", "x")
    restarted = infos["episode_id"][0]
    assert infos["_episode_id"].tolist() == [True, False, False] and restarted not in first
    assert envs.episode_ids == [restarted, first[1], first[2]]
    assert http.state(first[0]).status == "done" and http.state(restarted).status == "active"

    # Step 2: sub-env 1 hits its step limit (truncated), sub-env 2 answers wrong (terminated).
    obs, rewards, terminated, truncated, infos = envs.step((ECHO, ECHO, WRONG))
    assert terminated.tolist() == [False, False, True]
    assert truncated.tolist() == [False, True, False] and rewards.tolist() == [0.0] * 3
    assert "step limit of 2" in infos["final_obs"][1]
    assert not infos["final_info"]["verdict"]["passed"][2]
    cut, wrong = http.state(first[1]), http.state(first[2])
    assert (cut.status, cut.step_count) == ("done", 2) and cut.verdict is not None
    assert wrong.verdict is not None and wrong.verdict.reward == 0.0
    assert http.state(restarted).step_count == 1

    # reset_mask restarts sub-env 1 only; close() closes every episode it holds.
    before = list(envs.episode_ids)
    _, infos = envs.reset(options={"reset_mask": np.array([False, True, False])})
    assert infos["_episode_id"].tolist() == [False, True, False]
    assert envs.episode_ids[0] == before[0] and envs.episode_ids[1] != before[1]
    assert http.state(before[1]).status == "closed"
    held = [e for e in envs.episode_ids if e]
    envs.close()
    assert [http.state(e).status for e in held] == ["closed"] * 3
    with pytest.raises(RuntimeError, match="reset"):
        envs.step((ECHO,) * 3)


def test_bad_input_is_refused_clearly(http: HTTPClient) -> None:
    with pytest.raises(ValueError, match="at least one"):
        PalaestraVectorEnv(http, [])
    envs = PalaestraVectorEnv(http, [BIRCH, BIRCH])
    envs.reset()
    with pytest.raises(ValueError, match="one per sub-env"):
        envs.step((ECHO,))
    with pytest.raises(ValueError, match="reset_mask"):
        envs.reset(options={"reset_mask": [True, False]})
    envs.close()


def test_capacity_429_is_a_clear_error(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "data", args=["--max-episodes", "2"]).start()
    try:
        with proc.client() as client:
            envs = PalaestraVectorEnv(client, [BIRCH, BIRCH, BIRCH])
            with pytest.raises(CapacityError, match=r"sub-env \d could not start an episode") as e:
                envs.reset()
            assert e.value.retryable and e.value.retry_after is not None
            # The episodes that did start were closed: the capacity is free again.
            two = PalaestraVectorEnv(client, [BIRCH, COBALT])
            obs, _ = two.reset()
            assert "cobalt" in obs[1]
            two.close()
    finally:
        proc.stop()
