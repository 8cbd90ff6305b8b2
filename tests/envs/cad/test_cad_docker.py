"""The cad family on the docker backend (palaestra/cad): the host's toolchains bound
read-only as on bwrap, a Blender-built part verified, and the pack's checks on a sample.
Skips, saying why, when the engine, the image or the Blender toolchain is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_settings
from typer.testing import CliRunner

import palaestra
from palaestra.cli.main import app
from palaestra.envs.cad import runtime
from palaestra.server.config import REPO_PACKS, Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack
from tests.conftest import docker_skip_reason
from tests.envs.cad.test_cad_family import BLENDER_PLATE

IMAGE = "palaestra/cad:latest"


def _why() -> str:
    chain = runtime.blender_toolchain()
    return docker_skip_reason(IMAGE) or ("" if chain.available else f"no Blender: {chain.reason}")


WHY = _why()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(data_dir=tmp_path / "data", sandbox="docker", pool_size=0)


@pytest.fixture
def client(manager: EpisodeManager) -> AsyncInProcessClient:
    return AsyncInProcessClient(manager)


async def test_blender_part_on_docker(client: AsyncInProcessClient) -> None:
    tasks = load_pack(REPO_PACKS / "cad", ["cad"]).tasks.values()
    task = next(
        t
        for t in sorted(tasks, key=lambda t: t.id)
        if t.domain == "cad/plate" and t.private["level"] == 1 and t.split == "train"
    )
    reset = await client.reset(task.ref)
    assert "Unavailable" not in reset.observation.text, reset.observation.text
    eid = reset.episode_id
    # The container shows the toolchain read-only and nothing of the server (run first:
    # submit grades the last script run).
    server_files = str(Path(palaestra.__file__).resolve().parent)
    probe = (
        "import os\n"
        f"print(os.path.exists({server_files!r}), os.access('/opt/palaestra/blender', os.W_OK))\n"
    )
    await client.step(
        eid, {"tool": "write_file", "arguments": {"path": "probe.py", "content": probe}}
    )
    seen = await client.step(eid, {"tool": "run_script", "arguments": {"path": "probe.py"}})
    assert "False False" in seen.observation.text, seen.observation.text
    script = "PARAMS = " + repr(json.dumps(task.private["params"])) + "\n" + BLENDER_PLATE
    await client.step(
        eid, {"tool": "write_file", "arguments": {"path": "part.py", "content": script}}
    )
    ran = await client.step(
        eid,
        {
            "tool": "run_script",
            "arguments": {"path": "part.py", "toolchain": "blender", "timeout": 120},
        },
    )
    assert ran.observation.data["exit_code"] == 0, ran.observation.text
    assert ran.observation.data["mesh"]["watertight"], ran.observation.text
    final = await client.step(eid, {"tool": "submit", "arguments": {}})
    assert final.terminated and final.reward >= 0.95, final.info


def test_pack_check_on_docker() -> None:
    result = CliRunner().invoke(
        app,
        ["pack", "check", str(REPO_PACKS / "cad"), "--limit", "1", "--sandbox", "docker"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "every check passed" in result.output
