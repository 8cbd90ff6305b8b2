"""The generic cheats (palaestra.envs.cheats) against the terminal verifier.

- The runner's channel: only lines carrying the run's nonce count, and a session that did
  not reach its end (a test called os._exit, or killed the runner) scores 0.
- The verifier runs with a fresh HOME, an isolated interpreter, a PATH without workspace
  folders and pytest configured by the verifier alone, proved by a test.sh that looks.
- Every generic cheat (and the terminal family's own) scores <= 0.1 on every task of
  packs/terminal-core, held-out included, on docker (bwrap runs them on every task through
  test_terminal_core's full `pack check`), and on the imported Terminal-Bench / Harbor
  fixtures with a shadowed pytest on docker; the oracle still scores 1 there.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs import cheatlib, cheats
from palaestra.sandbox import ExecResult, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.packcheck import play_episode
from palaestra.server.packs.loader import Pack, inspect_pack
from palaestra.server.runtime import build_manager
from palaestra.verifiers.terminal import _channel, files_tar, judge_set, verify_workspace
from tests.conftest import FULL_CHECKS, docker_cheat_sample, docker_skip_reason

ROOT = Path(__file__).resolve().parents[3]
CORE = ROOT / "packs" / "terminal-core"
FIXTURES = Path(__file__).parents[2] / "fixtures"
IMAGE = "palaestra/terminal:latest"
NONCE = "a" * 32
WHY_NO_BWRAP = "" if bwrap_available()[0] else f"bwrap unavailable: {bwrap_available()[1]}"
WHY_NO_DOCKER = docker_skip_reason(IMAGE)


def _result(stdout: str, *, timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code=0, stdout=stdout, stderr="", timed_out=timed_out)


def test_channel_counts_only_nonce_lines_and_needs_the_end() -> None:
    ids = ["tests/test_a.py::test_x"]
    honest = (
        f'{NONCE} READY "pytest"\n{NONCE} COLLECTED ["tests/test_a.py::test_x"]\n'
        f'{NONCE} TEST {{"id": "tests/test_a.py::test_x", "ok": true}}\n'
        f"{NONCE} END 0\n{NONCE} EXIT 0\n"
    )
    assert judge_set("s", ids, _result(honest), _channel(honest, NONCE)).ok
    # a forger without the nonce: its lines are ignored
    forged = (
        f'{NONCE} READY "pytest"\n{NONCE} COLLECTED ["tests/test_a.py::test_x"]\n'
        'b TEST {"id": "tests/test_a.py::test_x", "ok": true}\nb END 0\nb EXIT 0\n'
        "1 passed in 0.01s\n"
    )
    assert not judge_set("s", ids, _result(forged), _channel(forged, NONCE)).ok
    # os._exit(0) inside a test: every line so far, but no END and no EXIT
    cut = honest.split(f"{NONCE} END")[0]
    entry = judge_set("s", ids, _result(cut), _channel(cut, NONCE))
    assert not entry.ok and "did not finish" in entry.note
    # a parametrized id needs every case; an id nothing collected fails
    params = (
        f'{NONCE} COLLECTED ["t.py::f[1]", "t.py::f[2]"]\n'
        f'{NONCE} TEST {{"id": "t.py::f[1]", "ok": true}}\n'
        f'{NONCE} TEST {{"id": "t.py::f[2]", "ok": false}}\n{NONCE} END 1\n{NONCE} EXIT 1\n'
    )
    assert judge_set("s", ["t.py::f"], _result(params), _channel(params, NONCE)).passed == 0
    assert not judge_set("s", ["t.py::g"], _result(honest), _channel(honest, NONCE)).ok


# What test.sh checks about the process it runs in (and the python3 it finds).
PROBE = r"""
import os, sys
w = os.environ["WORKDIR"]
assert not os.environ["HOME"].startswith(w), os.environ["HOME"]
assert all(not p.startswith(w) for p in os.environ["PATH"].split(":")), os.environ["PATH"]
assert "sitecustomize" not in sys.modules or not sys.modules["sitecustomize"].__file__.startswith(w)
assert "usercustomize" not in sys.modules, sys.modules["usercustomize"]
assert all(not p.startswith(w) for p in sys.path if p), sys.path
assert not any(k.startswith("PYTHONPATH") for k in os.environ)
print("isolated")
"""


@pytest.mark.skipif(bool(WHY_NO_BWRAP), reason=WHY_NO_BWRAP)
async def test_verifier_processes_are_isolated_from_the_workspace() -> None:
    forge = cheats.forge_source()
    planted = {
        "sitecustomize.py": forge,
        "usercustomize.py": forge,
        ".local/lib/python3.11/site-packages/usercustomize.py": forge,
        ".local/lib/python3.11/site-packages/00-x.pth": "import os; os._exit(0)\n",
        "python3": "#!/bin/sh\nexit 0\n",
        "pytest.ini": "[pytest]\naddopts = -p nothing_here\n",
        "conftest.py": "raise SystemExit(0)\n",
        "pytest.py": forge,
    }
    backend = BwrapBackend()
    cases = {
        # the probe passes in the verifier's interpreter despite every planted file
        'python3 "$VERIFIER_DIR/probe.py"': 1.0,
        # pytest on the verifier's tests: the workspace's ini, conftest and pytest.py do not
        # load, and a failing test fails
        'python3 -m pytest -q "$VERIFIER_DIR/test_fail.py"': 0.0,
        'pytest -q "$VERIFIER_DIR/test_ok.py"': 1.0,
    }
    env = {"PATH": "/work:/work/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": "/work"}
    try:
        for script, want in cases.items():
            spec = SandboxSpec(workspace_mb=16, env=tuple(env.items()))
            async with await backend.create(spec) as box:
                run = await verify_workspace(
                    box,
                    files_tar(planted),
                    workdir="/work",
                    verifier={
                        "test.sh": f"#!/bin/bash\nset -e\n{script}\n",
                        "probe.py": PROBE,
                        "test_fail.py": "def test_no():\n    assert False\n",
                        "test_ok.py": "def test_yes():\n    assert True\n",
                    },
                    environment={},
                    path=env["PATH"],
                )
            assert run.reward == want, (script, run.feedback())
    finally:
        await backend.aclose()


async def _play_all(
    pack: Pack, sandbox: str, task_ids: Sequence[str], names: Sequence[str]
) -> dict[tuple[str, str], tuple[float | None, str]]:
    families = FamilyRegistry.discover()
    out: dict[tuple[str, str], tuple[float | None, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), packs_dirs=[], sandbox=sandbox)
        manager = await asyncio.to_thread(build_manager, settings)
        manager.families = families
        manager.packs.add(pack)
        await manager.start()
        client = AsyncInProcessClient(manager)
        gate = asyncio.Semaphore(3)

        async def one(task: Task, name: str, actions: list) -> None:  # type: ignore[type-arg]
            async with gate:
                run = await play_episode(client, task, actions, 240)
            v = run.verdict
            out[(task.id, name)] = (
                v.reward if v is not None and v.status == "ok" else None,
                v.feedback if v is not None else str(run.error),
            )

        try:
            jobs = []
            for task_id in task_ids:
                task = pack.tasks[task_id]
                family = families.get(task.family)
                generic = cheatlib.plays_for(task, family.cheat_surface(task))
                plays = [("oracle", family.oracle(task)), *family.cheats(task)]
                plays += [(play.name, play.script) for play in generic]
                jobs += [one(task, n, a) for n, a in plays if n in names]
            await asyncio.gather(*jobs)
        finally:
            await manager.shutdown()
    return out


def _load(root: Path) -> Pack:
    families = FamilyRegistry.discover()
    pack, problems = inspect_pack(root, [f.name for f in families.all()])
    assert pack is not None and not problems, problems
    return pack


def _check(results: dict[tuple[str, str], tuple[float | None, str]]) -> None:
    bad = []
    for (task_id, name), (reward, feedback) in sorted(results.items()):
        if name == "oracle" and reward != 1.0:
            bad.append(f"{task_id} oracle {reward}: {feedback}")
        elif name != "oracle" and (reward is None or reward > 0.1):
            bad.append(f"{task_id} cheat {name} {reward}: {feedback}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.skipif(bool(WHY_NO_DOCKER), reason=WHY_NO_DOCKER)
@pytest.mark.timeout(3600)  # the full matrix: ~560 episodes, two containers each
def test_every_cheat_on_docker_terminal_core() -> None:
    pack = _load(CORE)
    names = (*cheats.NAMES, "print-pass", "write-verifier-result", "shadow-pytest", "boot-forge")
    names += ("edit-tests", "conftest-hook")
    # ~560 episodes, two containers each, with every task: see conftest.FULL_CHECKS. By
    # default 4 tasks (conftest.docker_cheat_sample; bwrap's pack check plays the others).
    task_ids = sorted(pack.tasks) if FULL_CHECKS else docker_cheat_sample(pack.tasks)
    results = asyncio.run(_play_all(pack, "docker", task_ids, names))
    assert len(results) >= len(task_ids) * (3 + len(cheats.NAMES))
    _check(results)


@pytest.mark.slow
@pytest.mark.skipif(bool(WHY_NO_DOCKER), reason=WHY_NO_DOCKER)
@pytest.mark.timeout(900)
def test_imported_tasks_with_a_shadowed_pytest_on_docker(tmp_path: Path) -> None:
    runner = CliRunner()
    task_ids: dict[str, list[str]] = {}
    for fmt in ("terminal-bench", "harbor"):
        out = tmp_path / fmt
        result = runner.invoke(
            app, ["pack", "import", fmt, str(FIXTURES / fmt), str(out), "--name", f"t/{fmt}"]
        )
        assert result.exit_code == 0, result.output
        task_ids[fmt] = sorted(_load(out).tasks)
    names = ("oracle", "shadow-pytest", "path-shadow", "startup-files", "write-results")
    for fmt, ids in task_ids.items():
        pack = _load(tmp_path / fmt)
        if fmt == "harbor":  # the task says its reward file decides
            assert all(pack.tasks[t].private.get("reward_file") is True for t in ids)
        _check(asyncio.run(_play_all(pack, "docker", ids, names)))
