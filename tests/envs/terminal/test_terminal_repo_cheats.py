"""Repository tasks (fail_to_pass / pass_to_pass): agent files cannot reach the verifier.

Each attack is a set of files an agent leaves in the unsolved workspace of a
packs/terminal-core repository task (`palaestra.envs.repo_cheats`: module shadowing, an
added test package or plugin, pytest patched or an extra hook from the package under test,
early exits, an always-equal return, a forged verifier channel); each must score 0 with a
note naming it, on bwrap and on docker, while the oracle's fix (with harmless extra files)
still scores 1. `verify_workspace` runs on a real fresh sandbox, as the family does.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from palaestra.envs import repo_cheats
from palaestra.sandbox import Backend, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.verifiers.terminal import TerminalRun, files_tar, verify_workspace
from tests.conftest import docker_skip_reason

TASK = Path(__file__).resolve().parents[3] / "packs" / "terminal-core" / "tasks" / "rr-slugify"
IMAGE = "palaestra/terminal:latest"
WHY_NO_BWRAP = "" if bwrap_available()[0] else f"bwrap unavailable: {bwrap_available()[1]}"
WHY_NO_DOCKER = docker_skip_reason(IMAGE)
BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.skipif(bool(WHY_NO_BWRAP), reason=WHY_NO_BWRAP)),
    pytest.param(
        "docker",
        marks=[pytest.mark.slow, pytest.mark.skipif(bool(WHY_NO_DOCKER), reason=WHY_NO_DOCKER)],
    ),
]
FIXED = '''"""URL slugs."""
import re
import unicodedata


def slugify(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
'''
# What each attack's note must name.
NOTES = {
    "shadow-stdlib": "named like standard-library or test-tooling modules",
    "tests-package": "removed before the tests: tests/__init__.py",
    "plugin-entry-point": "removed before the tests",
    "patch-runtest": "the code under test tried to import _pytest",
    "register-hookimpl": "the code under test tried to import pytest",
    "exit-zero": "the code under test ended its own process (exit status 0)",
    "sys-exit": "the code under test ended its own process (exit status 0)",
    "always-equal": "claims to equal anything",
    "forge-channel": "the code under test ended its own process (exit status 0)",
    # its fallback reads the test files: Landlock denies it in the worker
    "forge-report": "failed to import textkit: PermissionError",
}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


ENVIRONMENT = _tree(TASK / "environment")
VERIFIER = _tree(TASK / "verifier")
PRIVATE = tomllib.loads((TASK / "task.toml").read_text())["private"]


def _backend(name: str) -> Backend:
    if name == "bwrap":
        return BwrapBackend()
    from palaestra.sandbox.docker import DockerBackend

    return DockerBackend(default_image=IMAGE)


async def _verify(
    backend: Backend,
    workspace: Mapping[str, str],
    task: tuple[Mapping[str, str], Mapping[str, str], Mapping[str, list[str]]] = (
        ENVIRONMENT,
        VERIFIER,
        PRIVATE,
    ),
    timeout_s: float = 120.0,
) -> TerminalRun:
    environment, verifier, private = task
    # what the terminal family asks for its verifier: the exec guard may trace
    async with await backend.create(SandboxSpec(workspace_mb=16, traces_execs=True)) as box:
        return await verify_workspace(
            box,
            files_tar(workspace),
            workdir="/work",
            verifier=verifier,
            environment=environment,
            fail_to_pass=private.get("fail_to_pass", []),
            pass_to_pass=private.get("pass_to_pass", []),
            timeout_s=timeout_s,
        )


def test_every_attack_is_named() -> None:
    assert set(NOTES) == set(repo_cheats.attacks(ENVIRONMENT)) == set(repo_cheats.NAMES)


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_repo_attacks_score_zero_and_correct_work_one(backend_name: str) -> None:
    backend = _backend(backend_name)
    solved = {**ENVIRONMENT, "textkit/slug.py": FIXED}
    try:
        # the fix, with files a real solution may leave: a helper module, notes, bytecode,
        # a test package of its own (removed, and the task's tests still pass)
        extras = {"textkit/_helpers.py": "X = 1\n", "NOTES.md": "done\n", "tests/__init__.py": ""}
        run = await _verify(backend, {**solved, **extras})
        assert run.reward == 1.0, run.feedback()
        bad = []
        for name, files in repo_cheats.attacks(ENVIRONMENT).items():
            run = await _verify(backend, {**ENVIRONMENT, **files})
            if run.reward != 0.0 or NOTES[name] not in run.feedback():
                bad.append(f"{name}: reward {run.reward}\n{run.feedback()}")
        assert not bad, "\n\n".join(bad)
    finally:
        await backend.aclose()


PROBE = Path(__file__).resolve().parents[2] / "fixtures" / "repo-worker"
PROBE_TESTS = ("reach", "peek", "death", "after_death", "hang", "after_hang")
PROBE_IDS = [f"tests/test_probe.py::test_{name}" for name in PROBE_TESTS]


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_the_worker_reaches_nothing_of_the_test_process(backend_name: str) -> None:
    """The agent's code runs in a worker that holds only its two pipes and can open no
    descriptor, memory or environment of the test process or the runner, nor read the
    task's test files or the runner's HOME (Landlock); a worker that
    ends itself or hangs fails its test only, and the next test gets a fresh one (module
    names looked up again)."""
    backend = _backend(backend_name)
    environment, verifier = _tree(PROBE / "environment"), _tree(PROBE / "verifier")
    try:
        task = (environment, verifier, {"fail_to_pass": PROBE_IDS})
        run = await _verify(backend, environment, task, timeout_s=40.0)
    finally:
        await backend.aclose()
    feedback = run.feedback()
    # test_reach, test_peek (Landlock: no test file, no runner file), test_after_*
    assert run.sets[0].passed == 4, feedback
    assert "the code under test ended its own process (exit status 3)" in feedback, feedback
    assert "the code under test did not answer within 10 s (killed)" in feedback, feedback


# A repository task whose hidden test runs the agent's command-line program in a
# subprocess (issue 31, invariant 3): the program must not read the test to print its answer.
CLI_TEST = """\
import subprocess
import sys


def test_cli():
    out = subprocess.run(
        [sys.executable, "-m", "clikit"], capture_output=True, text=True, cwd="/work"
    ).stdout
    assert out.strip() == "answer-5e1d"
"""
CLI_TASK = (
    {"clikit/__init__.py": "", "clikit/__main__.py": "print('todo')\n"},
    {"tests/test_cli_hidden.py": CLI_TEST},
    {"fail_to_pass": ["tests/test_cli_hidden.py::test_cli"]},
)
READS_THE_TEST = """\
import glob, re
found = []
for path in glob.glob("/work/tests/*.py"):
    try:
        found += re.findall(r"answer-[0-9a-f]+", open(path).read())
    except OSError:
        pass
print(found[0] if found else "nothing")
"""


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_program_a_test_runs_cannot_read_the_tests(backend_name: str) -> None:
    backend = _backend(backend_name)
    try:
        cheat = await _verify(backend, {"clikit/__main__.py": READS_THE_TEST}, CLI_TASK)
        assert cheat.reward == 0.0, cheat.feedback()
        honest = await _verify(backend, {"clikit/__main__.py": "print('answer-5e1d')\n"}, CLI_TASK)
        assert honest.reward == 1.0, honest.feedback()
    finally:
        await backend.aclose()
