"""`palaestra pack export harbor PACK OUT`: terminal tasks as Harbor task folders.

Each task becomes `OUT/<id>/`: `task.toml` (schema 1.4: its fields in Harbor's names,
config.py, over the `[private] harbor` fields an import kept; the network mode from
`allow_internet` / `allowed_hosts`; for a separate verifier the workdir as its first
artifact, and `tests/Dockerfile` where its image is a `docker_image`), `instruction.md`,
`environment/Dockerfile`
(programs/Dockerfile: the terminal userland, the task's env, `COPY files/`, its setup.sh)
with `environment/files/`, `tests/test.sh` (programs/test.sh: runs the task's verifier
from `tests/palaestra/` and writes `/logs/verifier/reward.txt`) and `solution/`.
`OUT/dataset.toml` pins each task's content digest (digest.py). `[metadata.palaestra]`
says what the reader needs to give the same task back, and which fields were generated.

OUT must not exist (unless `force`); a task id or file path that would land outside OUT is
refused by name, and so is a task Harbor cannot run (pytest-set tests without test.sh).
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
import shlex
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from palaestra.envs import Task
from palaestra.envs.terminal.fields import SETUP_TIMEOUT_S, TerminalPrivate, TerminalPublic
from palaestra.envs.terminal.harbor.config import upgraded
from palaestra.envs.terminal.harbor.digest import DATASET_FILE, content_digest
from palaestra.envs.terminal.harbor.phases import SCHEMA_VERSION
from palaestra.envs.terminal.harbor.reader import (
    ENV_FILES,
    EXPORT_KEY,
    NETWORK_FIELDS,
    VERIFIER_DIR,
)
from palaestra.envs.terminal.importer import category_of, difficulty_of
from palaestra.sdk.packwriter import toml_text
from palaestra.verifiers import terminal as verifier_run

DOCKERFILE = "Dockerfile"
BARE_FROM = re.compile(r"FROM [^\s]+\n")  # phases.py's verifier image of a docker_image
HARBOR_BUILD_TIMEOUT_S = 600.0  # Harbor's default: the image build installs the userland
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ORG_RE = re.compile(r"[^A-Za-z0-9_.-]+")


class ExportError(ValueError):
    """The export as a whole cannot run (OUT exists); the message says what to do."""


@dataclass
class ExportReport:
    out: str
    exported: dict[str, str] = field(default_factory=dict)  # id -> content digest
    skipped: dict[str, list[str]] = field(default_factory=dict)  # id -> reasons


def _program(name: str) -> Template:
    text = resources.files("palaestra.envs.terminal.harbor.programs").joinpath(name)
    return Template(text.read_text(encoding="utf-8"))


def plain_parts(rel: str) -> tuple[str, ...]:
    """The parts of a plain relative path (no leading '/', '..', '.', '//', '\\', NUL)."""
    parts = tuple(rel.split("/"))
    if not rel or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{rel!r} is not a plain relative path")
    return parts


def safe_path(base: Path, rel: str) -> Path:
    """`base/rel`, or ValueError when `rel` is not a plain relative path that stays in base."""
    path = base.joinpath(*plain_parts(rel))
    if not path.resolve().is_relative_to(base.resolve()):
        raise ValueError(f"{rel!r} would be written outside {base}")
    return path


def _env_line(name: str, value: str) -> str:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) or "\n" in value or "\r" in value:
        raise ValueError(f"env {name!r} cannot be written as a Dockerfile ENV line")
    quoted = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'ENV {name}="{quoted}"'


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` on top, tables merged key by key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def task_config(task: Task, org: str) -> dict[str, Any]:
    """The task's task.toml (see the module docstring)."""
    public, private = TerminalPublic.of(task), TerminalPrivate.of(task)
    kept = upgraded(private.harbor)  # a pack imported before 1.4 keeps older names
    kept.pop("schema_version", None)
    given = {**task.private, **task.public}
    generated: list[str] = []
    config: dict[str, Any] = {}

    def put(dotted: str, value: Any, explicit: bool) -> None:
        """Set a field; one the task did not give is listed as generated."""
        section, _, key = dotted.rpartition(".")
        target = config.setdefault(section, {}) if section else config
        target[key] = value
        if not explicit:
            generated.append(dotted)

    put("schema_version", SCHEMA_VERSION, True)  # what the kept fields are in (`upgraded`)
    if "task" not in kept:
        put("task.name", f"{org}/{task.id}", False)
    category = task.domain.rsplit("/", 1)[-1] or "misc"
    meta = kept.get("metadata", {})
    if "difficulty" not in meta or difficulty_of(meta["difficulty"]) != task.difficulty:
        put("metadata.difficulty", task.difficulty or "medium", "difficulty" in meta)
    if "category" not in meta or category_of(meta["category"]) != category:
        put("metadata.category", category, "category" in meta)
    if private.verifier_timeout_s is not None:
        put("verifier.timeout_sec", private.verifier_timeout_s, True)
    else:
        put("verifier.timeout_sec", public.timeout_s or 120.0, False)
    if public.agent_timeout_s is not None:
        put("agent.timeout_sec", public.agent_timeout_s, True)
    setup = "setup_timeout_s" in given
    build_s = public.setup_timeout_s if setup else max(HARBOR_BUILD_TIMEOUT_S, SETUP_TIMEOUT_S)
    put("environment.build_timeout_sec", build_s, setup)
    put("environment.cpus", public.cpus, "cpus" in given)
    put("environment.memory_mb", public.memory_mb, "memory_mb" in given)
    put("environment.storage_mb", public.workspace_mb, "workspace_mb" in given)
    if not any("network_mode" in kept.get(t, {}) for t in ("environment", "agent")):
        mode = "allowlist" if public.allowed_hosts else "public"  # the operator's list
        put("environment.network_mode", mode if public.allow_internet else "no-network", False)
        if public.allowed_hosts:
            put("environment.allowed_hosts", list(public.allowed_hosts), False)
    config = _merge(kept, config)
    export: dict[str, Any] = {
        "format": 1,
        "domain": task.domain,
        "split": task.split,
        "difficulty": task.difficulty,
        "reward_file": private.reward_file,
        "generated": generated,
    }
    if private.verifier_image is not None:
        export["verifier_image"] = private.verifier_image
    if private.verifier_installs:  # tests/test.sh runs them in Harbor
        export["verifier_installs"] = list(private.verifier_installs)
        export["verifier_hosts"] = list(private.verifier_hosts)
    # The network fields the task gave: `network_mode` above is generated from them (an
    # import drops it), so the reader takes them from here.
    network = {k: task.public[k] for k in NETWORK_FIELDS if k in task.public}
    if network:
        export["network"] = network
    if _separate(config):  # Harbor's separate verifier gets the agent's work as palaestra's
        covered = any(_under(public.workdir, s) for s in _artifact_sources(config))
        added = [] if covered else [public.workdir]
        # First: an entry below it is then covered by it, not a collision Harbor skips.
        config["artifacts"] = [*added, *config.get("artifacts", [])]
        export["added_artifacts"] = added
    config.setdefault("metadata", {})[EXPORT_KEY] = export
    return config


def _separate(config: dict[str, Any]) -> bool:
    """Whether Harbor runs this task's verifier in an environment of its own."""
    verifier = config.get("verifier", {})
    mode = verifier.get("environment_mode")
    return mode == "separate" or (mode is None and "environment" in verifier)


def _artifact_sources(config: dict[str, Any]) -> list[str]:
    entries = config.get("artifacts", [])
    sources = [e.get("source") if isinstance(e, dict) else e for e in entries]
    return [s for s in sources if isinstance(s, str)]


def _under(path: str, source: str) -> bool:
    """Whether the artifact `source` holds `path` (it is `path` or a folder above it)."""
    source = posixpath.normpath(source)
    return path == source or path.startswith(source.rstrip("/") + "/")


def verifier_dockerfile(task: Task) -> str | None:
    """tests/Dockerfile for a task whose verifier image is a bare `FROM <image>` (Harbor's
    `[verifier.environment] docker_image`, phases.py): that image with the exported tests
    in /tests, which Harbor runs there; None for any other task."""
    own = TerminalPrivate.of(task).verifier.get(f"tests/{DOCKERFILE}", "")
    found = BARE_FROM.fullmatch(own)
    return f"{found.group(0)}COPY . /tests/\n" if found else None


def task_files(task: Task, org: str) -> dict[str, str]:
    """Every file of the task's Harbor folder, by relative path; ValueError when it cannot be."""
    public, private = TerminalPublic.of(task), TerminalPrivate.of(task)
    if "test.sh" not in private.verifier:
        raise ValueError(
            "its tests are pytest sets (fail_to_pass / pass_to_pass) that palaestra's runner "
            "judges; Harbor runs tests/test.sh: add a verifier/test.sh"
        )
    lines = [_program("Dockerfile").substitute(workdir=public.workdir).rstrip("\n")]
    lines += [_env_line(k, str(v)) for k, v in sorted(public.env.items())]
    if public.environment or task.blobs_of("environment"):
        lines.append(f"COPY {ENV_FILES}/ {public.workdir}/")
    if "setup.sh" in public.environment:
        lines.append("RUN bash ./setup.sh && rm -f ./setup.sh")
    config = task_config(task, org)
    reqs = private.verifier_installs
    dockerfile = verifier_dockerfile(task) if _separate(config) else None
    files = {
        "task.toml": toml_text(config),
        "instruction.md": public.instruction,
        "environment/Dockerfile": "\n".join(lines) + "\n",
        "tests/test.sh": _program("test.sh").substitute(
            workdir=shlex.quote(public.workdir),
            reward_file=int(private.reward_file),
            verifier_dir=verifier_run.VERIFIER_DIR,  # where imported helpers look
            verifier_logs=verifier_run.VERIFIER_LOGS,
            installs=shlex.join(["pip", "install", *reqs]) + "\n" if reqs else "",
        ),
    }
    if dockerfile is not None:
        files[f"tests/{DOCKERFILE}"] = dockerfile
    for prefix, table in (
        (f"environment/{ENV_FILES}/", public.environment),
        (f"tests/{VERIFIER_DIR}/", private.verifier),
        ("solution/", private.solution),
    ):
        for rel, text in table.items():
            plain_parts(rel)
            files[prefix + rel] = text
    return files


def task_binaries(task: Task) -> dict[str, Path]:
    """The task's binary files (the pack's blobs) by their path in its Harbor folder."""
    out: dict[str, Path] = {}
    for prefix, folder in (
        (f"environment/{ENV_FILES}/", "environment"),
        (f"tests/{VERIFIER_DIR}/", "verifier"),
        ("solution/", "solution"),
    ):
        for rel, path in task.blobs_of(folder).items():
            plain_parts(rel)
            out[prefix + rel] = path
    return out


def export_tasks(
    tasks: list[Task], out: Path, *, pack: str, version: str, force: bool = False
) -> ExportReport:
    """Write `tasks` (terminal tasks of one pack) as Harbor task folders under `out`."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise ExportError(f"{out} exists; choose a new folder or pass --force to replace it")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    report = ExportReport(out=str(out))
    org = ORG_RE.sub("-", pack.split("/")[0]).strip("-.") or "palaestra"
    out.mkdir(parents=True, exist_ok=True)
    refs = []
    for task in sorted(tasks, key=lambda t: t.id):
        try:
            if not SAFE_ID.match(task.id):
                raise ValueError(f"task id {task.id!r} is not a plain folder name")
            folder = safe_path(out, task.id)
            files = task_files(task, org)
            binaries = task_binaries(task)
            targets = {rel: safe_path(folder, rel) for rel in (*files, *binaries)}
        except ValueError as exc:
            report.skipped[task.id] = [f"not exported: {exc}"]
            continue
        for rel, path in targets.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel in binaries:
                path.write_bytes(binaries[rel].read_bytes())
            else:
                path.write_text(files[rel], encoding="utf-8")
            if rel.endswith(".sh"):
                path.chmod(0o755)
        digest = content_digest(folder)
        report.exported[task.id] = digest
        refs.append({"name": f"{org}/{task.id}", "digest": digest})
    name = f"{org}/{ORG_RE.sub('-', pack.split('/')[-1])}"
    about = f"Exported from the palaestra pack {pack}@{version}"
    dataset = {"dataset": {"name": name, "version": version, "description": about}}
    text = toml_text(dataset) + "".join(
        f"\n[[tasks]]\nname = {json.dumps(r['name'])}\ndigest = {json.dumps(r['digest'])}\n"
        for r in refs
    )
    (out / DATASET_FILE).write_text(text, encoding="utf-8")
    return report
