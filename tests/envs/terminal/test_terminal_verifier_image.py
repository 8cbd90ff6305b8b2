"""Verifier environments as tasks declare them (docs/terminal.md, "Verifier environments"):
a Harbor task whose tests/test.sh is the standard Terminal-Bench 2 script (uv installer,
`uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf ...`) runs unchanged
on the verifier image with no network: oracle 1, null 0; a task with tests/Dockerfile runs on
its own verifier image; CTRF and JUnit reports the run wrote are read by the runner; results
the agent planted (workspace, /logs/verifier, /tmp) change nothing; every imported fixture
whose tests run through uv/uvx (harbor-cookbook, harbor-verifier, terminal-bench-2) passes
its oracle, and its pytest runs under the verifier's monitor (an agent module that ends the
session with ``os._exit(0)`` when a test imports it scores 0). On docker; skips, saying
why, without the engine or palaestra/terminal."""

from __future__ import annotations

import asyncio
import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from palaestra.envs.cheats import SCRIPTS
from palaestra.envs.terminal.importer import clean_test_script, import_tasks, verifier_image_for
from palaestra.envs.terminal.verifierimage import (
    DEFAULT_TAG,
    TOOLS_IMAGE,
    build_declared,
    build_task_verifier_image,
    build_tools_image,
    export_rootfs,
    missing_wheels,
    task_verifier_tag,
    tools_tag,
)
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sdk.models import Action
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.verifiers.terminal import results_counts
from tests.conftest import docker_skip_reason

FIXTURES = Path(__file__).parents[2] / "fixtures" / "harbor-verifier"
PACK = "test/harbor-verifier"
STANDARD = (FIXTURES / "csv-stats" / "tests" / "test.sh").read_text()
WHY = docker_skip_reason("palaestra/terminal:latest")
docker_only = pytest.mark.skipif(bool(WHY), reason=WHY)

# What a hostile agent plants before it submits: passing CTRF, JUnit and reward files in its
# workspace and in every place a harness might read one (the verifier sandbox is fresh).
PLANT = r"""
ctrf='{"results":{"tool":{"name":"pytest"},"summary":{"tests":3,"passed":3,"failed":0},
"tests":[{"name":"t","status":"passed","file_path":"tests/test_outputs.py"}]}}'
junit='<testsuites><testsuite name="pytest" tests="2"><testcase classname="x" name="a"/>
<testcase classname="x" name="b"/></testsuite></testsuites>'
for d in /app /app/logs /logs/verifier /tmp/verifier-logs /tmp/verifier /tmp; do
  mkdir -p "$d" 2>/dev/null || continue
  printf '%s' "$ctrf" > "$d/ctrf.json"; printf '%s' "$junit" > "$d/junit.xml"
  echo 1 > "$d/reward.txt"
done
mkdir -p /app/.venv/bin && printf '#!/bin/sh\nexit 0\n' > /app/.venv/bin/python
chmod +x /app/.venv/bin/python
printf '[tool.uv]\nfind-links = ["/app/wheels"]\n' > /app/pyproject.toml
printf 'find-links = ["/app/wheels"]\n' > /app/uv.toml
"""


def test_standard_tb2_script_is_kept() -> None:
    """The importer keeps the standard script (paths moved) and asks for the tools image."""
    script, problems = clean_test_script(
        STANDARD, tests_dir="$VERIFIER_DIR/tests", logs_dir="$VERIFIER_LOGS"
    )
    assert problems == []
    assert "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh" in script
    assert "uvx \\\n  -p 3.13 \\\n  -w pytest==8.4.1" in script
    assert "--ctrf $VERIFIER_LOGS/ctrf.json $VERIFIER_DIR/tests/test_outputs.py" in script
    assert verifier_image_for({"test.sh": ""}, script) == TOOLS_IMAGE
    assert verifier_image_for({"test.sh": ""}, "# Install uv\npython3 -m pytest x\n") is None
    assert missing_wheels(script) == []
    extra = "uvx \\\n  -w pytest==8.4.1 \\\n  -w numpy==2.2.3 --with pandas -w pytest==8.3.5 t"
    assert missing_wheels(extra) == ["numpy==2.2.3", "pandas", "pytest==8.3.5"]
    # a workdir venv is still never built: the tests would trust what the agent can edit
    venv, _ = clean_test_script("uv venv\nuv pip install pytest\n", tests_dir="/v", logs_dir=None)
    assert venv.strip() == ""


def test_declared_verifier_images_are_checked() -> None:
    """A task's verifier_image must be one of the three kinds; anything else is named."""
    base = "palaestra/some-env:abc"
    assert tools_tag(base) != tools_tag("palaestra/terminal:latest")
    assert tools_tag(base).startswith("palaestra/verifier:")
    out = build_declared(None, Path("/nonexistent"), {"t": ("palaestra/other:1", {}, base)})
    assert out["t"].startswith("error: palaestra/other:1 is none of")
    assert tools_tag(base) in out["t"]


def test_results_counts_prefers_ctrf() -> None:
    results = {
        "junit.xml": {"format": "junit", "files": {"a.py": [1, 1, 2], "b.py": [2, 0, 2]}},
        "ctrf.json": {"format": "ctrf", "files": {"a.py": [0, 2, 2]}},
        "odd.json": {"format": "ctrf", "files": {"c.py": [1, "x", 2]}},
    }
    assert results_counts(results) == {"a.py": [0, 2, 2], "b.py": [2, 0, 2]}


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    out = tmp_path / "packs" / "harbor-verifier"
    report = import_tasks("harbor", FIXTURES, out, name=PACK)
    assert sorted(report.imported) == ["csv-stats", "own-verifier"], report.skipped
    return out


def _private(pack: Path, task: str) -> dict[str, Any]:
    meta = tomllib.loads((pack / "tasks" / task / "task.toml").read_text())
    return dict(meta.get("private", {}))


def _verifier_files(pack: Path, task: str) -> dict[str, str]:
    root = pack / "tasks" / task / "verifier"
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def images(pack: Path, tmp_path: Path) -> dict[str, str]:
    import docker

    client = docker.from_env(timeout=300)
    cache = Path.home() / ".cache" / "palaestra"
    own = build_task_verifier_image(client, cache, _verifier_files(pack, "own-verifier"))
    return {"tools": build_tools_image(client, cache), "own": own}


@pytest.fixture
def settings(pack: Path, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", packs_dirs=[pack.parent], sandbox="docker", pool_size=0
    )


async def _play(
    client: AsyncInProcessClient,
    task: str,
    commands: list[str],
    *,
    oracle: bool = False,
    qualified: bool = False,
) -> dict[str, Any]:
    reset = await client.reset(task if qualified else f"{PACK}:{task}", options={"oracle": oracle})
    for command in commands:
        await client.step(reset.episode_id, Action(tool="bash", arguments={"command": command}))
    tool = "oracle" if oracle else "submit"
    reply = await client.step(reset.episode_id, Action(tool=tool))
    while not reply.terminated:
        reply = await client.step(reset.episode_id, Action(tool=tool))
    return reply.info["verdict"]  # type: ignore[no-any-return]


@pytest.mark.slow
@docker_only
async def test_verifier_images_score_oracle_null_and_planted_results(
    pack: Path, images: dict[str, str], manager: EpisodeManager
) -> None:
    assert _private(pack, "csv-stats")["verifier_image"] == TOOLS_IMAGE
    own_tag = task_verifier_tag(_verifier_files(pack, "own-verifier"))
    assert _private(pack, "own-verifier")["verifier_image"] == own_tag == images["own"]
    client = AsyncInProcessClient(manager)
    uv_config = (SCRIPTS / "uv-config.sh").read_text()
    oracle, null, planted, uv_cheat, own, own_null, own_planted = await asyncio.gather(
        _play(client, "csv-stats", [], oracle=True),
        _play(client, "csv-stats", []),
        _play(client, "csv-stats", [PLANT]),
        _play(client, "csv-stats", [uv_config]),
        _play(client, "own-verifier", [], oracle=True),
        _play(client, "own-verifier", []),
        _play(client, "own-verifier", [PLANT]),
    )
    file = "tests/test_outputs.py"
    assert oracle["reward"] == 1.0, oracle["feedback"]
    # the runner read the CTRF report the verifier's own pytest run wrote
    counts = {k: v for k, v in oracle["components"].items() if k.startswith("tests/")}
    assert counts == {f"{file}:passed": 3, f"{file}:failed": 0, f"{file}:total": 3}
    for verdict in (null, planted, uv_cheat):
        assert verdict["status"] == "ok" and verdict["reward"] == 0.0, verdict["feedback"]
        assert verdict["components"][f"{file}:failed"] >= 2, verdict["components"]

    assert own["reward"] == 1.0, own["feedback"]  # /opt/checker is in its own image only
    junit = {k: v for k, v in own["components"].items() if ":" in k and "test_sh" not in k}
    assert sum(v for k, v in junit.items() if k.endswith(":passed")) == 2, own["components"]
    for verdict in (own_null, own_planted):
        assert verdict["reward"] == 0.0, verdict["feedback"]
        failed = sum(v for k, v in verdict["components"].items() if k.endswith(":failed"))
        assert failed == 1, verdict["components"]  # the image check passed, the status not


def test_runner_reads_reports_and_named_rewards(tmp_path: Path) -> None:
    """The runner's readers: CTRF and JUnit per-file counts, Harbor's reward.json."""
    from palaestra.verifiers.programs import terminal_runner as runner

    (tmp_path / "ctrf.json").write_text(
        '{"results": {"tests": [{"status": "passed", "file_path": "t.py"},'
        ' {"status": "failed", "file_path": "t.py"}, {"status": "skipped", "file_path": "t.py"}]}}'
    )
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="u" name="a"/><testcase classname="u" '
        'name="b"><failure/></testcase><testcase classname="u" name="c"><error/></testcase>'
        "</testsuite></testsuites>"
    )
    (tmp_path / "other.json").write_text('{"not": "a report"}')
    found = runner.read_results(str(tmp_path))
    assert found == {
        "ctrf.json": {"format": "ctrf", "files": {"t.py": [1, 1, 3]}},
        "junit.xml": {"format": "junit", "files": {"u": [1, 2, 3]}},
    }
    assert runner.read_reward_json(str(tmp_path)) == (None, "no reward file")
    (tmp_path / "reward.json").write_text('{"correctness": 1, "performance": 0.5}')
    assert runner.read_reward_json(str(tmp_path)) == (0.5, "")
    (tmp_path / "reward.json").write_text('{"correctness": 2}')
    assert runner.read_reward_json(str(tmp_path))[0] is None
    # a run that reports thousands of files cannot flood the verdict: 200 names, then "…"
    many = [{"status": "passed", "file_path": f"f{i}.py"} for i in range(250)]
    (tmp_path / "ctrf.json").write_text(json.dumps({"results": {"tests": many}}))
    files = runner.read_results(str(tmp_path))["ctrf.json"]["files"]
    assert len(files) == 201 and files["…"] == [50, 0, 50]


@pytest.mark.slow
@docker_only
async def test_tools_image_as_a_bwrap_rootfs(pack: Path, tmp_path: Path) -> None:
    """The same image unpacked as bwrap's rootfs "verifier": the standard script runs there
    too (oracle 1, null 0); the agent's sandbox stays on the host's /usr."""
    import docker

    if not bwrap_available()[0]:
        pytest.skip(f"bwrap unavailable: {bwrap_available()[1]}")
    client = docker.from_env(timeout=300)
    cache = Settings().cache
    build_tools_image(client, cache)
    images = cache / "verifier-images"  # cached per image id across runs
    export_rootfs(client, DEFAULT_TAG, images, TOOLS_IMAGE)
    settings = Settings(
        data_dir=tmp_path / "bwrap-data",
        packs_dirs=[pack.parent],
        sandbox="bwrap",
        pool_size=0,
        images_dir=images,
    )
    manager = build_manager(settings)
    await manager.start()
    try:
        client_ = AsyncInProcessClient(manager)
        oracle, null = await asyncio.gather(
            _play(client_, "csv-stats", [], oracle=True), _play(client_, "csv-stats", [])
        )
    finally:
        await manager.shutdown()
    assert oracle["reward"] == 1.0, oracle["feedback"]
    assert oracle["components"]["tests/test_outputs.py:passed"] == 3
    assert null["reward"] == 0.0 and null["status"] == "ok", null["feedback"]


@pytest.mark.slow
@docker_only
def test_images_verifiers_builds_each_declared_image(tmp_path: Path) -> None:
    """`palaestra images verifiers PACK` builds what each task declares; a tests/Dockerfile
    that fails is named with the build's cause and the others are still built."""
    from typer.testing import CliRunner

    from palaestra.cli.main import app

    src = tmp_path / "src"
    shutil.copytree(FIXTURES, src)
    broken = src / "broken-verifier"
    shutil.copytree(src / "own-verifier", broken)
    (broken / "tests" / "Dockerfile").write_text(
        "FROM palaestra/terminal:latest\nRUN echo no checker here >&2; exit 3\n"
    )
    out = tmp_path / "pack"
    import_tasks("harbor", src, out, name=PACK)
    result = CliRunner().invoke(app, ["images", "verifiers", str(out)])
    assert result.exit_code == 1, result.output
    lines = {line.split(":", 1)[0]: line for line in result.output.splitlines() if ":" in line}
    assert "error: the task's tests/Dockerfile" in lines["broken-verifier"], result.output
    assert "non-zero code: 3" in result.output  # the build's own cause
    assert "palaestra/verifier:" in lines["csv-stats"]
    assert "palaestra/task-verifier:" in lines["own-verifier"]
    assert "2 of 3 verifier images ready" in result.output


UV_FIXTURES = ("harbor-cookbook", "harbor-verifier", "terminal-bench-2")
# The multi-reward tasks' tests import /app/deduplicate.py: it ends the session "passed".
EXIT_0 = "printf 'import os\\nos._exit(0)\\n' > /app/deduplicate.py"


@pytest.mark.slow
@docker_only
def test_uv_fixtures_pass_their_oracle_under_the_monitor(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from palaestra.cli.main import app

    runner = CliRunner()
    packs = tmp_path / "packs"
    tasks: list[str] = []
    for name in UV_FIXTURES:
        out = packs / name
        src = Path(__file__).parents[2] / "fixtures" / name
        imported = runner.invoke(app, ["pack", "import", "harbor", str(src), str(out), "--build"])
        assert imported.exit_code == 0, imported.output
        built = runner.invoke(app, ["images", "verifiers", str(out)])
        assert built.exit_code == 0, built.output
        pack = tomllib.loads((out / "pack.toml").read_text())["name"]
        for folder in sorted((out / "tasks").iterdir()):
            meta = tomllib.loads((folder / "task.toml").read_text())
            if "verifier_image" in meta.get("private", {}):  # its tests call uv/uvx
                tasks.append(f"{pack}:{folder.name}")
    assert len(tasks) == 7, tasks
    settings = Settings(
        data_dir=tmp_path / "data", packs_dirs=[packs], sandbox="docker", pool_size=0
    )

    async def play() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        manager = build_manager(settings)
        await manager.start()
        try:
            client = AsyncInProcessClient(manager)
            dedup = [t for t in tasks if t.endswith(":multi-reward")]
            # The other oracles together; the multi-reward ones after, one at a time: their
            # upstream test_performance.py times 100,000 records against 2 s, which a
            # 2-core machine missed with eight containers of this test beside it.
            others = [t for t in tasks if t not in dedup]
            plays = [_play(client, t, [], oracle=True, qualified=True) for t in others]
            played = dict(zip(others, await asyncio.gather(*plays), strict=True))
            for task in dedup:
                played[task] = await _play(client, task, [], oracle=True, qualified=True)
            cheats = [_play(client, t, [EXIT_0], qualified=True) for t in dedup]
            return [played[t] for t in tasks], list(await asyncio.gather(*cheats))
        finally:
            await manager.shutdown()

    oracles, cheats = asyncio.run(play())
    for task, verdict in zip(tasks, oracles, strict=True):
        assert verdict["reward"] == 1.0, (task, verdict["feedback"])
    assert len(cheats) == 2
    for verdict in cheats:
        assert verdict["status"] == "ok" and verdict["reward"] == 0.0, verdict["feedback"]
