"""`palaestra pack import terminal-bench|harbor SRC OUT`: other task formats into a pack.

Both formats describe a task as a folder: an instruction, a Docker environment, a test
script and an oracle solution.

* **Terminal-Bench** (`task.yaml`, `Dockerfile`, `docker-compose.yaml`, `run-tests.sh`,
  `tests/`, `solution.sh`): tests run from ``$TEST_DIR`` (``/tests``); pass = the test
  script exits 0 (pytest).
* **Harbor** (`task.toml`, `instruction.md`, `environment/Dockerfile`, `tests/test.sh`,
  `solution/solve.sh`): tests in ``/tests``; the script writes ``/logs/verifier/reward.txt``.

Each becomes a `terminal` task folder (docs/terminal.md): the Dockerfile's WORKDIR is the
task's workdir, files it COPYs become `environment/` files, its other RUN steps become
`environment/setup.sh`, ENV lines the task's `env`; the tests go to `verifier/` with a
`test.sh` that runs the original script with its paths moved (``/tests`` → the verifier
directory, ``/logs/verifier`` → ``$VERIFIER_LOGS``) and the usual "install uv and pytest
from the network" preamble dropped (the sandbox has pytest and no network).

A task that needs what the sandbox cannot give -- the network (pip/uv/npm installs, curl,
git clone), a base image with another toolchain, services (docker-compose with more than
one service, a daemon as CMD/ENTRYPOINT), GPUs, files outside the workdir, binary files,
keystroke solutions -- is *skipped and reported by name with the reason* (on the console
and in ``OUT/import-report.json``), never dropped silently. `palaestra pack check OUT`
then proves what was imported.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import_app = typer.Typer(
    help="Import tasks from other formats into a pack (docs/terminal.md).",
    no_args_is_help=True,
)
console = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True)

REPORT_FILE = "import-report.json"
DEFAULT_WORKDIR = "/app"
TASK_ID_RE = re.compile(r"[^A-Za-z0-9_.-]+")
# apt packages the terminal image (and a bootstrapped host) provide.
PROVIDED_APT = {
    "bash", "coreutils", "grep", "sed", "gawk", "mawk", "findutils", "diffutils", "patch",
    "tar", "gzip", "bzip2", "xz-utils", "jq", "sqlite3", "git", "gcc", "g++", "libc6-dev",
    "make", "build-essential", "python3", "python3-pytest", "file", "less", "procps",
    "ca-certificates", "python-is-python3", "unzip", "zip",
}  # fmt: skip
# Installed by the formats' own harnesses (terminal sessions, downloads), not by tasks.
HARNESS_APT = {
    "tmux", "asciinema", "curl", "wget", "vim", "nano", "python3-pip", "python3-venv",
    "apt-utils", "software-properties-common", "gnupg", "lsb-release",
}  # fmt: skip
PYTEST_PKGS = re.compile(r"^(pytest|pytest-timeout|uv)([=<>~!].*)?$", re.IGNORECASE)
# Base images whose userland the terminal image stands in for (Debian/Ubuntu + python).
KNOWN_BASES = (
    "ghcr.io/laude-institute/t-bench/python-3-13",
    "ghcr.io/laude-institute/t-bench/ubuntu-24-04",
    "ghcr.io/laude-institute/t-bench/base",
    "python:3",
    "python:latest",
    "debian:",
    "ubuntu:",
    "buildpack-deps:",
    "palaestra/",
)
NETWORK = re.compile(
    r"\b(curl|wget)\b|\bgit\s+clone\b|\bpip3?\s+install\b|\bpython3?\s+-m\s+pip\s+install\b"
    r"|\buv\s+(pip\s+install|add|sync|tool\s+install)\b|\bnpm\s+(install|i|ci)\b|\byarn\s+add\b"
    r"|\bcargo\s+(install|add)\b|\bgo\s+(get|install)\b|\bapt(-get)?\s+install\b"
    r"|https?://"
)
SHELLS = {"bash", "sh", "/bin/bash", "/bin/sh", "zsh", "sleep", "tail"}
WRITE_CMDS = {"mkdir", "touch", "cp", "mv", "ln", "chmod", "chown", "tee", "install", "rm"}


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
    notes: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    format: str
    source: str
    out: str
    imported: dict[str, list[str]] = field(default_factory=dict)  # id -> notes
    skipped: dict[str, list[str]] = field(default_factory=dict)  # id -> reasons

    def as_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "source": self.source,
            "imported": [{"id": k, "notes": v} for k, v in sorted(self.imported.items())],
            "skipped": [{"id": k, "reasons": v} for k, v in sorted(self.skipped.items())],
        }


class Unsupported(Exception):
    """The task needs what the sandbox cannot give; `reasons` says what."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


# -- the Dockerfile -------------------------------------------------------------------------------
@dataclass
class EnvPlan:
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # relative to the workdir
    setup: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        head, _, rest = buf.strip().partition(" ")
        out.append((head.upper(), rest.strip()))
        buf = ""
    if buf.strip():
        head, _, rest = buf.strip().partition(" ")
        out.append((head.upper(), rest.strip()))
    return out


def _words(args: str) -> list[str]:
    if args.startswith("["):
        try:
            value = json.loads(args)
            if isinstance(value, list):
                return [str(v) for v in value]
        except ValueError:
            pass
    try:
        return shlex.split(args)
    except ValueError:
        return args.split()


def _commands(script: str) -> list[str]:
    """A shell line split at `&&`, `||`, `;` and newlines (quotes respected roughly)."""
    parts = re.split(r"\s*(?:&&|\|\||;|\n)\s*", script)
    return [p.strip() for p in parts if p.strip()]


def _packages(words: list[str]) -> list[str]:
    return [w for w in words if not w.startswith("-")]


def _outside(path: str, workdir: str) -> bool:
    p = posixpath.normpath(path)
    inside = (workdir, "/tmp", "/dev/null", "/dev/stdout", "/dev/stderr")
    return not any(p == d or p.startswith(d.rstrip("/") + "/") for d in inside)


def _classify_run(cmd: str, plan: EnvPlan) -> None:
    words = _words(cmd)
    if not words:
        return
    head = words[0]
    if head in ("apt-get", "apt") or (head == "DEBIAN_FRONTEND=noninteractive" and len(words) > 1):
        if head.startswith("DEBIAN_FRONTEND"):
            words = words[1:]
        if len(words) > 1 and words[1] == "install":
            pkgs = {re.split(r"[=:]", p)[0] for p in _packages(words[2:])}
            missing = sorted(pkgs - PROVIDED_APT - HARNESS_APT)
            if missing:
                plan.problems.append(
                    f"the Dockerfile installs apt packages the sandbox does not have: "
                    f"{', '.join(missing)}"
                )
        return  # update, clean, install of what we have: nothing to do
    if head == "rm" and any(w.startswith("/var/lib/apt") for w in words):
        return
    joined = " ".join(words)
    if re.search(r"\b(pip3?|uv)\b.*\b(install|add)\b", joined):
        wanted = [
            p
            for p in _packages(words)
            if p not in ("pip", "pip3", "uv", "install", "add", "python", "python3", "-m")
        ]
        extra = [p for p in wanted if not PYTEST_PKGS.match(p)]
        if extra:
            plan.problems.append(
                f"the Dockerfile installs Python packages from the network: {', '.join(extra)}"
            )
        return
    if NETWORK.search(cmd):
        plan.problems.append(f"the Dockerfile needs the network: `{cmd[:120]}`")
        return
    if head in ("useradd", "adduser", "groupadd", "systemctl", "service", "update-alternatives"):
        plan.problems.append(f"the Dockerfile needs root: `{cmd[:120]}`")
        return
    targets = [w for w in words[1:] if w.startswith("/")] if head in WRITE_CMDS else []
    targets += re.findall(r">>?\s*(/[^\s;&|]+)", cmd)
    outside = [t for t in targets if _outside(t, plan.workdir)]
    if outside:
        plan.problems.append(
            f"the Dockerfile writes outside the workdir {plan.workdir} ({', '.join(outside)}): "
            f"`{cmd[:120]}`"
        )
        return
    plan.setup.append(cmd)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def _copy(plan: EnvPlan, context: Path, sources: list[str], dest: str, exclude: set[str]) -> None:
    dest_abs = dest if dest.startswith("/") else posixpath.join(plan.workdir, dest)
    dest_abs = posixpath.normpath(dest_abs)
    if _outside(dest_abs, plan.workdir) and dest_abs != posixpath.normpath(plan.workdir):
        plan.problems.append(f"the Dockerfile copies files outside the workdir: to {dest}")
        return
    rel_dest = posixpath.relpath(dest_abs, plan.workdir)
    as_dir = dest.endswith("/") or len(sources) > 1 or dest in (".", "./") or rel_dest == "."
    for src in sources:
        if re.match(r"^[a-z]+://", src):
            plan.problems.append(f"the Dockerfile downloads {src} (ADD from a URL needs network)")
            continue
        matches = sorted(context.glob(src.lstrip("/"))) if any(c in src for c in "*?[") else []
        paths = matches or [context / src.lstrip("/")]
        for path in paths:
            if not path.exists():
                plan.problems.append(f"the Dockerfile copies {src}, which is not in the task")
                continue
            if path.is_dir():
                for f in sorted(p for p in path.rglob("*") if p.is_file()):
                    rel_src = f.relative_to(context).as_posix()
                    if _excluded(rel_src, exclude):
                        continue
                    inner = f.relative_to(path).as_posix()
                    _add_file(plan, f, posixpath.normpath(posixpath.join(rel_dest, inner)))
            else:
                if _excluded(path.relative_to(context).as_posix(), exclude):
                    continue
                target = posixpath.join(rel_dest, path.name) if as_dir else rel_dest
                _add_file(plan, path, posixpath.normpath(target))


def _excluded(rel: str, exclude: set[str]) -> bool:
    top = rel.split("/")[0]
    return top in exclude or any(fnmatch.fnmatch(rel, pat) for pat in exclude)


def _add_file(plan: EnvPlan, path: Path, rel: str) -> None:
    text = _read_text(path)
    if text is None:
        plan.problems.append(f"{path.name} is a binary file; packs hold text only")
        return
    if rel.startswith("../") or rel == "..":
        plan.problems.append(f"{path.name} would land outside the workdir")
        return
    plan.files[rel] = text


def convert_dockerfile(text: str, context: Path, exclude: set[str]) -> EnvPlan:
    """What a Dockerfile asks for, as our environment (see the module docstring)."""
    plan = EnvPlan()
    stages = 0
    for instr, args in dockerfile_instructions(text):
        if instr == "FROM":
            stages += 1
            image = _words(args)[0] if _words(args) else ""
            if stages > 1:
                plan.problems.append("a multi-stage Dockerfile cannot be reproduced")
            elif not image.startswith(KNOWN_BASES):
                plan.problems.append(
                    f"base image {image} brings a userland the sandbox does not have "
                    "(the terminal image is Debian bookworm with python3)"
                )
            elif not image.startswith(("python:3.11", "palaestra/")) and "python" in image:
                plan.notes.append(f"base image {image}: runs on Debian bookworm's python3.11")
        elif instr == "WORKDIR":
            path = _words(args)[0] if _words(args) else DEFAULT_WORKDIR
            plan.workdir = posixpath.normpath(posixpath.join(plan.workdir, path))
        elif instr == "ENV":
            words = _words(args)
            pairs = (
                [w.split("=", 1) for w in words]
                if words and "=" in words[0]
                else [[words[0], " ".join(words[1:])]]
                if words
                else []
            )
            for pair in pairs:
                if len(pair) == 2 and pair[0] not in ("PATH", "HOME", "DEBIAN_FRONTEND"):
                    plan.env[pair[0]] = pair[1]
        elif instr in ("COPY", "ADD"):
            words = [w for w in _words(args) if not w.startswith("--")]
            if len(words) >= 2:
                _copy(plan, context, words[:-1], words[-1], exclude)
        elif instr == "RUN":
            body = args
            if body.startswith("["):
                body = " ".join(_words(body))
            for cmd in _commands(body):
                _classify_run(cmd, plan)
        elif instr in ("CMD", "ENTRYPOINT"):
            words = _words(args)
            if words and words[0] not in SHELLS:
                plan.problems.append(
                    f"the container runs a service ({instr} {' '.join(words)[:80]}); the "
                    "sandbox runs no daemons"
                )
        elif instr in ("EXPOSE", "HEALTHCHECK", "VOLUME"):
            plan.problems.append(f"{instr} {args}: the task expects a service or a volume")
        elif instr in ("USER", "LABEL", "ARG", "SHELL", "STOPSIGNAL", "MAINTAINER", "ONBUILD"):
            if instr == "USER":
                plan.notes.append("USER ignored: the sandbox runs as an unprivileged uid")
        else:
            plan.problems.append(f"unknown Dockerfile instruction {instr}")
    return plan


# -- test and solution scripts -----------------------------------------------------------------
_PREAMBLE = [
    re.compile(p)
    for p in (
        r"^\s*(sudo\s+)?apt(-get)?\s+(update|install|clean)\b.*$",
        r"^\s*rm\s+-rf\s+/var/lib/apt.*$",
        r"^\s*curl\s.*astral\.sh/uv.*$",
        r"^\s*wget\s.*astral\.sh/uv.*$",
        r"^\s*(source|\.)\s+\$HOME/\.local/bin/env\s*$",
        r"^\s*export\s+PATH=\"?\$HOME/\.local/bin.*$",
        r"^\s*uv\s+(init|venv)\b.*$",
        r"^\s*(source|\.)\s+\.?venv/bin/activate\s*$",
        r"^\s*(uv\s+)?pip3?\s+install\s+(-q\s+)?(pytest|pytest-timeout)([=<>~!][^\s]*)?"
        r"(\s+(pytest|pytest-timeout)([=<>~!][^\s]*)?)*\s*$",
        r"^\s*uv\s+add\s+(--dev\s+)?(pytest|pytest-timeout)([=<>~!][^\s]*)?"
        r"(\s+(pytest|pytest-timeout)([=<>~!][^\s]*)?)*\s*$",
    )
]


def clean_test_script(text: str, *, tests_dir: str, logs_dir: str | None) -> tuple[str, list[str]]:
    """The script with the pytest-install preamble dropped and paths moved; plus problems."""
    lines = []
    dropped = 0
    for line in text.splitlines():
        if any(p.match(line) for p in _PREAMBLE):
            dropped += 1
            continue
        line = re.sub(r"\buv\s+run\s+(--\S+\s+)*pytest\b", "python3 -m pytest", line)
        line = re.sub(r"(?<![\w/$])/tests(?=/|\b)", tests_dir, line)
        if logs_dir is not None:
            line = re.sub(r"/logs/verifier", logs_dir, line)
        lines.append(line)
    script = "\n".join(lines) + "\n"
    problems = []
    body = "\n".join(ln for ln in lines if not ln.lstrip().startswith("#"))
    found = NETWORK.search(body)
    if found:
        problems.append(f"the tests need the network (`{found.group(0)}` in the test script)")
    return script, problems


def solution_problems(script: str) -> list[str]:
    body = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
    found = NETWORK.search(body)
    if found:
        return [f"the solution needs the network (`{found.group(0)}`)"]
    return []


def _compose_problems(folder: Path, shown: str) -> list[str]:
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


def _text_files(folder: Path, exclude: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    files: dict[str, str] = {}
    problems: list[str] = []
    skip = set(exclude)
    if not folder.is_dir():
        return files, problems
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in skip or "__pycache__" in rel.split("/") or rel.split("/")[0].startswith("."):
            continue
        text = _read_text(path)
        if text is None:
            problems.append(f"{folder.name}/{rel} is a binary file; packs hold text only")
        else:
            files[rel] = text
    return files, problems


def task_id(name: str) -> str:
    clean = TASK_ID_RE.sub("-", name).strip("-._") or "task"
    return clean if clean[0].isalnum() else f"t-{clean}"


def _difficulty(value: Any) -> str:
    text = str(value or "").lower()
    return text if text in ("easy", "medium", "hard") else "medium"


def _category(value: Any) -> str:
    return TASK_ID_RE.sub("-", str(value or "misc").lower()).strip("-") or "misc"


def _verifier_wrapper(kind: str, script_name: str) -> str:
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


def convert_terminal_bench(folder: Path, split: str, pack_short: str) -> TaskOut:
    """One Terminal-Bench task folder as a terminal task; raises Unsupported."""
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
    problems.extend(_compose_problems(folder, ""))
    dockerfile = folder / "Dockerfile"
    if not dockerfile.exists():
        raise Unsupported([*problems, "no Dockerfile"])
    plan = convert_dockerfile(
        dockerfile.read_text(encoding="utf-8"), folder, exclude=TB_META | {"Dockerfile"}
    )
    problems += plan.problems
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
    tests, bad = _text_files(folder / "tests")
    problems += bad
    run_tests = folder / "run-tests.sh"
    original = (
        run_tests.read_text(encoding="utf-8")
        if run_tests.exists()
        else "#!/bin/bash\npython3 -m pytest $TEST_DIR/test_outputs.py -rA\n"
    )
    script, bad = clean_test_script(original, tests_dir="$VERIFIER_DIR/tests", logs_dir=None)
    problems += bad
    if problems:
        raise Unsupported(problems)
    verifier = {f"tests/{k}": v for k, v in tests.items()}
    verifier["run-tests.sh"] = script
    verifier["test.sh"] = _verifier_wrapper("terminal-bench", "run-tests.sh")
    return _task_out(
        folder,
        plan,
        split=split,
        domain=f"{pack_short}/{_category(meta.get('category'))}",
        difficulty=_difficulty(meta.get("difficulty")),
        timeout=meta.get("max_test_timeout_sec"),
        instruction=instruction,
        verifier=verifier,
        solve=solve,
        notes=notes,
    )


def _task_out(
    folder: Path,
    plan: EnvPlan,
    *,
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
) -> TaskOut:
    """The terminal task both formats become, once their own parts are converted."""
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
        notes=notes,
    )


# -- Harbor ------------------------------------------------------------------------------------
def convert_harbor(folder: Path, split: str, pack_short: str) -> TaskOut:
    """One Harbor task folder as a terminal task; raises Unsupported."""
    problems: list[str] = []
    notes: list[str] = []
    try:
        meta = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise Unsupported([f"task.toml cannot be read: {exc}"]) from None
    try:
        instruction = (folder / "instruction.md").read_text(encoding="utf-8")
    except OSError:
        problems.append("no instruction.md")
        instruction = ""
    env_meta = meta.get("environment") if isinstance(meta.get("environment"), dict) else {}
    assert isinstance(env_meta, dict)
    gpus = env_meta.get("gpus") or env_meta.get("gpu_count") or 0
    if isinstance(gpus, int | float) and gpus > 0:
        problems.append(f"the task asks for {gpus:g} GPU(s); the sandbox has none")
    if env_meta.get("allow_internet") is True and env_meta.get("require_internet") is True:
        problems.append("the task requires internet access")
    env_dir = folder / "environment"
    problems.extend(_compose_problems(env_dir, "environment/"))
    dockerfile = env_dir / "Dockerfile"
    if dockerfile.exists():
        plan = convert_dockerfile(
            dockerfile.read_text(encoding="utf-8"),
            env_dir,
            exclude={"Dockerfile", "docker-compose.yaml", "docker-compose.yml"},
        )
    elif isinstance(env_meta.get("docker_image"), str):
        plan = convert_dockerfile(f"FROM {env_meta['docker_image']}\n", env_dir, exclude=set())
    else:
        plan = EnvPlan()
        problems.append("no environment/Dockerfile")
    problems += plan.problems
    notes += plan.notes
    solve_path = folder / "solution" / "solve.sh"
    solution_files, bad = _text_files(folder / "solution")
    problems += bad
    solve = solution_files.pop("solve.sh", None)
    if solve is None or not solve_path.exists():
        problems.append("no solution/solve.sh")
        solve = ""
    problems += solution_problems(solve)
    if solution_files:
        solve = _embed_solution_files(solve, solution_files)
        notes.append(f"solution files embedded in solve.sh: {', '.join(sorted(solution_files))}")
    tests, bad = _text_files(folder / "tests")
    problems += bad
    test_sh = tests.pop("test.sh", None)
    if test_sh is None:
        problems.append("no tests/test.sh")
        test_sh = ""
    script, bad = clean_test_script(
        test_sh, tests_dir="$VERIFIER_DIR/tests", logs_dir="$VERIFIER_LOGS"
    )
    problems += bad
    if problems:
        raise Unsupported(problems)
    verifier = {f"tests/{k}": v for k, v in tests.items()}
    verifier["harbor-test.sh"] = script
    verifier["test.sh"] = _verifier_wrapper("harbor", "harbor-test.sh")
    verifier_meta = meta.get("verifier") if isinstance(meta.get("verifier"), dict) else {}
    info = meta.get("metadata") if isinstance(meta.get("metadata"), dict) else {}
    assert isinstance(verifier_meta, dict) and isinstance(info, dict)
    memory = env_meta.get("memory_mb")
    return _task_out(
        folder,
        plan,
        split=split,
        domain=f"{pack_short}/{_category(info.get('category'))}",
        difficulty=_difficulty(info.get("difficulty")),
        timeout=verifier_meta.get("timeout_sec"),
        instruction=instruction,
        verifier=verifier,
        solve=solve,
        notes=notes,
        public_extra=(
            {"memory_mb": min(memory, 4096)} if isinstance(memory, int) and memory > 0 else None
        ),
        # Harbor's tests/test.sh decides through $VERIFIER_LOGS/reward.txt: the task says
        # so, and only a task that says so has its reward file read (docs/terminal.md).
        private={"reward_file": True},
    )


def _embed_solution_files(solve: str, files: dict[str, str]) -> str:
    """solve.sh that first writes Harbor's other solution files (its /solution) to a temp dir."""
    lines = ["#!/bin/bash", "SOLUTION_DIR=$(mktemp -d)"]
    for rel, text in sorted(files.items()):
        tag = "PALAESTRA_EOF"
        while tag in text:
            tag += "_"
        target = f'"$SOLUTION_DIR"/{shlex.quote(rel)}'
        lines.append(f'mkdir -p "$(dirname {target})"')
        newline = "" if text.endswith("\n") else "\n"
        lines.append(f"cat > {target} <<'{tag}'\n{text}{newline}{tag}")
    body = re.sub(r"(?<![\w/$])/solution(?=/|\b)", '"$SOLUTION_DIR"', solve)
    lines.append(f"bash -c {shlex.quote(body)}")
    return "\n".join(lines) + "\n"


# -- writing the pack ------------------------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def toml_text(data: dict[str, Any]) -> str:
    """A small TOML writer: top-level scalars, then one level of tables."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, table in data.items():
        if isinstance(table, dict):
            lines.append(f"\n[{key}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _write_files(base: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def write_task(tasks_dir: Path, task: TaskOut) -> None:
    folder = tasks_dir / task.id
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text(toml_text(task.toml), encoding="utf-8")
    (folder / "instruction.md").write_text(task.instruction, encoding="utf-8")
    _write_files(folder / "environment", task.environment)
    _write_files(folder / "verifier", task.verifier)
    _write_files(folder / "solution", task.solution)


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
    split: str = "train",
    force: bool = False,
) -> ImportReport:
    """Convert every task folder under `src` into a new pack at `out` (see the module doc)."""
    converters = {"terminal-bench": (convert_terminal_bench, "task.yaml"),
                  "harbor": (convert_harbor, "task.toml")}  # fmt: skip
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
    for folder in folders:
        tid = task_id(folder.name)
        try:
            task = convert(folder, split, pack_short)
        except Unsupported as exc:
            report.skipped[tid] = exc.reasons
            continue
        if task.id in seen:
            report.skipped[tid] = [f"duplicate task id {task.id!r} (folder {folder.name})"]
            continue
        seen.add(task.id)
        converted.append(task)
        report.imported[task.id] = task.notes
    out.mkdir(parents=True, exist_ok=True)
    timeouts = [float(t.toml["public"].get("timeout_s", 120)) for t in converted] or [120.0]
    lines = [
        f"name = {_toml_value(pack_name)}",
        f"version = {_toml_value(version)}",
        "description = "
        + _toml_value(f"Imported from {fmt} tasks in {src.name} by `palaestra pack import`."),
        'families = ["terminal"]',
        f"\n[splits.{split}]\nsealed = {_toml_value(split == 'heldout')}",
        f"\n[checks]\ntimeout_s = {max(timeouts) * 2 + 60!r}",
    ]
    (out / "pack.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for task in converted:
        write_task(out / "tasks", task)
    (out / REPORT_FILE).write_text(
        json.dumps(report.as_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return report


def render_import(report: ImportReport, out: Console) -> None:
    table = Table("task", "result", "why / notes", title=f"{report.format} → {report.out}")
    for tid, notes in sorted(report.imported.items()):
        table.add_row(escape(tid), "[green]imported[/green]", escape("; ".join(notes)))
    for tid, reasons in sorted(report.skipped.items()):
        table.add_row(escape(tid), "[red]skipped[/red]", escape("; ".join(reasons)))
    out.print(table)
    out.print(
        f"{len(report.imported)} imported, {len(report.skipped)} skipped (reasons above and in "
        f"{Path(report.out) / REPORT_FILE}); next: palaestra pack check {report.out}"
    )


Src = Annotated[Path, typer.Argument(help="a task folder, or a folder of task folders")]
Out = Annotated[Path, typer.Argument(help="the pack folder to write (new or empty)")]
Name = Annotated[str | None, typer.Option(help="pack name org/name (default imported/<src>)")]
Version = Annotated[str, typer.Option(help="pack version")]
Split = Annotated[str, typer.Option(help="the split every task goes to")]
Force = Annotated[bool, typer.Option(help="replace OUT if it is not empty")]
Strict = Annotated[bool, typer.Option(help="exit 1 if any task was skipped")]


def _run(
    fmt: str, src: Path, out: Path, name: str | None, version: str, split: str, force: bool,
    strict: bool,
) -> None:  # fmt: skip
    try:
        report = import_tasks(fmt, src, out, name=name, version=version, split=split, force=force)
    except ValueError as exc:
        err.print(f"[red]error[/red]: {escape(str(exc))}")
        raise typer.Exit(2) from None
    render_import(report, console)
    if not report.imported or (strict and report.skipped):
        raise typer.Exit(1)


@import_app.command("terminal-bench")
def terminal_bench_cmd(
    src: Src,
    out: Out,
    name: Name = None,
    version: Version = "0.1.0",
    split: Split = "train",
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Convert Terminal-Bench task folders (task.yaml, Dockerfile, run-tests.sh, solution.sh,
    tests/) into a pack of `terminal` tasks; unsupported ones are reported with the reason."""
    _run("terminal-bench", src, out, name, version, split, force, strict)


@import_app.command("harbor")
def harbor_cmd(
    src: Src,
    out: Out,
    name: Name = None,
    version: Version = "0.1.0",
    split: Split = "train",
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Convert Harbor task folders (task.toml, instruction.md, environment/Dockerfile,
    tests/test.sh, solution/solve.sh) into a pack of `terminal` tasks; unsupported ones are
    reported with the reason."""
    _run("harbor", src, out, name, version, split, force, strict)
