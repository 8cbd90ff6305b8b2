"""The absolute paths a task's tests use, laid out as Harbor and Terminal-Bench lay a trial
out (docs/importing.md, "Paths the tests use"); what cannot be given is refused at import.

Harbor copies a task's `tests/` to `/tests` after the agent ends and runs `tests/test.sh`
as root in the agent's container, with `/logs/verifier` its output folder (`reward.txt` or
`reward.json`); a test may create and write any other absolute folder, such as `/shared`.
Terminal-Bench copies `tests/` to `$TEST_DIR` (`/tests`). palaestra stages the tests in
the fresh verification sandbox's `$VERIFIER_DIR` (`/tmp/verifier`, a folder no agent
process ever saw, which the agent's programs the tests start cannot open) and its logs in
`$VERIFIER_LOGS`: the test script's own paths are moved by `clean_test_script`; here every
other text file of `tests/` (a helper that opens "/tests/expected.json", a check that
writes "/logs/verifier/reward.json") gets them moved to the same folders, and `/shared`
becomes `$VERIFIER_DIR/shared`, made before the tests run: the verifier's alone.

Refused, naming why:
* the agent's side (the environment's files, the solution) uses `/shared`: the folder
  would carry files from the agent to its tests, and palaestra's verifier receives the
  workdir only;
* a test script (or a shell helper of `tests/`) runs or reads a file under `/tests` that
  the task does not ship: it would fail at the task's first episode;
* the base image names a Python minor no local stand-in runs (pyminor.py) and a Python
  file of the task does not compile on the stand-in's; where the base maps to the Python
  3.13 stand-in, `Checked.own_image` asks for the task to run in its own image there
  instead (the converter builds its context: `build_context`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.envs.terminal import pyminor
from palaestra.envs.terminal.dockerfile import EnvPlan
from palaestra.envs.terminal.verifierimage import TOOLS_IMAGE
from palaestra.verifiers.terminal import VERIFIER_DIR, VERIFIER_LOGS

SHARED_DIR = f"{VERIFIER_DIR}/shared"
# A path at a word boundary: not inside a longer path, name, URL or variable.
_EDGE = r"(?<![\w/$.~-]){}(?![\w.-])"
MOVED = (  # Harbor's path -> where the verification sandbox has it
    (re.compile(_EDGE.format("/tests")), f"{VERIFIER_DIR}/tests"),
    (re.compile(_EDGE.format("/logs/verifier")), VERIFIER_LOGS),
    (re.compile(_EDGE.format("/shared")), SHARED_DIR),
)
SHARED = MOVED[2][0]
# A file under the tests folder, as the original script names it (or as moved).
_TESTS_ROOT = (
    r"(?:(?<![\w/$.~-])/tests|\$TEST_DIR|\$\{TEST_DIR\}|\$VERIFIER_DIR/tests"
    r"|\$\{VERIFIER_DIR\}/tests)"
)
REFERENCE = re.compile(_TESTS_ROOT + r"/([^\s\"'`;|&<>(){}]+)")
WRITTEN = re.compile(
    r"(?:>>?|\btee(?:\s+-a)?|\bmkdir(?:\s+-p)?|\btouch|--output(?:=|\s+)|\s-o)\s*[\"']?"
    + _TESTS_ROOT
    + r"/([^\s\"'`;|&<>(){}]+)"
)
GUARDED = re.compile(
    r"(?:\[\[?|\btest)\s+!?\s*-[defrsx]\s+[\"']?" + _TESTS_ROOT + r"/([^\s\"'`;|&<>(){}]+)"
)
SAYS = re.compile(r"^\s*(echo|printf)\b")  # a line that only prints a path
SHELL_SUFFIXES = (".sh", ".bash")


@dataclass
class Checked:
    """What the checks found: problems refuse the task, notes go to the import report."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    own_image: str | None = None  # why the task runs in the image built from its Dockerfile


def _code(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))


def move_paths(text: str) -> str:
    """`text` with Harbor's `/tests`, `/logs/verifier` and `/shared` moved (module doc)."""
    for pattern, target in MOVED:
        text = pattern.sub(target, text)
    return text


def _rel(raw: str) -> str:
    rel = raw.removeprefix("./")
    while rel.endswith(("/", "/.")):
        rel = rel.removesuffix("/").removesuffix("/.")
    return rel


def missing_references(scripts: Mapping[str, str], tests_dir: Path) -> list[str]:
    """Each file under /tests that a script runs or reads and the task's `tests_dir` does
    not hold. Not checked: a path the script writes there or tests for (`[ -d … ]`: used
    only where present, with what is below it), one it only prints, one with a variable
    or glob, one that climbs out with `..`."""
    problems = []
    for name, text in sorted(scripts.items()):
        code = "\n".join(ln for ln in _code(text).splitlines() if not SAYS.match(ln))
        kept = {_rel(m.group(1)) for p in (WRITTEN, GUARDED) for m in p.finditer(code)}
        for found in REFERENCE.finditer(code):
            rel = _rel(found.group(1))
            if not rel or any(c in rel for c in "$*?[]") or ".." in rel.split("/"):
                continue
            if any(rel == k or rel.startswith(k + "/") for k in kept):
                continue
            if (tests_dir / rel).exists():
                continue
            problem = (
                f"{name} names the test file /tests/{rel}, which the task does not ship "
                f"(no tests/{rel}): its tests would fail at the first episode"
            )
            if problem not in problems:
                problems.append(problem)
    return problems


def agent_shared(agent_files: Mapping[str, str]) -> list[str]:
    """The agent's side writing or reading /shared: files handed to the tests that way."""
    users = sorted(name for name, text in agent_files.items() if SHARED.search(_code(text)))
    if not users:
        return []
    return [
        f"the task passes files from the agent to its tests through /shared "
        f"({', '.join(users)}); palaestra's verifier receives the workdir only"
    ]


def stage_tests(
    verifier: dict[str, str], script_name: str, scripts: Mapping[str, str], tests_dir: Path
) -> Checked:
    """Check and move the converted verifier files in place: `verifier` holds `tests/<rel>`
    and the test script `script_name` (its /tests and /logs/verifier already moved);
    `scripts` are the test script(s) by the name the report gives them; `tests_dir` the
    task's own tests folder (its binary files count as shipped too)."""
    out = Checked()
    tests = {k.removeprefix("tests/"): v for k, v in verifier.items() if k.startswith("tests/")}
    helpers = {f"tests/{k}": v for k, v in tests.items() if k.endswith(SHELL_SUFFIXES)}
    out.problems += missing_references({**scripts, **helpers}, tests_dir)
    moved = []
    for rel, text in tests.items():
        if rel == "Dockerfile":  # the verifier image's own build (its COPY . /tests/)
            continue
        new = move_paths(text)
        if new != text:
            verifier[f"tests/{rel}"] = new
            moved.append(f"tests/{rel}")
    script = verifier[script_name]
    uses_shared = any(SHARED.search(_code(t)) for t in (script, *tests.values()))
    script = SHARED.sub(SHARED_DIR, script)
    if uses_shared:
        head, sep, body = script.partition("\n") if script.startswith("#!") else ("", "", script)
        made = f"mkdir -p {SHARED_DIR}  # /shared: the verifier's own (palaestra)\n"
        script = f"{head}{sep}{made}{body}"
    verifier[script_name] = script
    if moved:
        out.notes.append(
            f"/tests, /logs/verifier and /shared in {', '.join(moved)} moved to the "
            f"verification sandbox's {VERIFIER_DIR}/tests, {VERIFIER_LOGS} and {SHARED_DIR}"
        )
    if uses_shared:
        out.notes.append(f"/shared is the verifier's own folder ({SHARED_DIR}), made empty")
    return out


def check_task(
    verifier: dict[str, str],
    script_name: str,
    scripts: Mapping[str, str],
    tests_dir: Path,
    agent_files: Mapping[str, str],
    dockerfile: str | None,
    built: bool,
    verifier_image: str | None,
) -> Checked:
    """Every check of this module (and pyminor's) on one converted task: `verifier` is
    staged in place (`stage_tests`); `agent_files` are the environment's files and the
    solution's by the name the report gives them; `dockerfile` the environment's, `built`
    whether the task runs in the image built from it, `verifier_image` where its tests run
    (None: the agent's image)."""
    out = stage_tests(verifier, script_name, scripts, tests_dir)
    out.problems += agent_shared(agent_files)
    image = pyminor.base_image(dockerfile) if dockerfile else None
    if image is not None:
        sources = {**agent_files, **{k: v for k, v in verifier.items() if k.startswith("tests/")}}
        judged = pyminor.check(image, sources, built=built)
        out.problems += judged.problems
        out.notes += judged.notes
        if judged.own_image is not None and verifier_image is not None:
            out.problems.append(judged.tests_elsewhere)  # its tests would still run on 3.11
        else:
            out.own_image = judged.own_image
        if built and verifier_image == TOOLS_IMAGE and pyminor.runs_newer(image):
            out.notes.append(
                f"its environment runs on Python 3.13 ({image}'s stand-in), its tests on the "
                "verifier image (uv/uvx: the terminal image's Python 3.11, where `-p 3.13` "
                "runs on 3.11)"
            )
    return out


def _agent_files(plan: EnvPlan, build: Mapping[str, str], solve: str) -> dict[str, str]:
    env = {**plan.files, **{k: v for k, v in build.items() if k != "Dockerfile"}}
    if plan.setup:
        env["setup.sh"] = "\n".join(plan.setup)
    return {**{f"environment/{k}": v for k, v in env.items()}, "solution/solve.sh": solve}


def harbor(
    folder: Path,
    meta: Mapping[str, Any],
    verifier: dict[str, str],
    solution: Mapping[str, str],
    plan: EnvPlan,
    build: Mapping[str, str],
    verifier_image: str | None,
) -> Checked:
    """`check_task` for a Harbor task as reader.py converts it (`harbor-test.sh`)."""
    path = folder / "environment" / "Dockerfile"
    env = meta.get("environment")
    image = env.get("docker_image") if isinstance(env, dict) else None
    dockerfile = (
        path.read_text(encoding="utf-8")
        if path.is_file()
        else f"FROM {image}\n"
        if isinstance(image, str)
        else None
    )
    script = verifier.get("harbor-test.sh", "")
    agent = _agent_files(plan, build, solution.get("solve.sh", ""))
    scripts = {"tests/test.sh": script}
    tests = folder / "tests"
    built, image = bool(build), verifier_image
    return check_task(verifier, "harbor-test.sh", scripts, tests, agent, dockerfile, built, image)


def terminal_bench(
    folder: Path,
    verifier: dict[str, str],
    plan: EnvPlan,
    build: Mapping[str, str],
    solve: str,
    verifier_image: str | None,
) -> Checked:
    """`check_task` for a Terminal-Bench task as importer.py converts it (`run-tests.sh`)."""
    path = folder / "Dockerfile"
    dockerfile = path.read_text(encoding="utf-8") if path.is_file() else None
    scripts = {"run-tests.sh": verifier.get("run-tests.sh", "")}
    agent = _agent_files(plan, build, solve)
    tests = folder / "tests"
    built, image = bool(build), verifier_image
    return check_task(verifier, "run-tests.sh", scripts, tests, agent, dockerfile, built, image)
