"""The light install: `pip install palaestra` (and `palaestra[gym]`) into a fresh venv, from
a wheel of this checkout and its dependencies' wheels (tests/sdk/wheelhouse.py, no
registry), holds no server dependency and plays real episodes against a real
`palaestra serve` with that venv's own client, policies, TRL adapter and Gymnasium envs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerProcess
from tests.sdk.wheelhouse import wheelhouse

pytestmark = pytest.mark.slow  # builds a wheel and two venvs: ~40 s on 2 cores

HERE = Path(__file__).resolve().parent
PIP = [sys.executable, "-m", "pip"]
HUMANEVAL = "openai/humaneval:HumanEval-1"
BIRCH = "palaestra/echo:say-birch"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheelhouse")
    return wheelhouse(base / "wheels", base / "scratch", extras=["gym"])


def make_venv(where: Path, wheels: Path, requirement: str) -> Path:
    """A fresh venv (no pip of its own: this venv's pip installs into it) with `requirement`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    offline = ["--no-index", "--find-links", str(wheels)]
    done = subprocess.run(
        [*PIP, "--python", str(python), "install", "-q", *offline, requirement],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return python


@pytest.fixture(scope="module")
def server(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' and adapters' tests (tests/conftest.py)


@pytest.fixture(scope="module")
def core(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield make_venv(tmp_path_factory.mktemp("light") / "venv", wheels, "palaestra")


def run_light(python: Path, mode: str, server: ServerProcess) -> dict[str, Any]:
    """tests/sdk/light_sdk.py with the light venv's python, outside this checkout (so the
    palaestra it imports is the installed one)."""
    done = subprocess.run(
        [str(python), str(HERE / "light_sdk.py"), mode, server.url, server.token or ""],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=python.parent,
        env={"PATH": "/usr/bin:/bin", "HOME": str(python.parents[1])},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_light_install_plays_episodes_without_the_server(core: Path, server: ServerProcess) -> None:
    out = run_light(core, "core", server)

    installed = out["installed"]
    assert installed["palaestra_at"].startswith(str(core.parents[1])), installed
    assert installed["server_only_installed"] == [], installed
    # Every sdk module imports, save those that need their extra: the Gymnasium envs
    # (palaestra[gym]), the trainer's torch modules (palaestra[train]) and the adapters
    # whose peer lives in the trainer's venv.
    assert installed["import_failures"] == {
        "palaestra.sdk.gym": "gymnasium",
        "palaestra.sdk.integrations.gym_vector": "numpy",
        "palaestra.sdk.integrations.skyrl": "skyrl_gym",
        "palaestra.sdk.integrations.tinker": "chz",
        "palaestra.sdk.integrations.verl": "verl",
        "palaestra.sdk.train.grpo": "torch",
        "palaestra.sdk.train.letters_demo": "torch",
        "palaestra.sdk.train.openai_server": "fastapi",
        "palaestra.sdk.train.trainer": "torch",
    }

    right, wrong = out["right"], out["wrong"]
    assert right["tools"] == ["echo", "submit"] and right["echoed"] == "hi"
    assert right["terminated"] and right["reward"] == 1.0 and right["verdict"] == 1.0
    assert wrong["terminated"] and wrong["reward"] == 0.0 and wrong["verdict"] == 0.0
    assert out["eval"] == {
        "oracle": [[HUMANEVAL, "ok", True], [BIRCH, "ok", True]],
        "null": [[HUMANEVAL, "ok", False], [BIRCH, "ok", False]],
    }
    assert out["trl"]["echoed"] == "hi" and out["trl"]["reward"] == 1.0
    assert "birch" in out["trl"]["first"]

    # The episodes it played are the server's: stored, ended, verified.
    with server.client() as client:
        for episode, reward in ((right, 1.0), (wrong, 0.0)):
            state = client.state(episode["episode_id"])
            assert state.verdict is not None and state.verdict.reward == reward


def test_light_install_has_no_command_and_says_what_to_install(core: Path) -> None:
    command = core.parent / "palaestra"
    done = subprocess.run([str(command), "--help"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pip install 'palaestra[server]'" in done.stderr and "fastapi" in done.stderr


def test_gym_extra_adds_gymnasium_only(wheels: Path, server: ServerProcess, tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv", wheels, "palaestra[gym]")
    out = run_light(python, "gym", server)

    assert out["installed"]["server_only_installed"] == []
    failures = out["installed"]["import_failures"]
    assert not {"palaestra.sdk.gym", "palaestra.sdk.integrations.gym_vector"} & set(failures)
    gym = out["gym"]
    assert "birch" in gym["obs"] and gym["invalid"]
    assert gym["reward"] == 1.0 and gym["terminated"]
    assert gym["vector_rewards"] == [1.0, 0.0] and gym["vector_terminated"] == [True, True]
