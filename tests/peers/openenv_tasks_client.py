"""openenv 0.10.0's own Task API client (`openenv.harbor.client.HarborEnv`, the one client
that package ships for `/{env}/splits|num_tasks|task|task_range`) and its EnvClient's task
selection, `reset(split=…, index=…)`, against a palaestra server's OpenEnv door. Run by
tests/server/doors/test_door_openenv.py with the peer's python:

    openenv_tasks_client.py URL PACK TRAIN_TOKEN EVAL_TOKEN

HarborEnv gives its HTTP client no headers (its server is open); the one line that adds
the bearer token to that client is the only thing this program sets on it. The last stdout
line is JSON with what came back.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
from openenv.core.generic_client import GenericEnvClient
from openenv.harbor.client import HarborEnv


def discovery(url: str, pack: str, token: str, sealed: str) -> dict[str, Any]:
    """Every Task API call of HarborEnv, on the pack's `train` split and a sealed one."""
    env = HarborEnv(base_url=f"{url}/openenv/{pack}")
    env._http.headers["Authorization"] = f"Bearer {token}"  # it has no header option
    try:
        out: dict[str, Any] = {"splits": env.splits(), "num_tasks": env.num_tasks("train")}
        out["task"] = env.get_task("train", 1).model_dump()
        out["range"] = [t.model_dump() for t in env.get_task_range("train", 0, 3)]
        out["sealed"] = [t.model_dump() for t in env.get_task_range(sealed, 0, 5)]
        try:
            env.get_task("train", -1)
            out["negative"] = "no error"
        except httpx.HTTPStatusError as exc:
            out["negative"] = {"status": exc.response.status_code, **exc.response.json()}
    finally:
        env.close()
    return out


def selected(url: str, pack: str, token: str, split: str, index: int) -> dict[str, Any]:
    """EnvClient's reset on the task the Task API lists at `index`, then its state."""
    base = f"{url}/openenv/{pack}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with GenericEnvClient(base_url=base, headers=headers).sync() as env:
            reset = env.reset(split=split, index=index)
            return {"observation": reset.observation, "state": env.state()}
    except Exception as exc:  # the client's own exception, whatever its class
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    url, pack, train, evaluator = sys.argv[1:5]
    out = {
        "train": discovery(url, pack, train, "heldout"),
        "eval": discovery(url, pack, evaluator, "heldout"),
        "picked": selected(url, pack, train, "train", 1),
        "sealed_picked_by_train": selected(url, pack, train, "heldout", 0),
        "sealed_picked_by_eval": selected(url, pack, evaluator, "heldout", 0),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
