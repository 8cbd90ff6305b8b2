"""Operator ceilings: no limit a client or a task asks for escapes validation or the ceiling.

Before: `options.max_steps` went through `int()` (1e308 became a 300-digit step limit,
"inf" an OverflowError: a 500), `max_wall_s` took NaN and infinity, a task's `memory_mb`
reached the sandbox as asked (a billion MB, or NaN: `int()` raised, a 500), and nothing
capped any of them. Now each is a 422 in the contract's error shape that names the limit
(and, over a ceiling, the ceiling), on the single route and per item of a batch reset; a
task limit that is no finite number is refused earlier, when its pack loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.server.config import REPO_PACKS, Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.loader import load_pack
from palaestra.server.packs.manifest import PackError

ECHO = "palaestra/echo:say-birch"

BAD_OPTIONS: list[tuple[str, Any, str]] = [
    ("max_steps", 1e308, "ceiling_steps"),
    ("max_steps", 10**400, "ceiling_steps"),
    ("max_steps", 10**6, "ceiling_steps"),
    ("max_steps", "inf", "JSON number"),
    ("max_steps", "10", "JSON number"),
    ("max_steps", -3, "positive"),
    ("max_steps", 0, "positive"),
    ("max_steps", 2.5, "whole number"),
    ("max_steps", True, "JSON number"),
    ("max_steps", [1], "JSON number"),
    ("max_wall_s", "NaN", "JSON number"),
    ("max_wall_s", 1e308, "ceiling_wall_s"),
    ("max_wall_s", -1.0, "positive"),
    ("step_timeout_s", 1e9, "ceiling_step_timeout_s"),
    ("max_output_bytes", 2**62, "ceiling_output_bytes"),
    ("max_episode_output_bytes", 10**30, "ceiling_episode_output_bytes"),
]
# JSON has no NaN or infinity, but Python's json (and many clients) write them anyway.
RAW_OPTIONS = [
    ('{"max_steps": NaN}', "finite"),
    ('{"max_wall_s": Infinity}', "finite"),
    ('{"max_wall_s": -Infinity}', "finite"),
    ('{"max_steps": 1e999}', "finite"),
]
RAW_BODIES = [('{"task": "' + ECHO + '", "options": ' + o + "}", w) for o, w in RAW_OPTIONS]


def assert_refused(status: int, error: dict[str, Any], name: str, words: str) -> None:
    assert status == 422, (status, error)
    assert set(error) >= {"code", "message", "retryable"}, error
    assert error["code"] in {"invalid_limit", "limit_over_ceiling"}, error
    assert name in error["message"] and words in error["message"], error["message"]
    assert error["retryable"] is False


@pytest.mark.parametrize(("key", "value", "words"), BAD_OPTIONS, ids=lambda v: repr(v)[:20])
async def test_bad_limit_options_are_422_naming_the_limit(
    api: httpx.AsyncClient, key: str, value: Any, words: str
) -> None:
    body = {"task": ECHO, "options": {key: value}}
    reply = await api.post("/v1/episodes", json=body)
    assert_refused(reply.status_code, reply.json()["error"], f"options.{key}", words)
    batch = await api.post("/v1/batch/reset", json={"items": [body, {"task": ECHO}]})
    assert batch.status_code == 200, batch.text
    first, second = batch.json()["items"]
    error = first["error"]
    assert_refused(error["status"], error, f"options.{key}", words)
    assert second["result"]["episode_id"]  # the good item of the same batch is served


@pytest.mark.parametrize(("raw", "words"), RAW_BODIES)
async def test_nan_and_infinity_literals_are_422(
    api: httpx.AsyncClient, raw: str, words: str
) -> None:
    headers = {"content-type": "application/json"}
    reply = await api.post("/v1/episodes", content=raw, headers=headers)
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert set(error) == {"code", "message", "retryable"}
    assert "max_" in error["message"]


async def test_limits_within_the_ceiling_are_served(api: httpx.AsyncClient) -> None:
    options = {"max_steps": 7, "max_wall_s": 60.5}
    reply = await api.post("/v1/episodes", json={"task": ECHO, "options": options})
    assert reply.status_code == 200, reply.text
    limits = reply.json()["limits"]
    assert limits["max_steps"] == 7 and limits["max_wall_s"] == 60.5


# -- task-supplied limits -----------------------------------------------------------------
def terminal_task(task_id: str, **public: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "family": "terminal",
        "split": "train",
        "public": {"instruction": "touch done", **public},
        "private": {"verifier": {"test.sh": "test -f done"}},
    }


BAD_TASKS = {
    "huge-memory": ({"memory_mb": 10**9}, "public.memory_mb", "ceiling_memory_mb"),
    "neg-workspace": ({"workspace_mb": -64}, "public.workspace_mb", "positive"),
    "str-workspace": ({"workspace_mb": "64"}, "public.workspace_mb", "JSON number"),
    "huge-setup": ({"setup_timeout_s": 1e12}, "public.setup_timeout_s", "ceiling_task_timeout_s"),
    "many-pids": ({"pids": 10**7}, "public.pids", "ceiling_pids"),
}


# Not a number at all: the family's field model refuses the task when its pack loads.
MALFORMED_TASKS = {
    "nan-memory": ({"memory_mb": float("nan")}, "public.memory_mb", "finite"),
    "inf-pids": ({"pids": float("inf")}, "public.pids", "finite"),
}


def test_non_finite_task_limits_are_refused_when_the_pack_loads(tmp_path: Path) -> None:
    root = tmp_path / "malformed"
    root.mkdir()
    (root / "pack.toml").write_text(
        'name = "acme/malformed"\nversion = "1.0.0"\n\n[splits.train]\nsealed = false\n'
    )
    lines = [terminal_task(name, **fields) for name, (fields, _, _) in MALFORMED_TASKS.items()]
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    with pytest.raises(PackError) as refused:
        load_pack(root, FamilyRegistry.discover().all())
    for task_id, (_, field, words) in MALFORMED_TASKS.items():
        line = next(p for p in refused.value.problems if task_id in p)
        assert "acme/malformed" in line and field in line and words in line, line


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The echo pack and a pack of terminal tasks whose own limits attack the server."""
    packs = tmp_path / "packs"
    shutil.copytree(REPO_PACKS / "echo", packs / "echo")
    evil = packs / "evil"
    evil.mkdir()
    (evil / "pack.toml").write_text(
        'name = "acme/limits"\nversion = "1.0.0"\nfamilies = ["terminal"]\n\n'
        "[splits.train]\nsealed = false\n"
    )
    lines = [terminal_task(name, **fields) for name, (fields, _, _) in BAD_TASKS.items()]
    (evil / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    return Settings(data_dir=tmp_path / "data", packs_dirs=[packs], pool_size=0)


@pytest.mark.parametrize("task_id", sorted(BAD_TASKS))
async def test_task_limits_over_the_ceiling_are_refused_at_reset(
    api: httpx.AsyncClient, task_id: str
) -> None:
    _, field, words = BAD_TASKS[task_id]
    reply = await api.post("/v1/episodes", json={"task": f"acme/limits:{task_id}"})
    error = reply.json()["error"]
    assert_refused(reply.status_code, error, field, words)
    assert f"acme/limits@1.0.0:{task_id}" in error["message"]  # names the task


def test_ceilings_are_settings_and_defaults_fit_them() -> None:
    with pytest.raises(ValueError, match="ceiling"):
        Settings(max_steps=100, ceiling_steps=10)
    with pytest.raises(ValueError):
        Settings(ceiling_wall_s=float("inf"))
    assert Settings(ceiling_memory_mb=256).ceiling_memory_mb == 256
