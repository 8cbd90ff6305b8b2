"""Terminal-Bench and Harbor task folders as a pack of `terminal` tasks (docs/terminal.md).

Both formats describe a task as a folder: an instruction, a Docker environment, a test
script and an oracle solution.

* **Terminal-Bench** (`task.yaml`, `Dockerfile`, `docker-compose.yaml`, `run-tests.sh`,
  `tests/`, `solution.sh`): tests run from ``$TEST_DIR`` (``/tests``); pass = the test
  script exits 0 (pytest).
* **Harbor** (`task.toml`, `instruction.md`, `environment/Dockerfile`, `tests/test.sh`,
  `solution/solve.sh`): tests in ``/tests``; the script writes ``/logs/verifier/reward.txt``.

Each becomes a `terminal` task folder: its Dockerfile becomes the environment
(envs/terminal/dockerfile.py); the tests go to `verifier/` with a `test.sh` that runs the
original script with its paths moved (``/tests`` → the verifier directory,
``/logs/verifier`` → ``$VERIFIER_LOGS``), the steps that would build a Python environment in
the workdir dropped and the rest unchanged: a script that calls uv/uvx (the standard
``uvx -p 3.13 -w pytest==… pytest`` line) is verified on the verifier image, which runs it
offline; a task with ``tests/Dockerfile`` on its own verifier image
(envs/terminal/verifierimage.py). The script's pip installs are taken out and run for the
verifier through the egress proxy where the operator's egress_allow has the registries, else
the task is refused naming the hosts (envs/terminal/installs.py).

A task that needs what the sandbox cannot give -- the network (npm/cargo installs, curl,
git clone), a base image with no local stand-in and no registry mirror, or asking for a newer
toolchain than its stand-in has (envs/terminal/baseimages.py), services (docker-compose with
more than one service, a daemon as CMD/ENTRYPOINT), GPUs, files outside the workdir, keystroke
solutions, a binary file over `max_pack_blob_bytes` -- is *skipped and reported by name
with the reason* (in the report and in ``OUT/import-report.json``), never dropped
silently. Binary files of the environment and the tests become the pack's blobs
(``OUT/blobs/<sha256>``, server/packs/blobs.py). `palaestra pack check OUT` then proves
what was imported.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from palaestra.envs import BASE_PATH
from palaestra.envs.terminal import testpaths
from palaestra.envs.terminal.baseimages import BaseImages, base_problems
from palaestra.envs.terminal.dockerfile import (
    NETWORK,
    EnvPlan,
    convert_dockerfile,
    read_text,
    within,
)
from palaestra.envs.terminal.envimage import DOCKERFILE, collect_context
from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.installs import ignored_install, verifier_installs
from palaestra.envs.terminal.solvefiles import take_oracle_payload
from palaestra.envs.terminal.verifierimage import (
    TOOLS_IMAGE,
    missing_wheels,
    task_verifier_tag,
)
from palaestra.sandbox.docker.standins import DEFAULT_IMAGE_ALIASES
from palaestra.sdk.blobs import (
    BLOBS_FIELD,
    DEFAULT_MAX_BLOB,
    DEFAULT_MAX_BLOBS,
    SIDES,
    disk_cost,
    too_large,
)
from palaestra.sdk.packwriter import (
    REPORT_FILE,
    ImportReport,
    write_blobs,
    write_manifest,
    write_task_folder,
)

TASK_ID_RE = re.compile(r"[^A-Za-z0-9_.-]+")


# -- results ------------------------------------------------------------------------------------
@dataclass
class TaskOut:
    """A converted task, ready to be written as tasks/<id>/."""

    id: str
    toml: dict[str, Any]
    instruction: str
    environment: dict[str, str] = field(default_factory=dict)
    verifier: dict[str, str] = field(default_factory=dict)
    solution: dict[str, str] = field(default_factory=dict)
    build: dict[str, str] = field(default_factory=dict)  # the environment's build context
    notes: list[str] = field(default_factory=list)
    # Binary files, "<folder>/<path>" (environment/, verifier/) -> the source file's path
    # (the pack's blobs: `write_task`).
    blobs: dict[str, Path] = field(default_factory=dict)


class Unsupported(Exception):
    """The task needs what the sandbox cannot give; `reasons` says what."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


# -- test and solution scripts -----------------------------------------------------------------
# Kept as they are: offline in the verifier sandbox they do nothing (apt-get cannot fetch,
# the uv installer cannot download; uv/uvx are the verifier image's, `$HOME/.local/bin/env`
# exists and adds nothing), so they are not counted as needing the network.
_OFFLINE_NOOPS = [
    re.compile(p)
    for p in (
        r"^\s*(sudo\s+)?apt(-get)?\s+(-\S+\s+)*(update|install|clean)\b.*$",
        r"^\s*rm\s+-rf\s+/var/lib/apt.*$",
        r"^\s*curl\s.*astral\.sh/uv.*$",
        r"^\s*wget\s.*astral\.sh/uv.*$",
    )
]
# Dropped: they would build a Python environment in the agent's workdir, which the tests
# then trust (the image's pytest, or uvx's tool environment, serves instead).
_PREAMBLE = [
    re.compile(p)
    for p in (
        r"^\s*uv\s+(init|venv)\b.*$",
        r"^\s*(source|\.)\s+\.?venv/bin/activate\s*$",
        r"^\s*(uv\s+)?pip3?\s+install\s+(-q\s+)?(pytest|pytest-timeout)([=<>~!][^\s]*)?"
        r"(\s+(pytest|pytest-timeout)([=<>~!][^\s]*)?)*\s*$",
        r"^\s*uv\s+add\s+(--dev\s+)?(pytest|pytest-timeout)([=<>~!][^\s]*)?"
        r"(\s+(pytest|pytest-timeout)([=<>~!][^\s]*)?)*\s*$",
    )
]


def clean_test_script(text: str, *, tests_dir: str, logs_dir: str | None) -> tuple[str, list[str]]:
    """The script with the workdir-venv preamble dropped and paths moved; plus problems."""
    lines = []
    for line in text.splitlines():
        if any(p.match(line) for p in _PREAMBLE):
            continue
        line = re.sub(r"\buv\s+run\s+(--\S+\s+)*pytest\b", "python3 -m pytest", line)
        line = re.sub(r"(?<![\w/$])/tests(?=/|\b)", tests_dir, line)
        if logs_dir is not None:
            line = re.sub(r"/logs/verifier", logs_dir, line)
        lines.append(line)
    script = "\n".join(lines) + "\n"
    return script, network_problems(script)


def network_problems(script: str) -> list[str]:
    """The test script's first use of the network, if any (no-ops offline aside)."""
    body = "\n".join(
        ln
        for ln in script.splitlines()
        if not ln.lstrip().startswith("#")
        and not ignored_install(ln)
        and not any(p.match(ln) for p in _OFFLINE_NOOPS)
    )
    found = NETWORK.search(body)
    return [f"the tests need the network (`{found.group(0)}` in the test script)"] if found else []


USES_UV = re.compile(r"(^|[\s;&|(])(uvx|uv)\s", re.M)


def verifier_image_for(verifier: dict[str, str], script: str) -> str | None:
    """The verifier image a converted task needs: its own (tests/Dockerfile), the tools
    image when its tests call uv/uvx, else None (the agent's image)."""
    own = task_verifier_tag(verifier)
    if own is not None:
        return own
    body = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
    return TOOLS_IMAGE if USES_UV.search(body) else None


def wheel_notes(script: str) -> list[str]:
    missing = missing_wheels(script)
    if not missing:
        return []
    return [
        f"the tests ask uv for {', '.join(missing)}, which the verifier image cannot install "
        "offline: add them to images/verifier/wheels.txt and rebuild it (until then the "
        "tests fail)"
    ]


REMOTE_URL = re.compile(r"https?://(?!(?:localhost|127\.0\.0\.1|0\.0\.0\.0)[:/\"'\s])([^/:\"'\s]+)")


HTTP_CLIENT = re.compile(
    r"^\s*(?:import|from)\s+[^\n#]*\b(?:requests|httpx|urllib|aiohttp|http\.client)\b", re.M
)


def tests_network_problems(tests: dict[str, str]) -> list[str]:
    """Test files that call a remote server (an external judge, a download): they cannot
    pass in a sandbox with no network, so the oracle would score 0."""
    problems = []
    for name, text in sorted(tests.items()):
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        found = REMOTE_URL.search(code)
        if found and name.endswith(".py") and HTTP_CLIENT.search(text):
            problems.append(f"the tests reach {found.group(1)} over the network (tests/{name})")
    return problems


def solution_problems(script: str) -> list[str]:
    body = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
    found = NETWORK.search(body)
    if found:
        return [f"the solution needs the network (`{found.group(0)}`)"]
    return []


def compose_problems(folder: Path, shown: str) -> list[str]:
    """A compose file with more than one service needs daemons the sandbox cannot run."""
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (folder / name).exists():
            services = _compose_services(folder / name)
            if len(services) > 1:
                return [
                    f"{shown}{name} runs services ({', '.join(services)}); the sandbox runs "
                    "one container with no daemons"
                ]
            return []
    return []


def _compose_services(path: Path) -> list[str]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    services = data.get("services") if isinstance(data, dict) else None
    return sorted(services) if isinstance(services, dict) else []


def text_files(
    folder: Path, exclude: Iterable[str] = (), binaries: dict[str, Path] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The folder's text files and problems; its binary files go to `binaries` (relative
    path -> file: the pack's blobs) where given, else each is a problem."""
    files: dict[str, str] = {}
    problems: list[str] = []
    skip = set(exclude)
    if not folder.is_dir():
        return files, problems
    for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(folder).as_posix()
        if rel in skip or "__pycache__" in rel.split("/") or rel.split("/")[0].startswith("."):
            continue
        if not within(path, folder):
            problems.append(f"{folder.name}/{rel} is a symlink; packs hold files only")
            continue
        text = read_text(path)
        if text is not None:
            files[rel] = text
        elif binaries is not None:
            binaries[rel] = path
        else:
            problems.append(
                f"{folder.name}/{rel} is a binary file; only the environment's and the tests' "
                "binary files are kept"
            )
    return files, problems


def task_id(name: str) -> str:
    clean = TASK_ID_RE.sub("-", name).strip("-._") or "task"
    return clean if clean[0].isalnum() else f"t-{clean}"


def difficulty_of(value: Any) -> str:
    text = str(value or "").lower()
    return text if text in ("easy", "medium", "hard") else "medium"


def category_of(value: Any) -> str:
    return TASK_ID_RE.sub("-", str(value or "misc").lower()).strip("-") or "misc"


def verifier_wrapper(kind: str, script_name: str) -> str:
    """test.sh: run the original test script from the verifier directory, as its format does."""
    if kind == "terminal-bench":
        return (
            "#!/bin/bash\n"
            f"# Imported from Terminal-Bench: runs its run-tests.sh ({script_name}) with\n"
            "# TEST_DIR set to the staged tests; pass = exit 0.\n"
            'export TEST_DIR="$VERIFIER_DIR/tests"\n'
            f'exec bash "$VERIFIER_DIR/{script_name}"\n'
        )
    return (
        "#!/bin/bash\n"
        f"# Imported from Harbor: runs its tests/test.sh ({script_name}); it writes\n"
        "# $VERIFIER_LOGS/reward.txt (Harbor's /logs/verifier/reward.txt), which decides.\n"
        f'exec bash "$VERIFIER_DIR/{script_name}"\n'
    )


# Problems no image of the task's own can solve: what it names is not a file of the task
# (a link out of it, `..`, a URL), or not text.
NOT_BY_AN_IMAGE = (
    "outside the task folder",
    "symlink",
    "binary file",
    "is not in the task",
    "from a URL",
)


def build_context(
    plan: EnvPlan, folder: Path, exclude: set[str], dockerfile: str | None = None
) -> tuple[dict[str, str], list[str], list[str]]:
    """The task's Docker build context when its Dockerfile needs more than the terminal
    image gives (files, problems, notes); nothing when the plan converts as it is. The task
    then runs in the image built from it (envs/terminal/envimage.py) and the plan's files
    and setup steps are dropped: the image holds them."""
    if not plan.problems:
        return {}, [], []
    if any(m in p for p in plan.problems for m in NOT_BY_AN_IMAGE):
        problems, plan.problems = plan.problems, []
        return {}, problems, []  # no image helps: the task is refused with them all
    binaries: dict[str, Path] = {}  # the context's binary files: the pack's blobs
    found = collect_context(folder, exclude, binaries) if folder.is_dir() else ({}, [], [])
    files, problems, notes = found
    if dockerfile is not None:
        files[DOCKERFILE] = dockerfile
    notes.append(
        "runs in the image built from its Dockerfile (docker; `palaestra images build "
        f"--pack`): {'; '.join(plan.problems)}"
    )
    plan.files, plan.binaries, plan.setup, plan.problems = {}, {}, [], []
    plan.build_binaries = binaries
    if plan.path:
        plan.env["PATH"] = re.sub(r"\$\{PATH\}|\$PATH\b", BASE_PATH, plan.path)
    return files, problems, notes


# -- Terminal-Bench ------------------------------------------------------------------------------
TB_META = {
    "task.yaml",
    "Dockerfile",
    "docker-compose.yaml",
    "docker-compose.yml",
    "run-tests.sh",
    "solution.sh",
    "solution.yaml",
    "tests",
    "solution",
}
# What of a Terminal-Bench folder is not its build context: the task's own metadata, and its
# solution (no Dockerfile needs the answer in the agent's image).
TB_CONTEXT_EXCLUDE = {"task.yaml", "solution.sh", "solution.yaml", "docker-compose.yaml",
                      "docker-compose.yml"}  # fmt: skip


def convert_terminal_bench(
    folder: Path, split: str, pack_short: str, egress_allow: tuple[str, ...] | None = None
) -> TaskOut:
    """One Terminal-Bench task folder as a terminal task; raises Unsupported. `egress_allow`:
    the operator's (None: not known here), which test-time installs need."""
    problems: list[str] = []
    notes: list[str] = []
    try:
        meta = yaml.safe_load((folder / "task.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise Unsupported([f"task.yaml cannot be read: {exc}"]) from None
    if not isinstance(meta, dict):
        raise Unsupported(["task.yaml is not a mapping"])
    instruction = meta.get("instruction")
    if not instruction and isinstance(meta.get("descriptions"), list):
        for item in meta["descriptions"]:
            if isinstance(item, dict) and item.get("key", "base") == "base":
                instruction = item.get("description")
                break
    if not isinstance(instruction, str) or not instruction.strip():
        problems.append("task.yaml has no instruction")
        instruction = ""
    problems.extend(compose_problems(folder, ""))
    dockerfile = folder / "Dockerfile"
    if not dockerfile.exists():
        raise Unsupported([*problems, "no Dockerfile"])
    plan = convert_dockerfile(
        dockerfile.read_text(encoding="utf-8"), folder, exclude=TB_META | {"Dockerfile"}
    )
    notes += plan.notes
    if (folder / "solution.sh").exists():
        solve = (folder / "solution.sh").read_text(encoding="utf-8")
        problems += solution_problems(solve)
    elif (folder / "solution.yaml").exists():
        problems.append("solution.yaml (a keystroke solution) is not supported; add solution.sh")
        solve = ""
    else:
        problems.append("no solution.sh")
        solve = ""
    solve, more = take_oracle_payload(plan, solve)
    notes += more
    build, bad, more = build_context(plan, folder, TB_CONTEXT_EXCLUDE)
    problems += bad
    notes += more
    binaries: dict[str, Path] = {}
    tests, bad = text_files(folder / "tests", binaries=binaries)
    problems += bad + tests_network_problems(tests)
    run_tests = folder / "run-tests.sh"
    original = (
        run_tests.read_text(encoding="utf-8")
        if run_tests.exists()
        else "#!/bin/bash\npython3 -m pytest $TEST_DIR/test_outputs.py -rA\n"
    )
    script, bad = clean_test_script(original, tests_dir="$VERIFIER_DIR/tests", logs_dir=None)
    script, bad, installs, more = verifier_installs(
        script, bad, egress_allow, network_problems, own_image=bool(build)
    )
    problems += bad
    notes += more
    if problems:
        raise Unsupported(problems)
    verifier = {f"tests/{k}": v for k, v in tests.items()}
    verifier["run-tests.sh"] = script
    verifier["test.sh"] = verifier_wrapper("terminal-bench", "run-tests.sh")
    image = verifier_image_for(verifier, script)
    staged = testpaths.terminal_bench(folder, verifier, plan, build, solve, image)
    if staged.own_image is not None:  # newer Python than 3.11's: its own image (pyminor.py)
        plan.problems.append(staged.own_image)
        build, bad, more = build_context(plan, folder, TB_CONTEXT_EXCLUDE)
        staged.problems += bad
        notes += more
    if staged.problems:
        raise Unsupported(staged.problems)
    notes += staged.notes
    notes += wheel_notes(script) if image is not None else []
    return task_out(
        folder,
        plan,
        build=build,
        split=split,
        domain=f"{pack_short}/{category_of(meta.get('category'))}",
        difficulty=difficulty_of(meta.get("difficulty")),
        timeout=meta.get("max_test_timeout_sec"),
        instruction=instruction,
        verifier=verifier,
        solve=solve,
        notes=notes,
        private={**installs, **({"verifier_image": image} if image is not None else {})},
        blobs={f"verifier/tests/{k}": v for k, v in binaries.items()},
    )


def task_out(
    folder: Path,
    plan: EnvPlan,
    *,
    build: dict[str, str],
    split: str,
    domain: str,
    difficulty: str,
    timeout: object,
    instruction: str,
    verifier: dict[str, str],
    solve: str,
    notes: list[str],
    public_extra: dict[str, Any] | None = None,
    private: dict[str, Any] | None = None,
    blobs: dict[str, Path] | None = None,
) -> TaskOut:
    """The terminal task both formats become, once their own parts are converted; `blobs`:
    its binary files beyond the environment's ("verifier/<path>" -> file)."""
    environment = dict(plan.files)
    if plan.setup:
        environment["setup.sh"] = "#!/bin/bash\nset -e\n" + "\n".join(plan.setup) + "\n"
    public: dict[str, Any] = {"workdir": plan.workdir}
    if plan.env:
        public["env"] = plan.env
    if isinstance(timeout, int | float) and timeout > 0:
        public["timeout_s"] = float(timeout)
    public.update(public_extra or {})
    toml = {
        "family": "terminal",
        "domain": domain,
        "split": split,
        "difficulty": difficulty,
        "public": public,
    }
    if private:
        toml["private"] = private
    return TaskOut(
        id=task_id(folder.name),
        toml=toml,
        instruction=instruction.strip() + "\n",
        environment=environment,
        verifier=verifier,
        solution={"solve.sh": solve},
        build=build,
        notes=notes,
        blobs={
            **{f"environment/{k}": v for k, v in plan.binaries.items()},
            **{f"build/{k}": v for k, v in plan.build_binaries.items()},
            **(blobs or {}),
        },
    )


def blob_problems(task: TaskOut, max_blob: int) -> list[str]:
    """Its binary files over the one-file limit, each named with its size and the setting."""
    return [
        too_large(f"{key} (from {path.name})", size, max_blob)
        for key, path in sorted(task.blobs.items())
        if (size := path.stat().st_size) > max_blob
    ]


def write_task(tasks_dir: Path, task: TaskOut) -> None:
    """The converted task as `tasks_dir/<id>/` (the directory form); its binary files as the
    pack's blobs (`tasks_dir/../blobs/<sha256>`), named in task.toml by their digest."""
    refs = write_blobs(tasks_dir.parent, task.blobs)
    for side, maps in SIDES.items():
        mine = {k: v for k, v in refs.items() if k.split("/", 1)[0] in maps}
        if mine:
            task.toml.setdefault(side, {})[BLOBS_FIELD] = mine
    folders = {
        "environment": task.environment,
        "verifier": task.verifier,
        "solution": task.solution,
        **({"build": task.build} if task.build else {}),
    }
    write_task_folder(tasks_dir, task.id, task.toml, task.instruction, folders)


def find_tasks(src: Path, marker: str) -> list[Path]:
    """`src` itself if it is a task folder, else its subfolders that are."""
    if (src / marker).is_file():
        return [src]
    return sorted(p for p in src.iterdir() if p.is_dir() and (p / marker).is_file())


def import_tasks(
    fmt: str,
    src: Path,
    out: Path,
    *,
    name: str | None = None,
    version: str = "0.1.0",
    split: str | None = None,
    force: bool = False,
    ceilings: Ceilings | None = None,
    max_blob_bytes: int = DEFAULT_MAX_BLOB,
    max_blobs_bytes: int = DEFAULT_MAX_BLOBS,
    bases: BaseImages | None = None,
) -> ImportReport:
    """Convert every task folder under `src` into a new pack at `out` (see the module doc).
    A task whose binary file is over `max_blob_bytes`, or whose new ones would take the
    pack's over `max_blobs_bytes` (Settings' max_pack_blob*_bytes), is skipped, and so is
    one whose environment's base image `bases` cannot serve (Settings' image_aliases and
    image_registry_mirror; default: the stand-ins, no mirror)."""
    bases = bases or BaseImages(DEFAULT_IMAGE_ALIASES)
    from palaestra.envs.terminal.downloads import serve_downloads  # (importer.py is at its size)
    from palaestra.envs.terminal.harbor.reader import HarborReader  # it builds on this module

    harbor = HarborReader(src, ceilings)
    egress = ceilings.egress_allow if ceilings else None
    tb: Callable[[Path, str, str], TaskOut] = functools.partial(
        convert_terminal_bench, egress_allow=egress
    )
    converters = {"terminal-bench": (tb, "task.yaml"),
                  "harbor": (harbor.convert, "task.toml")}  # fmt: skip
    convert, marker = converters[fmt]
    if not src.is_dir():
        raise ValueError(f"{src} is not a directory")
    folders = find_tasks(src, marker)
    if not folders:
        raise ValueError(f"no {fmt} task folders (with {marker}) under {src}")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ValueError(f"{out} exists and is not empty; choose a new folder or --force")
        shutil.rmtree(out)
    pack_name = name or f"imported/{task_id(src.resolve().name).lower()}"
    pack_short = pack_name.split("/")[-1]
    report = ImportReport(format=fmt, source=str(src), out=str(out))
    converted: list[TaskOut] = []
    seen: set[str] = set()
    blob_sizes: dict[str, int] = {}  # the pack's blobs so far: source file -> disk cost
    for folder in folders:
        tid = task_id(folder.name)
        try:
            task = convert(folder, split or "train", pack_short)
            if fmt == "harbor" and split is None:  # an exported task keeps its own split
                task.toml["split"] = harbor.split_of(folder) or task.toml["split"]
        except Unsupported as exc:
            report.skipped[tid] = exc.reasons
            continue
        if task.id in seen:
            report.skipped[tid] = [f"duplicate task id {task.id!r} (folder {folder.name})"]
            continue
        base_bad, base_notes = serve_downloads(task.build, bases)
        bad, said = base_problems(task.build.get(DOCKERFILE, ""), bases)
        base_bad, base_notes = base_bad + bad, base_notes + said
        if base_bad:
            report.skipped[tid] = base_bad
            continue
        task.notes += base_notes
        if too_big := blob_problems(task, max_blob_bytes):
            report.skipped[tid] = too_big
            continue
        mine = {str(p): disk_cost(p.stat().st_size) for p in task.blobs.values()}
        total = sum({**blob_sizes, **mine}.values())
        if total > max_blobs_bytes:
            report.skipped[tid] = [
                f"its binary files would take the pack's to {total} bytes, over the limit of "
                f"{max_blobs_bytes} (max_pack_blobs_bytes)"
            ]
            continue
        blob_sizes.update(mine)
        seen.add(task.id)
        converted.append(task)
        report.imported[task.id] = task.notes
    out.mkdir(parents=True, exist_ok=True)
    timeouts = [float(t.toml["public"].get("timeout_s", 120)) for t in converted] or [120.0]
    manifest = {
        "name": pack_name,
        "version": version,
        "description": f"Imported from {fmt} tasks in {src.name} by `palaestra pack import`.",
        "families": ["terminal"],
        "splits": {
            s: {"sealed": s == "heldout"}
            for s in sorted({t.toml["split"] for t in converted} or {split or "train"})
        },
        "checks": {"timeout_s": max(timeouts) * 2 + 60},
    }
    write_manifest(out, manifest)
    for task in converted:
        write_task(out / "tasks", task)
    (out / REPORT_FILE).write_text(
        json.dumps(report.as_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return report
