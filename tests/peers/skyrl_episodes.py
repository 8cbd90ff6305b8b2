"""SkyRL's side: register palaestra's BaseTextEnv, `skyrl_gym.make` it, play scripted turns.

skyrl-gym ships no trainer, so the model's turns are scripted texts (a bad one, an echo, a
submit). Usage: skyrl_episodes.py URL TOKEN TASK ANSWER SEALED_TASK. Last stdout line: JSON.
"""

from __future__ import annotations

import json
import sys

import skyrl_gym

from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.integrations.skyrl import PalaestraTextEnv, register


def play(url: str, token: str, task: str, answer: str, seed: int) -> dict[str, object]:
    env = skyrl_gym.make(
        "palaestra",
        env_config={"base_url": url, "token": token, "max_turns": 5},
        extras={"task": task, "seed": seed},
    )
    assert isinstance(env, PalaestraTextEnv)
    prompt, info = env.init([{"role": "system", "content": "You are a careful agent."}])
    turns = [
        "I think the answer is probably something",  # no JSON: an error reply, not the end
        json.dumps({"tool": "echo", "arguments": {"text": "hello"}}),
        json.dumps({"tool": "submit", "arguments": {"answer": answer}}),
    ]
    outputs = [env.step(text) for text in turns]
    metrics = env.get_metrics()
    env.close()
    return {
        "episode_id": info["episode_id"],
        "prompt_roles": [m["role"] for m in prompt],
        "prompt_has_tools": '"submit"' in prompt[-1]["content"],
        "observations": [o["observations"] for o in outputs],
        "rewards": [o["reward"] for o in outputs],
        "dones": [o["done"] for o in outputs],
        "metrics": metrics,
    }


def main() -> None:
    url, token, task, answer, sealed = sys.argv[1:6]
    register()
    episodes = [play(url, token, task, answer if seed == 0 else "wrong", seed) for seed in (0, 1)]
    try:
        skyrl_gym.make("palaestra", env_config={"base_url": url}, extras={})
        missing = ""
    except ValueError as exc:
        missing = str(exc)
    env = skyrl_gym.make(
        "palaestra", env_config={"base_url": url, "token": token}, extras={"task": sealed}
    )
    try:
        env.init([])
        refused = ""
    except PalaestraError as exc:
        refused = f"{type(exc).__name__}: {exc}"
    metrics = PalaestraTextEnv.aggregate_metrics([e["metrics"] for e in episodes])
    print(
        json.dumps(
            {"episodes": episodes, "aggregate": metrics, "missing_task": missing, "sealed": refused}
        )
    )


if __name__ == "__main__":
    main()
