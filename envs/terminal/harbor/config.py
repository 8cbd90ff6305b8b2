"""Harbor's task.toml as a terminal task's fields (docs/terminal.md, "Harbor both ways").

What palaestra can hold maps to typed fields, resources clamped to the operator's ceilings:
`[agent] timeout_sec` → `agent_timeout_s` (the episode's wall time) and `timeout_s` (the
oracle's command); `[verifier] timeout_sec` → `verifier_timeout_s`; `[environment]
build_timeout_sec` → `setup_timeout_s`, `cpus`, `memory_mb` (or the older `memory = "2G"`),
`storage_mb` (`storage`) → `workspace_mb`, `workdir`, `env` (literal values; a `${VAR}` from
the host is a problem: a sandbox gets none); `[metadata] difficulty / category` →
difficulty and domain. Every other field is kept as given in `[private] harbor`, so an
export writes it back, in schema 1.4's names (`upgraded`). What a sandbox cannot give
(GPUs, TPUs, Windows, steps) is a problem; the network policy and schema version are
phases.py's.
"""

from __future__ import annotations

import copy
import math
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from palaestra.envs.terminal.harbor import phases

# (section, key) pairs that become typed fields; the rest of task.toml is kept.
MAPPED = {
    ("agent", "timeout_sec"),
    ("verifier", "timeout_sec"),
    ("environment", "build_timeout_sec"),
    ("environment", "cpus"),
    ("environment", "memory_mb"),
    ("environment", "memory"),
    ("environment", "storage_mb"),
    ("environment", "storage"),
    ("environment", "workdir"),
    ("environment", "env"),
}
SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([GMK])B?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Ceilings:
    """The most a task may ask of this server (Settings' `ceiling_*`, passed down), and
    the hosts its egress proxy allows (`egress_allow`; None: not known here)."""

    memory_mb: int
    cpus: float
    workspace_mb: int
    task_timeout_s: float
    wall_s: float
    egress_allow: tuple[str, ...] | None = None


@dataclass
class Mapped:
    """task.toml as terminal fields: what goes where, and what was clamped or refused."""

    public: dict[str, Any]
    private: dict[str, Any]
    notes: list[str]
    problems: list[str]
    category: Any = None
    difficulty: Any = None


def size_mb(value: Any) -> int | None:
    """Harbor's size text ('2G', '512M') in MB, or None."""
    found = SIZE_RE.match(str(value))
    if not found:
        return None
    number, unit = float(found.group(1)), found.group(2).upper()
    return int(number * {"G": 1024, "M": 1, "K": 1 / 1024}[unit])


def _table(meta: dict[str, Any], name: str) -> dict[str, Any]:
    value = meta.get(name)
    return value if isinstance(value, dict) else {}


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value > 0 else None


def map_config(meta: dict[str, Any], ceilings: Ceilings | None) -> Mapped:
    """The fields of one task.toml (see the module docstring)."""
    agent, verifier = _table(meta, "agent"), _table(meta, "verifier")
    env, info = _table(meta, "environment"), _table(meta, "metadata")
    out = Mapped(public={}, private={}, notes=[], problems=[])
    out.category, out.difficulty = info.get("category"), info.get("difficulty")

    def put(side: dict[str, Any], key: str, where: str, value: Any, cap: float | None) -> None:
        number = _positive(value)
        if value is not None and number is None:
            out.problems.append(f"task.toml {where} = {value!r} must be a positive number")
            return
        if number is None:
            return
        if cap is not None and number > cap:
            out.notes.append(f"{where} = {number:g} clamped to this server's ceiling {cap:g}")
            number = cap
        whole = key in ("memory_mb", "workspace_mb")
        side[key] = int(number) if whole else number

    c = ceilings
    put(out.public, "agent_timeout_s", "[agent] timeout_sec", agent.get("timeout_sec"),
        c.wall_s if c else None)  # fmt: skip
    if "agent_timeout_s" in out.public:
        cap = c.task_timeout_s if c else None
        out.public["timeout_s"] = min(out.public["agent_timeout_s"], cap or float("inf"))
    put(out.private, "verifier_timeout_s", "[verifier] timeout_sec", verifier.get("timeout_sec"),
        c.task_timeout_s if c else None)  # fmt: skip
    put(out.public, "setup_timeout_s", "[environment] build_timeout_sec",
        env.get("build_timeout_sec"), c.task_timeout_s if c else None)  # fmt: skip
    put(out.public, "cpus", "[environment] cpus", env.get("cpus"), c.cpus if c else None)
    for legacy in ("memory", "storage"):
        if legacy in env and f"{legacy}_mb" not in env and size_mb(env[legacy]) is None:
            out.problems.append(
                f"[environment] {legacy} = {env[legacy]!r} is not a size like '2G' or '512M'"
            )
    memory = env.get("memory_mb", size_mb(env["memory"]) if "memory" in env else None)
    put(out.public, "memory_mb", "[environment] memory_mb", memory, c.memory_mb if c else None)
    storage = env.get("storage_mb", size_mb(env["storage"]) if "storage" in env else None)
    put(out.public, "workspace_mb", "[environment] storage_mb", storage,
        c.workspace_mb if c else None)  # fmt: skip
    workdir = env.get("workdir")
    if workdir is not None:
        if not isinstance(workdir, str) or not posixpath.isabs(workdir):
            out.problems.append(f"[environment] workdir = {workdir!r} must be an absolute path")
        else:
            out.public["workdir"] = posixpath.normpath(workdir)
    # Internet only where the task says so (Harbor's own default is open): egress then goes
    # through the operator's allow-list proxy (docs/security.md "Network"), phases.py.
    run = phases.Run()
    phases.schema_version(meta, run)
    phases.network(meta, run, c.egress_allow if c else None)
    out.public.update(run.public)
    out.problems += run.problems
    out.notes += run.notes
    variables = env.get("env")
    if isinstance(variables, dict) and variables:
        host = sorted(k for k, v in variables.items() if "${" in str(v))
        if host:
            out.problems.append(
                f"[environment] env {', '.join(host)} come from the host at run time; "
                "a sandbox is given none"
            )
        out.public["env"] = {k: str(v) for k, v in variables.items() if k not in host}
    out.problems += _unsupported(meta, env)
    out.notes += _not_carried(env, verifier)
    kept = remainder(meta)
    if kept:
        out.private["harbor"] = kept
    return out


def _unsupported(meta: dict[str, Any], env: dict[str, Any]) -> list[str]:
    problems = []
    gpus = env.get("gpus") or env.get("gpu_count") or 0
    if isinstance(gpus, int | float) and gpus > 0:
        problems.append(f"the task asks for {gpus:g} GPU(s); the sandbox has none")
    if env.get("tpu"):
        problems.append("the task asks for a TPU; the sandbox has none")
    if str(env.get("os", "linux")).lower() != "linux":
        problems.append(f"[environment] os = {env.get('os')!r}: the sandbox runs Linux")
    if meta.get("steps"):
        problems.append("a multi-step task ([[steps]]) is not supported; one instruction a task")
    return problems


def _not_carried(env: dict[str, Any], verifier: dict[str, Any]) -> list[str]:
    """Fields kept for export whose effect palaestra does not give."""
    notes = []
    for where, table, key in (
        ("[environment]", env, "mcp_servers"),
        ("[environment]", env, "healthcheck"),
        ("[verifier]", verifier, "env"),
    ):
        if table.get(key):
            notes.append(f"{where} {key} kept for export; palaestra does not use it")
    return notes


def remainder(meta: dict[str, Any]) -> dict[str, Any]:
    """task.toml less the fields that became typed ones (kept in `[private] harbor`), in
    schema 1.4's names: no schema version (the writer writes its own), the legacy
    `allow_internet` as `network_mode`."""
    kept = upgraded(meta)
    kept.pop("schema_version", None)
    verifier = kept.get("verifier")
    own = verifier.get("environment") if isinstance(verifier, dict) else None
    if isinstance(verifier, dict) and isinstance(own, dict) and "docker_image" in own:
        own.pop("docker_image")  # the verifier's own image (phases.py: tests/Dockerfile)
        if not own:
            verifier.pop("environment")
            verifier.setdefault("environment_mode", "separate")
    for section, key in MAPPED:
        table = kept.get(section)
        if isinstance(table, dict):
            table.pop(key, None)
            if not table:
                kept.pop(section)
    return kept


def upgraded(meta: dict[str, Any]) -> dict[str, Any]:
    """A copy of task.toml in schema 1.4's names: `version` → `schema_version`, each
    `allow_internet` → `network_mode` (where the table sets none), as Harbor migrates them."""
    out = copy.deepcopy(meta)
    if "version" in out:
        version = out.pop("version")
        out.setdefault("schema_version", version)
    verifier = out.get("verifier")
    own = verifier.get("environment") if isinstance(verifier, dict) else None
    for table in (out.get("environment"), own):
        if isinstance(table, dict) and "allow_internet" in table:
            legacy = table.pop("allow_internet")
            if isinstance(legacy, bool) and "network_mode" not in table:
                table["network_mode"] = "public" if legacy else "no-network"
    return out
