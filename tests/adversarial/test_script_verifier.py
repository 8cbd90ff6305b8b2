"""Cheats against a terminal task verified by a `test.sh` (imported Terminal-Bench / Harbor
tasks, terminal-core's check.py tasks), each from the agent's final workspace only, on
bwrap and docker (issue 31, invariants 1-3):

- a workspace module named like a standard-library module that pytest imports after it
  was imported itself (``pdb``, ``xml`` as its plugins load) must not load in its session;
- an agent-added conftest.py beside tests that test.sh copies into the workdir must not load;
- the agent's module, imported by a test, ending the session with ``os._exit(0)`` or skipping
  its test module is a failure (the pytest monitor of pytest_boot.py);
- the agent's program, run by the checker, cannot read the checker's files (its script,
  expected outputs) nor write its logs (agent_jail.py, Landlock);
- a reward.txt that the agent's imported module writes beside the reward.json of test.sh
  does not raise the reward (the least of the reward files present counts).

Each attack scores 1.0 on the verifier before this change and 0 after; the honest work
beside it still scores 1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.base import Backend
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.verifiers.terminal import TerminalRun, files_tar, verify_workspace
from tests.conftest import docker_skip_reason

IMAGE = "palaestra/terminal:latest"
WORKDIR = "/work"
PYTEST = 'python3 -m pytest -q -p no:randomly "$VERIFIER_DIR/test_out.py"\n'

# The verifier's test: the agent's answer in /work/out.txt, and its solution module.
TEST_OUT = """\
import importlib.util


def _solution():
    spec = importlib.util.spec_from_file_location("solution", "/work/solution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_answer():
    assert open("/work/out.txt").read() == "right\\n"


def test_solution():
    assert _solution().double(21) == 42
"""
HONEST = {"out.txt": "right\n", "solution.py": "def double(x):\n    return 2 * x\n"}
WRONG = {"out.txt": "wrong\n", "solution.py": "def double(x):\n    return x\n"}

# A check.py (terminal-core's shape) that runs the agent's program and wants its secret.
CHECK = """\
import subprocess, sys
SECRET = "expected-7f3a9c"
r = subprocess.run(["python3", "/work/prog.py"], capture_output=True, text=True, timeout=30)
sys.exit(0 if r.stdout.strip() == SECRET else 1)
"""
READ_CHECK = """\
import glob, os, re
texts = []
for path in glob.glob("/tmp/*/check.py") + glob.glob("/tmp/verifier/*"):
    try:
        texts.append(open(path).read())
    except OSError:
        pass
for pid in os.listdir("/proc"):
    for leaf in ("environ", "fd/255", "fd/3"):
        try:
            texts.append(open(f"/proc/{pid}/{leaf}", errors="replace").read())
        except OSError:
            pass
found = re.findall(r'SECRET = "([^"]+)"', "\\n".join(texts))
print(found[0] if found else "nothing")
"""

SKIP_MODULE = "import pytest\npytest.skip('not here', allow_module_level=True)\n"
ATTACKS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # name: (workspace, verifier files)
    "shadow-lazy-stdlib": (
        {**WRONG, "pdb.py": "import os\nos._exit(0)\n", "xml/__init__.py": "raise SystemExit(0)\n"},
        {"test.sh": PYTEST, "test_out.py": TEST_OUT},
    ),
    "workspace-conftest": (
        {
            **WRONG,
            "conftest.py": (
                "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                "    report = outcome.get_result()\n    report.outcome = 'passed'\n"
                "    report.longrepr = None\n"
            ),
        },
        {
            "test.sh": 'cp "$VERIFIER_DIR/test_out.py" .\npython3 -m pytest -q test_out.py\n',
            "test_out.py": TEST_OUT,
        },
    ),
    "import-exit-0": (
        {**WRONG, "solution.py": "import os\nos._exit(0)\n"},
        {"test.sh": PYTEST, "test_out.py": TEST_OUT},
    ),
    "import-skip-module": (
        {**WRONG, "out.txt": "right\n", "solution.py": SKIP_MODULE},
        {
            "test.sh": 'python3 -m pytest -q "$VERIFIER_DIR/test_a.py" "$VERIFIER_DIR/test_b.py"\n',
            "test_a.py": "def test_answer():\n"
            "    assert open('/work/out.txt').read() == 'right\\n'\n",
            "test_b.py": "import sys\nsys.path.append('/work')\nfrom solution import double\n\n"
            "def test_solution():\n    assert double(21) == 42\n",
        },
    ),
    "read-the-checker": (
        {"prog.py": READ_CHECK},
        {"test.sh": 'exec python3 "$VERIFIER_DIR/check.py"\n', "check.py": CHECK},
    ),
    "write-the-logs": (
        {"prog.py": "import os\nopen('/tmp/verifier-logs/reward.txt', 'w').write('1')\n"},
        {
            "test.sh": 'python3 /work/prog.py\necho 0 > "$VERIFIER_LOGS/reward.json.tmp"\n'
            "python3 -c \"import json; json.dump({'a': 0}, "
            "open('$VERIFIER_LOGS/reward.json', 'w'))\"\n",
        },
    ),
}
# Harbor's named rewards, written by test.sh once its tests ran (multi-reward's shape).
NAMED_REWARD = (
    'python3 -m pytest -q "$VERIFIER_DIR/test_out.py" && ok=1 || ok=0\n'
    "python3 -c \"import json; json.dump({'tests': $ok}, "
    "open('$VERIFIER_LOGS/reward.json', 'w'))\"\n"
)
ATTACKS["reward-file-in-process"] = (
    {**WRONG, "solution.py": "open('/tmp/verifier-logs/reward.txt', 'w').write('1')\n"},
    {"test.sh": NAMED_REWARD, "test_out.py": TEST_OUT},
)
REWARD_FILE = ("write-the-logs", "reward-file-in-process")
HONEST_WORK = {
    "reward-file-in-process": HONEST,
    "shadow-lazy-stdlib": HONEST,
    "workspace-conftest": HONEST,
    "import-exit-0": HONEST,
    "import-skip-module": HONEST,
    "read-the-checker": {"prog.py": "print('expected-7f3a9c')\n"},
    "write-the-logs": None,
}


def _skip_reason(name: str) -> str:
    if name == "bwrap":
        ok, why = bwrap_available()
        return "" if ok else f"bwrap unavailable: {why}"
    return docker_skip_reason(IMAGE)


@pytest.fixture(params=["bwrap", "docker"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Backend]]:
    why = _skip_reason(request.param)
    if why:
        pytest.skip(why)
    if request.param == "bwrap":
        b: Backend = BwrapBackend()
    else:
        from palaestra.sandbox.docker import DockerBackend

        b = DockerBackend(default_image=IMAGE)
    try:
        yield request.param, b
    finally:
        await b.aclose()


async def _verify(
    backend: Backend, workspace: dict[str, str], verifier: dict[str, str], reward_file: bool
) -> TerminalRun:
    spec = SandboxSpec(workdir=WORKDIR, workspace_mb=32)
    files = {**verifier, "test.sh": "#!/bin/bash\n" + verifier["test.sh"]}
    async with await backend.create(spec) as box:
        return await verify_workspace(
            box,
            files_tar(workspace),
            workdir=WORKDIR,
            verifier=files,
            environment={},
            timeout_s=120,
            reward_file=reward_file,
        )


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_attack_scores_zero_and_honest_work_one(
    attack: str, backend: tuple[str, Backend]
) -> None:
    _, b = backend
    workspace, verifier = ATTACKS[attack]
    reward_file = attack in REWARD_FILE
    run = await _verify(b, workspace, verifier, reward_file)
    assert run.reward == 0.0, (attack, run.feedback())
    honest = HONEST_WORK[attack]
    if honest is not None:
        good = await _verify(b, honest, verifier, reward_file)
        assert good.reward == 1.0, (attack, good.feedback())
