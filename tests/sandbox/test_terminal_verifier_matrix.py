"""One terminal-verifier matrix on every backend (bwrap, bwrap+pool, docker, FakeE2B, live
E2B): the same final state gives the same verdict everywhere, and no verifier step is
skipped where a backend's /tmp or PATH differs (sandbox_backends.py says what skips)."""

from __future__ import annotations

import pytest

from palaestra.envs import cheats
from palaestra.sandbox.base import Backend, SandboxSpec
from palaestra.verifiers.terminal import TerminalRun, files_tar, verify_workspace
from sandbox.sandbox_backends import backend_fixture  # noqa: F401  (fixtures)

CALC = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = {
    "tests/test_calc.py": (
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_zero():\n    assert add(0, 0) == 0\n"
    ),
}
IDS = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_zero"]
ISOLATION = r"""
import os, sys
w = os.environ["WORKDIR"]
assert not os.environ["HOME"].startswith(w)
assert all(p.startswith("/") and not p.startswith(w) for p in os.environ["PATH"].split(":"))
assert "usercustomize" not in sys.modules and all(not p.startswith(w) for p in sys.path if p)
"""
FORGE = cheats.forge_source()
PLANTED = {
    "sitecustomize.py": FORGE,
    "usercustomize.py": FORGE,
    ".local/lib/python3.11/site-packages/usercustomize.py": FORGE,
    ".local/lib/python3.13/site-packages/usercustomize.py": FORGE,
    "pytest.py": FORGE,
    "pytest.ini": "[pytest]\naddopts = -p no_such_plugin\n",
    "python3": "#!/bin/sh\nexit 0\n",
    "pytest": "#!/bin/sh\nexit 0\n",
}

# name: (workspace files, verifier files, fail_to_pass, reward_file, expected reward)
MATRIX: dict[str, tuple[dict[str, str], dict[str, str], list[str], bool, float]] = {
    "test.sh exit 0": ({"a.txt": "42\n"}, {"test.sh": "grep -qx 42 a.txt\n"}, [], False, 1.0),
    "test.sh exit 1": ({"a.txt": "41\n"}, {"test.sh": "grep -qx 42 a.txt\n"}, [], False, 0.0),
    "isolated check.py": (
        PLANTED,
        {"test.sh": 'exec python3 "$VERIFIER_DIR/check.py"\n', "check.py": ISOLATION},
        [],
        False,
        1.0,
    ),
    "test.sh pytest, planted": (
        {**PLANTED, "calc.py": WRONG},
        {"test.sh": 'cd "$WORKDIR" && pytest -q "$VERIFIER_DIR/tests/test_calc.py"\n', **TESTS},
        [],
        False,
        0.0,
    ),
    "test.sh python3 -m pytest": (
        {**PLANTED, "calc.py": CALC},
        {"test.sh": 'python3 -m pytest -q "$VERIFIER_DIR/tests/test_calc.py"\n', **TESTS},
        [],
        False,
        1.0,
    ),
    "reward file, declared": (
        {},
        {"test.sh": 'echo 0.25 > "$VERIFIER_LOGS/reward.txt"\n'},
        [],
        True,
        0.25,
    ),
    "reward file, undeclared": (
        {},
        {"test.sh": 'echo 1 > "$VERIFIER_LOGS/reward.txt"; exit 1\n'},
        [],
        False,
        0.0,
    ),
    "pytest set, right": ({"calc.py": CALC, **TESTS}, TESTS, IDS, False, 1.0),
    "pytest set, wrong": ({"calc.py": WRONG, **TESTS}, TESTS, IDS, False, 0.0),
    "pytest set, exit on import": (
        {"calc.py": "import os\nos._exit(0)\n", **TESTS},
        TESTS,
        IDS,
        False,
        0.0,
    ),
    "pytest set, planted": ({**PLANTED, "calc.py": WRONG, **TESTS}, TESTS, IDS, False, 0.0),
}


def _spec(backend: Backend) -> SandboxSpec:
    # docker runs the terminal image (python3 and pytest); the others the host's /usr
    image = "terminal" if type(backend).__name__ == "DockerBackend" else None
    path = "/work:/usr/local/bin:/usr/bin:/bin"
    return SandboxSpec(image=image, workspace_mb=32, env=(("PATH", path),))


async def _verify(backend: Backend, case: str) -> TerminalRun:
    workspace, verifier, f2p, reward_file, _ = MATRIX[case]
    async with await backend.create(_spec(backend)) as box:
        return await verify_workspace(
            box,
            files_tar(workspace),
            workdir="/work",
            verifier={
                k: ("#!/bin/bash\n" + v if k == "test.sh" else v) for k, v in verifier.items()
            },
            environment={},
            fail_to_pass=f2p,
            timeout_s=60,
            path="/work:/usr/local/bin:/usr/bin:/bin",
            reward_file=reward_file,
        )


@pytest.mark.timeout(600)
async def test_verifier_matrix(backend: Backend) -> None:
    got = {}
    for case in MATRIX:
        run = await _verify(backend, case)
        got[case] = (run.reward, run.feedback())
    bad = {c: g for c, g in got.items() if g[0] != MATRIX[c][4]}
    assert not bad, bad
