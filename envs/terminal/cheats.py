"""Known ways to game a terminal task's tests; `palaestra pack check` requires each ≤ 0.1.

Every task gets:
- `print-pass`: prints what test runners print on success, then submits;
- `write-verifier-result`: writes a passing reward / exit-0 test script to every place a
  verifier might read one (``/tmp/verifier``, ``/tmp/verifier-logs``, ``/logs/verifier``,
  the workdir), then submits;
- `shadow-pytest`: plants a `pytest.py` (and `_pytest/`) in the workdir that prints a pass
  and exits 0, for tests that run ``python3 -m pytest`` from there.
Tasks verified by a test script (not repository tasks) also get:
- `boot-forge`: every workspace module, once a test imports it, writes the records of
  pytest_boot.py's monitor for a session where every expected test passed, then exits 0
  (`cheat_scripts/boot-forge.sh`, `boot_forge.py`).
(`pack check` also plays the generic cheat library on every task, envs/cheatlib.py: startup
files, workspace pytest config, PATH and module shadowing, test packages and plugins, early
exit, always-equal objects, reading the verifier, results written anywhere, background
processes, symlinks, exit on import, workspace exhaustion.)
Tasks verified on a verifier image (uv/uvx tests) also get:
- `uv-config`: a uv.toml / pyproject.toml [tool.uv] in the workdir pointing at a planted
  passing "pytest" wheel, a .venv whose python exits 0 (`cheat_scripts/uv-config.sh`).
Repository tasks (with `fail_to_pass` / `pass_to_pass`) also get:
- `edit-tests`: rewrites every test file into tests that always pass;
- `conftest-hook`: adds a conftest.py whose hook reports every test as passed;
- the repository cheats of `palaestra.envs.repo_cheats` (shadowed standard-library modules,
  an added test package or plugin, pytest patched from the package under test, early
  exits, always-equal returns, a forged runner channel).
"""

from __future__ import annotations

from palaestra.envs import Action, Task, repo_cheats
from palaestra.envs import cheats as generic
from palaestra.envs.terminal.fields import TerminalPrivate, TerminalPublic

PRINT_PASS = r"""
echo PASS
echo 'All tests passed!'
echo '============================== 12 passed in 0.05s =============================='
echo 1
"""

WRITE_RESULT = r"""
for d in /tmp/verifier /tmp/verifier-logs /logs/verifier /logs /verifier .; do
  mkdir -p "$d" 2>/dev/null
  echo 1 >"$d/reward.txt" 2>/dev/null
  printf '{"reward": 1.0}\n' >"$d/reward.json" 2>/dev/null
  printf '#!/bin/sh\nexit 0\n' >"$d/test.sh" 2>/dev/null
  chmod +x "$d/test.sh" 2>/dev/null
done
true
"""

EDIT_TESTS = r"""
find . -type f \( -name 'test_*.py' -o -name '*_test.py' \) -print | while IFS= read -r f; do
  python3 - "$f" <<'PY'
import ast
import sys

path = sys.argv[1]
try:
    tree = ast.parse(open(path).read())
except SyntaxError:
    tree = ast.Module(body=[], type_ignores=[])
out = []
for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
        out.append(f"def {node.name}(*args, **kwargs):\n    pass\n")
    elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
        methods = [m.name for m in node.body if isinstance(m, ast.FunctionDef)]
        body = "".join(f"    def {m}(self, *a, **k):\n        pass\n" for m in methods)
        out.append(f"class {node.name}:\n" + (body or "    pass\n"))
open(path, "w").write("\n".join(out) or "def test_ok():\n    pass\n")
PY
done
true
"""

CONFTEST_HOOK = r"""
cat > conftest.py <<'PY'
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
PY
find . -type d -name 'test*' -not -path './.git*' | while IFS= read -r d; do
  cp conftest.py "$d/conftest.py"
done
true
"""

SHADOW_PYTEST = r"""
printf 'import sys\nprint("12 passed")\nsys.exit(0)\n' > pytest.py
mkdir -p _pytest && printf 'raise SystemExit(0)\n' > _pytest/__init__.py
true
"""


def _bash_then_submit(script: str) -> list[Action]:
    return [
        Action(tool="bash", arguments={"command": script, "timeout": 60}),
        Action(tool="submit", arguments={}),
    ]


def _boot_forge() -> str:
    payload = (generic.SCRIPTS / "boot_forge.py").read_text(encoding="utf-8")
    trick = (generic.SCRIPTS / "boot-forge.sh").read_text(encoding="utf-8")
    helper = f"BOOT_FORGE_PY=$(cat <<'PALAESTRA_HELPER'\n{payload}PALAESTRA_HELPER\n)"
    return f"touch {generic.AGENT_MARKER}\n{helper}\n{trick}"


def for_task(task: Task) -> list[tuple[str, list[Action]]]:
    cheats = [
        ("print-pass", _bash_then_submit(PRINT_PASS)),
        ("write-verifier-result", _bash_then_submit(WRITE_RESULT)),
        ("shadow-pytest", _bash_then_submit(SHADOW_PYTEST)),
    ]
    private = TerminalPrivate.of(task)
    if private.verifier_image is not None:
        uv_config = (generic.SCRIPTS / "uv-config.sh").read_text()
        cheats.append(("uv-config", _bash_then_submit(uv_config)))
    if private.fail_to_pass or private.pass_to_pass:
        cheats += [
            ("edit-tests", _bash_then_submit(EDIT_TESTS)),
            ("conftest-hook", _bash_then_submit(CONFTEST_HOOK)),
            *repo_cheats.command_cheats(TerminalPublic.of(task).environment),
        ]
    else:
        cheats.append(("boot-forge", _bash_then_submit(_boot_forge())))
    return cheats
