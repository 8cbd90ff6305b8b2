"""The terminal family on the docker backend: the tiny fixture pack's repository task (oracle
1, null 0, a test-editing cheat 0) and a command that kills the shell, in palaestra/terminal.
Skips, saying why, when the engine or the image is missing (scripts/docker-up.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from palaestra.envs.terminal import cheats
from palaestra.sdk.models import Action
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from tests.conftest import docker_skip_reason

PACK = Path(__file__).parents[2] / "fixtures" / "terminal-pack"
REPO = "test/terminal-mini:fix-calc"
IMAGE = "palaestra/terminal:latest"


WHY = docker_skip_reason(IMAGE)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    shutil.copytree(PACK, tmp_path / "packs" / "terminal-pack")
    return Settings(
        data_dir=tmp_path / "data", packs_dirs=[tmp_path / "packs"], sandbox="docker", pool_size=0
    )


@pytest.fixture
def client(manager: EpisodeManager) -> AsyncInProcessClient:
    return AsyncInProcessClient(manager)


async def _play(client: AsyncInProcessClient, actions: list[Action]) -> dict[str, object]:
    reset = await client.reset(REPO)
    reply = None
    for action in actions:
        reply = await client.step(reset.episode_id, action)
    assert reply is not None and reply.terminated
    return reply.info["verdict"]  # type: ignore[no-any-return]


async def test_repository_task_on_docker(client: AsyncInProcessClient) -> None:
    reset = await client.reset(REPO, options={"oracle": True})
    eid = reset.episode_id
    # the image is the terminal one (pytest, gcc, jq are there) and the shell survives a kill
    tools = await client.step(
        eid, Action(tool="bash", arguments={"command": "command -v jq gcc sqlite3 git >/dev/null"})
    )
    assert tools.observation.data["exit_code"] == 0, tools.observation.text
    dead = await client.step(eid, Action(tool="bash", arguments={"command": "kill -9 $$"}))
    assert dead.observation.data["shell_ended"] and not dead.terminated
    back = await client.step(eid, Action(tool="bash", arguments={"command": "pwd"}))
    assert back.observation.data["output"] == "/work\n"
    await client.step(eid, Action(tool="oracle"))
    final = await client.step(eid, Action(tool="oracle"))
    assert final.reward == 1.0, final.info["verdict"]
    assert final.info["verdict"]["components"] == {"fail_to_pass": 1.0, "pass_to_pass": 1.0}

    null = await _play(client, [Action(tool="submit")])
    assert null["reward"] == 0.0 and null["status"] == "ok"

    edited = await _play(
        client,
        [Action(tool="bash", arguments={"command": cheats.EDIT_TESTS}), Action(tool="submit")],
    )
    assert edited["reward"] == 0.0 and edited["status"] == "ok"
