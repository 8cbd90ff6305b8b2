"""Cheats against repository tasks (pytest `fail_to_pass` / `pass_to_pass` ids), where the
verifier's tests must import the agent's code (DESIGN §4; `pack check` plays each).

Each is a set of files the agent leaves in the task's workspace, derived from what the
environment shipped (its packages: top-level folders with an ``__init__.py``, not tests):

- `shadow-stdlib`: ``pdb.py``, ``cmd.py``, ``code.py``, ``codeop.py``, ``bdb.py`` in the
  workdir, standard-library names pytest imports late; each patches pytest to pass every
  test, then loads the real module (`cheat_scripts/repo-shadow.py`);
- `tests-package`: a ``tests/__init__.py`` (and one in every test folder) that patches
  pytest the same way (`repo-pass-all.py`);
- `plugin-entry-point`: an installed-looking distribution with a ``pytest11`` entry point
  and a ``.pth`` file, both loading a pass-all plugin (`repo-plugin.py`);
- `patch-runtest`: the package under test patches ``_pytest.python.Function.runtest``;
- `register-hookimpl`: the package under test registers a pass-all hook on pytest's plugin
  manager, found through the garbage collector (`repo-hookimpl.py`);
- `exit-zero` / `sys-exit`: the package under test ends the process (``os._exit(0)``,
  ``sys.exit(0)``) when imported;
- `always-equal`: every public function of the package returns an object equal to
  anything (`repo-always-equal.py`);
- `forge-channel`: the package under test finds the verifier runner's channel and writes a
  passing report, then exits (`repo-forge-channel.py`);
- `forge-report`: written against the runner's own protocol: the package under test finds
  the test process's report pipe (its own descriptors, or any process's through /proc)
  and writes the records of a session where every requested test passed, then exits 0
  (`repo-forge-report.py`).
"""

from __future__ import annotations

import base64
import functools
import posixpath
import shlex
from collections.abc import Mapping

from palaestra.envs.cheats import SCRIPTS, TIMEOUT_S
from palaestra.sdk.models import Action

SHADOWED = ("pdb", "cmd", "code", "codeop", "bdb")
PLUGIN_DIST = "palaestra_pass-1.0.dist-info"
NAMES = (
    "shadow-stdlib",
    "tests-package",
    "plugin-entry-point",
    "patch-runtest",
    "register-hookimpl",
    "exit-zero",
    "sys-exit",
    "always-equal",
    "forge-channel",
    "forge-report",
)


@functools.cache
def _payload(name: str) -> str:
    return (SCRIPTS / f"repo-{name}.py").read_text(encoding="utf-8")


def packages(environment: Mapping[str, str]) -> list[str]:
    """The packages under test: top-level folders with an ``__init__.py``, not tests."""
    return sorted(
        rel.split("/")[0]
        for rel in environment
        if rel.count("/") == 1 and rel.endswith("/__init__.py") and not rel.startswith("test")
    )


def _test_dirs(environment: Mapping[str, str]) -> list[str]:
    dirs = {posixpath.dirname(rel) for rel in environment if "/" in rel}
    return sorted(d for d in dirs if posixpath.basename(d).startswith("test")) or ["tests"]


def _on_import(environment: Mapping[str, str], code: str) -> dict[str, str]:
    """Every package's ``__init__.py`` as shipped, with `code` run first."""
    return {
        f"{pkg}/__init__.py": code + "\n" + environment.get(f"{pkg}/__init__.py", "")
        for pkg in packages(environment)
    }


def attacks(environment: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Each cheat's files (path -> content) for a task whose environment is `environment`."""
    modules = [
        rel
        for rel in environment
        if rel.endswith(".py")
        and rel.split("/")[0] in packages(environment)
        and not rel.endswith("__init__.py")
    ]
    plugin = _payload("plugin")
    dist = {
        "METADATA": "Metadata-Version: 2.1\nName: palaestra_pass\nVersion: 1.0\n",
        "entry_points.txt": "[pytest11]\npalaestra_pass = palaestra_pass_plugin\n",
    }
    return {
        "shadow-stdlib": {f"{name}.py": _payload("shadow") for name in SHADOWED},
        "tests-package": {
            f"{d}/__init__.py": _payload("pass-all") for d in _test_dirs(environment)
        },
        "plugin-entry-point": {
            **{f"{PLUGIN_DIST}/{name}": text for name, text in dist.items()},
            "palaestra_pass_plugin.py": plugin,
            "00-palaestra.pth": "import palaestra_pass_plugin\n",
        },
        "patch-runtest": _on_import(environment, _payload("pass-all")),
        "register-hookimpl": _on_import(environment, _payload("hookimpl")),
        "exit-zero": _on_import(environment, "import os\nos._exit(0)\n"),
        "sys-exit": _on_import(environment, "import sys\nsys.exit(0)\n"),
        "always-equal": {
            rel: environment[rel] + "\n\n" + _payload("always-equal") for rel in modules
        },
        "forge-channel": _on_import(environment, _payload("forge-channel")),
        "forge-report": _on_import(environment, _payload("forge-report")),
    }


def write_script(files: Mapping[str, str]) -> str:
    """A bash script that writes `files` (relative to the current folder)."""
    lines = []
    for rel, text in sorted(files.items()):
        data = base64.b64encode(text.encode()).decode()
        path = shlex.quote(rel)
        lines.append(f'mkdir -p -- "$(dirname -- {path})" && echo {data} | base64 -d >{path}')
    return "\n".join(lines) + "\ntrue\n"


def command_cheats(environment: Mapping[str, str]) -> list[tuple[str, list[Action]]]:
    """Each cheat as (name, actions): one bash call writing its files, then submit. Named
    `repo-<attack>`: apart from the generic library's plays (its `always-equal` differs)."""
    return [
        (
            f"repo-{name}",
            [
                Action(
                    tool="bash", arguments={"command": write_script(files), "timeout": TIMEOUT_S}
                ),
                Action(tool="submit", arguments={}),
            ],
        )
        for name, files in attacks(environment).items()
    ]
