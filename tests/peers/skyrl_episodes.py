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


def hermes(name: str, arguments: dict[str, object], think: str = "") -> str:
    """A turn as a Qwen model writes a tool call (Hermes' tags, `name` not `tool`)."""
    call = json.dumps({"name": name, "arguments": arguments})
    return f"{think}<tool_call>\n{call}\n</tool_call>"


def hermes_turns(url: str, token: str, task: str, answer: str) -> dict[str, object]:
    """Qwen-style turns: a thought then a call, two calls at once, a call with no name,
    an unclosed call (a stop string ate the tag), then the answer."""
    env = skyrl_gym.make(
        "palaestra",
        env_config={"base_url": url, "token": token, "max_turns": 8},
        extras={"task": task, "seed": 2},
    )
    prompt, info = env.init([])
    turns = [
        hermes("echo", {"text": "qwen"}, think="<think>I should call {echo} first.</think>\n"),
        hermes("echo", {"text": "a"}) + hermes("echo", {"text": "b"}),
        '<tool_call>{"arguments": {"text": "nameless"}}</tool_call>',
        '<tool_call>\n{"name": "echo", "arguments": {"text": "unclosed"}}\n',
        hermes("submit", {"answer": answer}),
    ]
    outputs = [env.step(text) for text in turns]
    env.close()
    return {
        "episode_id": info["episode_id"],
        "instructions": prompt[-1]["content"],
        "observations": [o["observations"] for o in outputs],
        "rewards": [o["reward"] for o in outputs],
        "dones": [o["done"] for o in outputs],
    }


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
        hermes("submit", {"answer": answer}),  # as Qwen writes a tool call
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
    out = {"episodes": episodes, "aggregate": metrics, "missing_task": missing, "sealed": refused}
    out["hermes"] = hermes_turns(url, token, task, answer)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
