"""The verl agent loop (sdk/integrations/verl.py) run by verl 0.9.1's own AgentLoopWorker,
in verl's venv, against a real `palaestra serve`: multi-turn episodes through forced tool
calls scored by a tiny random Qwen2, environment tokens masked, the verdict as reward, the
episodes stored server-side under the token that played them, and three GRPO steps with
verl's own advantage and policy loss on the rollouts."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess

from tests.peers import peer_python, run_peer
from tests.peers.our_side import sdk_env, train_token

pytestmark = pytest.mark.slow

VERL = (
    "torch==2.13.0",
    "verl==0.9.1",
    "cachetools==8.0.2",
    "uvicorn==0.54.0",
    "fastapi==0.165.0",
    "httpx==0.28.1",
)
BIRCH, COBALT = "palaestra/echo:say-birch", "palaestra/echo:say-cobalt"


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def test_verl_agent_loop_worker_plays_palaestra_episodes(
    server: ServerProcess, tmp_path: Path
) -> None:
    python = peer_python("verl", *VERL)
    token = train_token(server, "verl-rollouts")
    other = train_token(server, "verl-other")
    env = sdk_env(tmp_path)
    out = run_peer(
        python,
        "verl_loop.py",
        server.url,
        token,
        f"{BIRCH}:hcrib",
        f"{COBALT}:wrong",
        env=env,
        timeout=600,
    )
    rows = {r["task"]: r for r in out["trajectories"]}
    assert out["generate_calls"] == 4  # two turns a trajectory: echo, then submit
    # verl's GRPO advantage and policy loss on these rollouts: the fresh policy's log-probs
    # equal the rollout's on the model's tokens (tokens and masks line up), and three steps
    # raise the rewarded trajectory's log-probs and lower the other's.
    training = out["training"]
    assert training["rollout_logprob_gap"] < 1e-4 and len(training["losses"]) == 3
    assert [r["task"] for r in out["trajectories"]] == [BIRCH, COBALT]
    rewarded, failed = training["own_logprob_moved"]
    assert rewarded > 0 > failed
    refused = out["refused"]
    assert refused["no_task"].startswith("ValueError") and "extra_info.task" in refused["no_task"]
    assert refused["sealed"].startswith("PermissionDeniedError") and "sealed" in refused["sealed"]
    for task, reward in ((BIRCH, 1.0), (COBALT, 0.0)):
        row = rows[task]
        assert row["reward"] == reward
        mask, response = row["response_mask"], row["response_ids"]
        assert len(mask) == len(response) == row["logprobs"] and row["num_turns"] == 4
        # Model tokens, then the environment's (masked 0), then model tokens again.
        assert mask[0] == 1 and mask[-1] == 1 and 0 in mask
        first_zero, last_zero = mask.index(0), len(mask) - 1 - mask[::-1].index(0)
        assert set(mask[first_zero : last_zero + 1]) == {0}
        assert '"name": "echo"' in row["model_text"] and '"name": "submit"' in row["model_text"]
        word = task.rsplit("say-", 1)[1]
        assert "<tool_response>" in row["env_text"] and word in row["env_text"]
        assert "<tool_response>" not in row["model_text"]
        # Stored server-side under the rollout token, with the verdict the loop reported.
        state = httpx.get(
            f"{server.url}/v1/episodes/{row['episode_id']}",
            headers={"authorization": f"Bearer {token}"},
        ).json()
        assert state["status"] == "done" and state["step_count"] == 2
        assert state["verdict"]["reward"] == reward
        assert [s["action"]["tool"] for s in state["trajectory"]] == ["echo", "submit"]
        # Another token does not see it (404, as for an unknown id).
        seen = httpx.get(
            f"{server.url}/v1/episodes/{row['episode_id']}",
            headers={"authorization": f"Bearer {other}"},
        )
        assert seen.status_code == 404
