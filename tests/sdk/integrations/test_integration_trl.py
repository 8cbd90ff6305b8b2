"""TRL: trl 1.16.0's own GRPOTrainer runs 2 real optimisation steps on CPU over palaestra
episodes through sdk/integrations/trl.py (a tiny random Qwen2 built in code, its own venv),
against a real `palaestra serve`; the episodes are then read back from the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.sdk.errors import AuthenticationError, NotFoundError, PermissionDeniedError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.integrations.trl import OVER, environment_factory, tool_method
from palaestra.sdk.models import ToolSpec
from tests.conftest import ServerProcess
from tests.peers import peer_python, run_peer
from tests.peers.our_side import sdk_env, train_token

pytestmark = pytest.mark.slow

TRL = (
    "torch==2.13.0",
    "trl==1.16.0",
    "transformers==5.24.0",
    "accelerate==1.15.0",
    "datasets==5.2.0",
    "httpx==0.28.1",
    "pydantic==2.14.4",
)
TASK = "palaestra/echo:say-birch"
SEALED = "palaestra/echo:say-apple"  # the heldout split of palaestra/echo is sealed


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def test_grpo_trainer_trains_on_palaestra_episodes(server: ServerProcess, tmp_path: Path) -> None:
    python = peer_python("trl", *TRL)
    token = train_token(server, "trl")
    env = {**sdk_env(tmp_path), "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    out = run_peer(python, "trl_train.py", server.url, token, TASK, env=env)

    assert out["steps"] == 2 and out["params_changed"] > 0
    assert all(norm > 0 for norm in out["grad_norms"]), out["grad_norms"]
    assert out["tools"] == ["echo", "submit"] and out["env_class"] == "PalaestraEchoEnv"
    assert out["tool_call_frequency"] == [2.0, 2.0]  # echo, then submit: multi-turn
    episodes = [e for batch in out["batches"] for e in batch["episodes"]]
    assert len(set(episodes)) == 8  # one episode per rollout, 4 rollouts a step
    for batch in out["batches"]:
        assert batch["rewards"] == [1.0, 0.0, 1.0, 0.0]
        assert batch["env_tokens_masked"] > 0 and batch["model_tokens"] > 0
        assert batch["advantages"][0] > 0 > batch["advantages"][1]

    # On the server: each rollout is a stored, ended, verified episode of the train token.
    rewards = [r for batch in out["batches"] for r in batch["rewards"]]
    with HTTPClient(server.url, token=token) as client:
        for episode, reward in zip(episodes, rewards, strict=True):
            state = client.state(episode)
            assert state.task.endswith(":say-birch") and state.ended_at is not None
            assert state.verdict is not None and state.verdict.reward == reward
            assert [s.action.tool for s in state.trajectory] == ["echo", "submit"]
    other = HTTPClient(server.url, token=train_token(server, "other"))
    with other, pytest.raises(NotFoundError):
        other.state(episodes[0])


def test_environment_refuses_bad_rows_sealed_tasks_and_bad_tokens(server: ServerProcess) -> None:
    token = train_token(server, "trl-bad")
    env_class = environment_factory(server.url, "echo", token=token)
    env = env_class()
    with pytest.raises(ValueError, match="needs a `task` column"):
        env.reset(prompt=[])
    with pytest.raises(PermissionDeniedError, match="sealed") as sealed:
        env.reset(task=SEALED)
    assert "elppa" not in str(sealed.value)
    with pytest.raises(RuntimeError, match="get_reward before reset"):
        env.get_reward()

    first = env.reset(task=TASK, seed=3)
    assert "birch" in first
    assert env.echo(text="hi") == "hi"  # type: ignore[attr-defined]
    assert env.submit(answer="nope") == "submitted"  # type: ignore[attr-defined]
    assert env.echo(text="again") == OVER  # type: ignore[attr-defined]
    assert env.get_reward() == 0.0

    with pytest.raises(ValueError, match="not served"):
        environment_factory(server.url, "no-such-family", token=token)
    with pytest.raises(AuthenticationError):
        environment_factory(server.url, "echo", token="not-a-token")
    with pytest.raises(ValueError, match="cannot be a TRL tool method"):
        tool_method(ToolSpec(name="get_reward", description="shadows the reward"))
