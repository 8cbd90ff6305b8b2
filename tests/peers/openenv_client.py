"""openenv 0.10.0's own EnvClient (GenericEnvClient over its default WebSocket) against a
palaestra server's OpenEnv door. Run by tests/server/doors/test_door_openenv.py with the
peer's python:

    openenv_client.py URL PLAN.json

PLAN names the tokens and tasks; the last stdout line is JSON with what came back.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.generic_client import GenericEnvClient
from websockets.sync.client import connect


def result(step: StepResult[Any]) -> dict[str, Any]:
    return {
        "observation": step.observation,
        "reward": step.reward,
        "done": step.done,
        "metadata": step.metadata,
    }


def client(url: str, pack: str, token: str) -> Any:
    base = f"{url}/openenv/{pack}"
    return GenericEnvClient(base_url=base, headers={"Authorization": f"Bearer {token}"}).sync()


def run_episode(url: str, token: str, pack: str, task: str, actions: list[Any]) -> dict[str, Any]:
    """reset(task=...), each action, state(): every answer as EnvClient parsed it."""
    with client(url, pack, token) as env:
        out: dict[str, Any] = {"reset": result(env.reset(task=task, seed=0))}
        out["state_after_reset"] = env.state()
        out["steps"] = [result(env.step(action)) for action in actions]
        out["state"] = env.state()
    return out


def refused(url: str, token: str) -> str:
    """The error EnvClient raises when the server refuses the session."""
    try:
        with client(url, "palaestra/echo", token) as env:
            env.reset(task="say-birch")
    except Exception as exc:  # the client's own exception, whatever its class
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def raw_frames(url: str, token: str, frames: list[str]) -> list[Any]:
    """Frames EnvClient never sends (mcp, unknown types, bad JSON), on the same socket."""
    ws_url = url.replace("http://", "ws://") + "/openenv/palaestra/echo/ws"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        answers = []
        for frame in frames:
            ws.send(frame)
            answers.append(json.loads(ws.recv(timeout=30)))
        ws.send(json.dumps({"type": "close"}))
    return answers


def main() -> None:
    url, plan_path = sys.argv[1], sys.argv[2]
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    out: dict[str, Any] = {"episodes": {}}
    for label, spec in plan["episodes"].items():
        out["episodes"][label] = run_episode(
            url, spec["token"], spec["pack"], spec["task"], spec["actions"]
        )
    out["refused"] = {label: refused(url, token) for label, token in plan["refused"].items()}
    out["raw"] = raw_frames(url, plan["raw_token"], plan["raw_frames"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
