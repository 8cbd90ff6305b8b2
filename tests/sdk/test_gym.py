"""The Gymnasium wrapper (sdk/gym.py) over the in-process client and over HTTP."""

from __future__ import annotations

import json
import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from palaestra.sdk.client import Client
from palaestra.sdk.gym import PalaestraEnv
from palaestra.sdk.http import HTTPClient
from palaestra.server.inprocess import InProcessClient

ECHO = "palaestra/echo:say-birch"
HUMANEVAL = "openai/humaneval:HumanEval-1"


@pytest.fixture(params=["inproc", "http"])
def client(request: pytest.FixtureRequest) -> Client:
    chosen: Client = request.getfixturevalue(request.param)
    return chosen


def action(tool: str, **arguments: object) -> str:
    return json.dumps({"tool": tool, "arguments": arguments})


@pytest.mark.parametrize("task", [ECHO, HUMANEVAL])
def test_check_env(client: Client, task: str) -> None:
    env = PalaestraEnv(client, task=task)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    problems = [str(w.message) for w in caught]
    assert not problems, problems
    episode = env.episode_id
    env.close()
    if episode is not None:
        assert client.state(episode).status == "closed"


def test_full_echo_episode(client: Client) -> None:
    env = PalaestraEnv(client, task=ECHO, render_mode="ansi")
    obs, info = env.reset(seed=1)
    assert "birch" in obs and env.observation_space.contains(obs)
    assert {t["name"] for t in info["tools"]} == {"echo", "submit"}
    episode = info["episode_id"]

    obs, reward, terminated, truncated, _ = env.step(action("echo", text="birch"))
    assert (obs, reward, terminated, truncated) == ("birch", 0.0, False, False)
    assert env.render() == "birch"

    obs, reward, terminated, truncated, info = env.step(action("submit", answer="hcrib"))
    assert reward == 1.0 and terminated and not truncated
    assert info["verdict"]["passed"] is True and info["status"] == "done"
    state = client.state(episode)
    assert state.status == "done" and state.step_count == 2
    with pytest.raises(RuntimeError):
        env.step(action("echo", text="after the end"))

    # A wrong answer scores 0, through a second reset of the same env.
    env.reset()
    _, reward, terminated, _, info = env.step(action("submit", answer="birch"))
    assert reward == 0.0 and terminated and info["verdict"]["passed"] is False
    env.close()


@pytest.mark.parametrize(
    "bad",
    [
        "not json at all",
        "[1, 2, 3]",
        '"a string"',
        '{"tool": "no_such_tool", "arguments": {}}',
        '{"tool": "echo", "arguments": {"text": 5}}',
        '{"tool": "echo", "arguments": {"text": "x", "extra": 1}}',
        '{"arguments": {}}',
    ],
)
def test_invalid_action_does_not_end_episode(client: Client, bad: str) -> None:
    env = PalaestraEnv(client, task=ECHO)
    _, info = env.reset()
    episode = info["episode_id"]
    obs, reward, terminated, truncated, step_info = env.step(bad)
    assert obs.startswith("invalid action") and '"tool"' in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert step_info == {"invalid_action": True}
    state = client.state(episode)
    assert state.status == "active" and state.step_count == 0
    _, reward, terminated, _, _ = env.step(action("submit", answer="hcrib"))
    assert reward == 1.0 and terminated
    env.close()


def test_reset_closes_previous_episode(inproc: InProcessClient) -> None:
    env = PalaestraEnv(inproc, task=ECHO)
    _, info = env.reset()
    first = info["episode_id"]
    env.step(action("echo", text="x"))
    _, info = env.reset()
    assert info["episode_id"] != first
    assert inproc.state(first).status == "closed"
    env.close()
    assert inproc.state(info["episode_id"]).status == "closed"


def test_humaneval_episodes_over_http(http: HTTPClient) -> None:
    env = PalaestraEnv(http, task=HUMANEVAL)
    obs, info = env.reset()
    assert "separate_paren_groups" in obs
    assert {t["name"] for t in info["tools"]} == {"write_file", "run_python", "run_tests", "submit"}
    _, reward, terminated, _, _ = env.step(
        action(
            "write_file",
            path="solution.py",
            content="def separate_paren_groups(s):\n    return []\n",
        )
    )
    assert not terminated and reward == 0.0
    obs, _, terminated, _, _ = env.step(action("run_python", code="print(2 + 2)"))
    assert "4" in obs and not terminated
    _, reward, terminated, _, info = env.step(action("submit"))
    assert terminated and reward < 1.0 and info["verdict"]["passed"] is False

    # Reset options reach the server: an oracle-driven episode scores 1.0.
    oracle = PalaestraEnv(http, task=HUMANEVAL, options={"oracle": True})
    oracle.reset()
    _, reward, terminated, _, _ = oracle.step(action("oracle"))
    assert reward == 0.0 and not terminated
    _, reward, terminated, _, info = oracle.step(action("oracle"))
    assert reward == 1.0 and terminated and info["verdict"]["passed"] is True
    oracle.close()
    env.close()
