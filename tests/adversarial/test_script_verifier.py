"""Cheats against a terminal task verified by a `test.sh` (imported Terminal-Bench / Harbor
tasks, terminal-core's check.py tasks), each from the agent's final workspace only, on
bwrap and docker (issue 31, invariants 1-3):

- a workspace module named like a standard-library module that pytest imports after it
  was imported itself (``pdb``, ``xml`` as its plugins load) must not load in its session;
- an agent-added conftest.py beside tests that test.sh copies into the workdir must not load;
- the agent's module, imported by a test, ending the session with ``os._exit(0)`` or skipping
  its test module is a failure (the pytest monitor of pytest_boot.py);
- the agent's program, run by the checker, cannot read the checker's files (its script,
  expected outputs) nor write its logs (agent_jail.py, Landlock), however the checker runs
  it: through ``python3``, directly, from a test's ``subprocess``, in a ``make`` recipe
  (the exec guard, exec_guard.py);
- a reward.txt that the agent's imported module writes beside the reward.json of test.sh
  does not raise the reward (the least of the reward files present counts);
- the same through uv (``uvx … pytest``, Terminal-Bench 2 / Harbor's line, on the verifier
  image ``palaestra/verifier:latest`` on docker and as bwrap's rootfs): the tool
  environment's pytest runs under the same guard and monitor (uv_boot.py), a test's
  ``python3`` is the runner's wrapper (the agent's program jailed), and a pytest plugin the
  agent declares in the workspace (a ``*.dist-info`` entry point) is never loaded.

Each attack scores 1.0 on the verifier before this change and 0 after; the honest work
beside it still scores 1.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator

import pytest

from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.base import Backend
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.server.config import Settings
from palaestra.verifiers.terminal import TerminalRun, files_tar, verify_workspace
from tests.conftest import docker_skip_reason

pytestmark = pytest.mark.slow

IMAGE = "palaestra/terminal:latest"
UV_IMAGE = "palaestra/verifier:latest"  # images/verifier/: uv, uvx and pinned wheels offline
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
# The checker runs the agent's program by other means than python3/bash (issue 31,
# invariant 3): directly, from a test's subprocess, through a build tool's recipe. The
# program reads the answer from the checker's files; the exec guard jails every one.
READ_SECRET = "#!/bin/sh\ngrep -ho 'expected-[0-9a-f]*' /tmp/verifier/* | head -n 1\n"
RUN_DIRECT = 'chmod +x /work/prog\n[ "$(/work/prog)" = "$(cat "$VERIFIER_DIR/expected.txt")" ]\n'
RUN_FROM_TEST = """\
import subprocess

def test_program():
    out = subprocess.run(["/work/prog"], capture_output=True, text=True).stdout
    assert out.strip() == "expected-7f3a9c"
"""
RUN_MAKE = 'make -s -C /work >/dev/null 2>&1\ncmp -s /work/out.txt "$VERIFIER_DIR/expected.txt"\n'
EXPECTED = {"expected.txt": "expected-7f3a9c\n"}
HONEST_PROG = {"prog": "#!/bin/sh\necho expected-7f3a9c\n"}
ATTACKS["exec-directly"] = ({"prog": READ_SECRET}, {"test.sh": RUN_DIRECT, **EXPECTED})
ATTACKS["test-runs-program"] = (
    {"prog": READ_SECRET},
    {
        "test.sh": "chmod +x /work/prog\n" + PYTEST.replace("test_out.py", "test_run.py"),
        "test_run.py": RUN_FROM_TEST,
    },
)
ATTACKS["make-recipe"] = (
    {"Makefile": "all:\n\tcat /tmp/verifier/expected.txt > out.txt\n"},
    {"test.sh": RUN_MAKE, **EXPECTED},
)
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
    "exec-directly": HONEST_PROG,
    "test-runs-program": HONEST_PROG,
    "make-recipe": {"Makefile": "all:\n\techo expected-7f3a9c > out.txt\n"},
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
    backend: Backend,
    workspace: dict[str, str],
    verifier: dict[str, str],
    reward_file: bool,
    image: str | None = None,
) -> TerminalRun:
    # what the terminal family asks for its verifier: the exec guard may trace
    spec = SandboxSpec(image=image, workdir=WORKDIR, workspace_mb=32, traces_execs=True)
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


# -- the same through uv: Terminal-Bench 2 / Harbor's standard line on the verifier image ----
UVX = "uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf $VERIFIER_LOGS/c.json"
TB2_REWARD = (
    'if [ $? -eq 0 ]; then echo 1 > "$VERIFIER_LOGS/reward.txt"; '
    'else echo 0 > "$VERIFIER_LOGS/reward.txt"; fi\n'
)
UV_TEST_SH = f'{UVX} "$VERIFIER_DIR/test_out.py" -rA\n{TB2_REWARD}'
# What TB2 tests do: the agent's folder first on sys.path, then its module imported.
UV_TEST_OUT = """\
import sys

sys.path.insert(0, "/work")


def test_answer():
    import hashlib

    digest = hashlib.sha256(open("/work/out.txt", "rb").read()).hexdigest()
    assert digest == hashlib.sha256(b"right\\n").hexdigest()


def test_solution():
    from solution import double

    assert double(21) == 42
"""
UV_CHECK = """\
import subprocess

SECRET = "expected-7f3a9c"


def test_program():
    r = subprocess.run(["python3", "/work/prog.py"], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == SECRET
"""
PASS_ALL = (
    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
    "    report = outcome.get_result()\n    report.outcome = 'passed'\n"
    "    report.longrepr = None\n"
)
UV_VERIFIER = {"test.sh": UV_TEST_SH, "test_out.py": UV_TEST_OUT}
UV_ATTACKS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "import-exit-0": ({**WRONG, "solution.py": "import os\nos._exit(0)\n"}, UV_VERIFIER),
    # a standard-library module the test imports once it has put /work first
    "shadow-lazy-stdlib": ({**WRONG, "hashlib.py": "import os\nos._exit(0)\n"}, UV_VERIFIER),
    "workspace-conftest": (
        {**WRONG, "conftest.py": PASS_ALL},
        {
            "test.sh": f'cp "$VERIFIER_DIR/test_out.py" .\n{UVX} test_out.py -rA\n{TB2_REWARD}',
            "test_out.py": UV_TEST_OUT,
        },
    ),
    # a pytest11 entry point in the workspace: plugin autoload is on in uv's tool environment
    "plugin-entry-point": (
        {
            **WRONG,
            "passall.py": PASS_ALL,
            "passall-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: passall\n"
            "Version: 1.0\n",
            "passall-1.0.dist-info/entry_points.txt": "[pytest11]\npassall = passall\n",
        },
        UV_VERIFIER,
    ),
    "read-the-checker": (
        {"prog.py": READ_CHECK.replace("/tmp/*/check.py", "/tmp/*/test_check.py")},
        {
            "test.sh": f'{UVX} "$VERIFIER_DIR/test_check.py" -rA\n{TB2_REWARD}',
            "test_check.py": UV_CHECK,
        },
    ),
}
UV_HONEST = {name: HONEST for name in UV_ATTACKS}
UV_HONEST["read-the-checker"] = {"prog.py": "print('expected-7f3a9c')\n"}


@pytest.fixture(params=["bwrap", "docker"])
async def uv_backend(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Backend, str]]:
    """A backend whose verification sandbox is the verifier image (bwrap: it as a rootfs)."""
    why = docker_skip_reason(UV_IMAGE)
    if not why and request.param == "bwrap":
        why = _skip_reason("bwrap")
    if why:
        pytest.skip(why)
    if request.param == "bwrap":
        import docker

        from palaestra.envs.terminal.verifierimage import TOOLS_IMAGE, export_rootfs

        images = Settings().cache / "verifier-images"  # cached per image id across runs
        client = docker.from_env(timeout=300)
        try:
            await asyncio.to_thread(export_rootfs, client, UV_IMAGE, images, TOOLS_IMAGE)
        finally:
            client.close()
        b: Backend = BwrapBackend(images_dir=images)
        image = TOOLS_IMAGE
    else:
        from palaestra.sandbox.docker import DockerBackend

        b, image = DockerBackend(default_image=UV_IMAGE), UV_IMAGE
    try:
        yield b, image
    finally:
        await b.aclose()


@pytest.mark.parametrize("attack", sorted(UV_ATTACKS))
async def test_attack_through_uvx_scores_zero_and_honest_work_one(
    attack: str, uv_backend: tuple[Backend, str]
) -> None:
    b, image = uv_backend
    workspace, verifier = UV_ATTACKS[attack]
    run = await _verify(b, workspace, verifier, True, image)
    assert run.reward == 0.0, (attack, run.feedback())
    good = await _verify(b, UV_HONEST[attack], verifier, True, image)
    assert good.reward == 1.0, (attack, good.feedback())


UV_FORMS = {
    "uvx-at-version": "uvx pytest@8.4.1",
    "uvx-from": "uvx --from pytest==8.4.1 --with pytest-json-ctrf pytest",
    "uv-tool-run": "uv tool run -p 3.11 pytest",
    "uv-run": "uv run -p 3.13 --with pytest==8.4.1 pytest",
}


@pytest.mark.parametrize("form", sorted(UV_FORMS))
async def test_every_uv_form_of_pytest_runs_under_the_monitor(
    form: str, uv_backend: tuple[Backend, str]
) -> None:
    """Each way a script asks uv for pytest: honest work 1, an exit 0 at import 0."""
    b, image = uv_backend
    test_sh = f'{UV_FORMS[form]} "$VERIFIER_DIR/test_out.py" -rA\n{TB2_REWARD}'
    verifier = {"test.sh": test_sh, "test_out.py": UV_TEST_OUT}
    workspace, _ = UV_ATTACKS["import-exit-0"]
    run = await _verify(b, workspace, verifier, True, image)
    assert run.reward == 0.0, (form, run.feedback())
    good = await _verify(b, HONEST, verifier, True, image)
    assert good.reward == 1.0, (form, good.feedback())


def _link_tar(name: str, target: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        tf.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("target", ["/tmp/verifier/expected.txt", "../tmp/verifier/expected.txt"])
async def test_an_answer_linked_to_the_expected_output_is_not_the_answer(
    target: str, backend: tuple[str, Backend]
) -> None:
    # the checker's own ``cmp`` (a plain tool, unconfined) would follow the agent's link and
    # compare the expected output with itself: a link into the scratch space is not copied
    _, b = backend
    spec = SandboxSpec(workdir=WORKDIR, workspace_mb=32, traces_execs=True)
    test_sh = '#!/bin/bash\ncmp -s /work/out.txt "$VERIFIER_DIR/expected.txt"\n'
    async with await b.create(spec) as box:
        run = await verify_workspace(
            box,
            _link_tar("out.txt", target),
            workdir=WORKDIR,
            verifier={"test.sh": test_sh, **EXPECTED},
            environment={},
            timeout_s=60,
        )
    assert run.reward == 0.0, run.feedback()
    assert "a link into the verifier's scratch space" in run.feedback()
