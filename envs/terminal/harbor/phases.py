"""Harbor task schema 1.4's run fields: the network policy of each phase, artifacts, a
separate verifier environment and a seeded `trajectory.json` (docs/importing.md).

Each becomes what palaestra holds, or a problem naming why it cannot be given, so a task is
refused at import, never voided at episode time:

* **network**: the agent phase's policy (`[agent] network_mode` over `[environment]
  network_mode`, the legacy `allow_internet` read as one) is the task's `allow_internet`:
  `public` and `allowlist` go through the server's egress proxy, `allowlist` narrowed to the
  task's `allowed_hosts` (`public.allowed_hosts`); an IP address or range there is refused
  (the proxy reaches host names only). The verifier runs under the agent's policy.
* **artifacts**: palaestra's verifier receives the agent's workdir and the episode keeps it
  as its final state; an artifact in the workdir is therefore carried, one outside it is
  kept for export only, and refused where a separate verifier would need it. Tests that
  read `/logs/artifacts` or `/logs/agent` are refused: no verifier of palaestra's sees them.
* **separate verifier** (`[verifier] environment_mode = "separate"` or a
  `[verifier.environment]`): palaestra's verifier always runs in a fresh sandbox given the
  workdir; `[verifier.environment] docker_image` becomes its image (a `tests/Dockerfile` of
  `FROM <image>`, built with the tools layer as a task's own verifier image is).
  `[[verifier.collect]]` hooks (commands run after the agent ends) are refused.
* **trajectory.json** (an ATIF trajectory Harbor seeds the agent's session with) is
  refused: a palaestra episode starts from its instruction; the policy's context is its
  client's, which the server cannot seed.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.envs.terminal.dockerfile import within
from palaestra.sandbox.egress import AllowList, parse_rule

SCHEMA = (1, 4)  # the newest Harbor task schema this reads, and the one the writer writes
SCHEMA_VERSION = "1.4"
NETWORK_MODES = ("no-network", "public", "allowlist")
TRAJECTORY = "trajectory.json"
MAX_TRAJECTORY_BYTES = 16 * 1024 * 1024
# Harbor's /logs folders a test may read in the agent's own container (shared mode).
AGENT_LOGS = re.compile(r"(?<![\w/$])/logs/(artifacts|agent)\b")


@dataclass
class Run:
    """What the run fields of one task.toml become (see the module docstring)."""

    public: dict[str, Any] = field(default_factory=dict)
    separate: bool = False
    verifier_dockerfile: str | None = None  # `FROM <[verifier.environment] docker_image>`
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _table(meta: dict[str, Any], name: str) -> dict[str, Any]:
    value = meta.get(name)
    return value if isinstance(value, dict) else {}


def schema_version(meta: dict[str, Any], run: Run) -> None:
    """`schema_version` (or the older `version`): one newer than 1.4 in its major is refused."""
    raw = meta.get("schema_version", meta.get("version"))
    if raw is None:
        return
    found = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?\s*", str(raw))
    if found is None:
        run.problems.append(f"schema_version = {raw!r} is not a version like '1.4'")
        return
    major, minor = int(found.group(1)), int(found.group(2))
    if major > SCHEMA[0]:
        run.problems.append(
            f"written for Harbor's task schema {raw}; palaestra reads schemas up to "
            f"{SCHEMA_VERSION}"
        )
    elif (major, minor) > SCHEMA:
        run.notes.append(
            f"Harbor task schema {raw} is newer than {SCHEMA_VERSION}, the newest palaestra "
            "reads: fields it does not know are kept for export, not used"
        )


# -- network -----------------------------------------------------------------------------------
def _policy(table: dict[str, Any], where: str, run: Run) -> tuple[str, list[str]] | None:
    """A table's own network policy (mode, hosts), None where it sets none."""
    mode = table.get("network_mode")
    legacy = table.get("allow_internet")
    if mode is None and isinstance(legacy, bool):
        mode = "public" if legacy else "no-network"
    hosts = table.get("allowed_hosts")
    if mode is None:
        if hosts is not None:
            run.problems.append(f"{where} allowed_hosts without network_mode = 'allowlist'")
        return None
    if mode not in NETWORK_MODES:
        run.problems.append(
            f"{where} network_mode = {mode!r} is none of {', '.join(NETWORK_MODES)}"
        )
        return None
    if hosts is not None and (
        not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts)
    ):
        run.problems.append(f"{where} allowed_hosts must be a list of host names")
        return None
    if hosts and mode != "allowlist":
        run.problems.append(f"{where} allowed_hosts is only valid with network_mode = 'allowlist'")
        return None
    return mode, [h.strip().lower().rstrip(".") for h in hosts or []]


def _host_problem(host: str) -> str | None:
    """Why palaestra's egress proxy cannot reach `host` (an allowed_hosts entry), or None."""
    bare = host[2:] if host.startswith("*.") else host
    try:
        ipaddress.ip_network(bare.strip("[]"), strict=False)
    except ValueError:
        pass
    else:
        return (
            f"allowed_hosts entry {host!r} is an IP address or range; palaestra's egress "
            "proxy reaches host names only (no network by address)"
        )
    if ":" in host or "/" in host:
        return f"allowed_hosts entry {host!r} is not a host name (no ports, paths or URLs)"
    try:
        parse_rule(host)
    except ValueError:
        return f"allowed_hosts entry {host!r} is not a host name or *.domain"
    return None


def _not_allowed(hosts: list[str], operator: AllowList) -> list[str]:
    """The task's hosts no rule of the operator's list lets through (a wildcard counts as
    allowed where some rule reaches a name below it)."""
    out = []
    for host in hosts:
        if host.startswith("*."):
            d = host[2:]
            ok = any(
                r.host == d or r.host.endswith("." + d) or (r.wildcard and d.endswith("." + r.host))
                for r in operator.rules
            )
        else:
            ok = any(operator.allows(host, port) for port in (80, 443))
        if not ok:
            out.append(host)
    return out


def network(meta: dict[str, Any], run: Run, operator: tuple[str, ...] | None = None) -> None:
    """The agent phase's policy as `allow_internet` / `allowed_hosts`; the verifier's noted;
    with the `operator`'s egress_allow (this server's), hosts it does not allow are noted."""
    base = _policy(_table(meta, "environment"), "[environment]", run)
    agent = _policy(_table(meta, "agent"), "[agent]", run)
    verifier = _table(meta, "verifier")
    checked = _policy(verifier, "[verifier]", run)
    own = _policy(_table(verifier, "environment"), "[verifier.environment]", run)
    effective = agent or base
    if effective is None:
        return  # Harbor's default is open; palaestra gives the network only where asked
    mode, hosts = effective
    where = "[agent]" if agent else "[environment]"
    if mode == "allowlist":
        bad = [p for p in map(_host_problem, hosts) if p]
        run.problems += bad
        if bad:
            return
        if not hosts:
            run.notes.append(f"{where} network_mode = 'allowlist' with no hosts: no network")
            return
        run.public["allowed_hosts"] = hosts
        run.notes.append(
            f"{where} network_mode = 'allowlist' ({', '.join(hosts)}): egress through the "
            "server's proxy to these hosts only, each also on the operator's egress_allow"
        )
        unreachable = _not_allowed(hosts, AllowList.parse(operator)) if operator is not None else []
        if unreachable:
            run.notes.append(
                f"allowed_hosts {', '.join(unreachable)} are not on this server's egress_allow:"
                " unreachable here until the operator allows them"
            )
    elif mode == "public":
        run.notes.append(
            f"{where} network_mode = 'public': egress through the server's proxy to the hosts "
            "the operator allows (egress_allow), never open"
        )
    run.public["allow_internet"] = mode != "no-network"
    phase = checked or own
    if phase is not None and phase[0] != mode:
        run.notes.append(
            f"the verifier's network_mode = {phase[0]!r} is not given: palaestra's verifier "
            f"runs under the agent's ({mode!r}); its tests were checked for network use"
        )


# -- the verifier's environment and artifacts --------------------------------------------------
def verifier_environment(meta: dict[str, Any], run: Run, has_own_dockerfile: bool) -> None:
    """`[verifier] environment_mode` / `[verifier.environment]` (Harbor's resolution)."""
    verifier = _table(meta, "verifier")
    mode, own = verifier.get("environment_mode"), verifier.get("environment")
    if mode not in (None, "shared", "separate"):
        run.problems.append(
            f"[verifier] environment_mode = {mode!r} is neither 'shared' nor 'separate'"
        )
        return
    if own is not None and not isinstance(own, dict):
        run.problems.append("[verifier] environment must be a table ([verifier.environment])")
        return
    if mode == "shared" and own is not None:
        run.problems.append(
            "[verifier] environment_mode = 'shared' with a [verifier.environment]: Harbor "
            "refuses the pair; drop one"
        )
        return
    collect = verifier.get("collect")
    if collect:
        hooks = [str(h.get("command", "?")) for h in collect if isinstance(h, dict)]
        run.problems.append(
            f"[[verifier.collect]] runs {', '.join(map(repr, hooks)) or 'commands'} in the "
            "agent's container or a service after the agent ends; palaestra runs nothing "
            "between the agent and its verifier"
        )
    run.separate = mode == "separate" or own is not None
    if not run.separate:
        return
    own = own or {}
    gpus = own.get("gpus") or 0
    if isinstance(gpus, int | float) and gpus > 0:
        run.problems.append(f"the separate verifier asks for {gpus:g} GPU(s); the sandbox has none")
    if own.get("tpu"):
        run.problems.append("the separate verifier asks for a TPU; the sandbox has none")
    if str(own.get("os", "linux")).lower() != "linux":
        run.problems.append(
            f"[verifier.environment] os = {own.get('os')!r}: the verifier sandbox runs Linux"
        )
    image = own.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip() or "\n" in image):
        run.problems.append(f"[verifier.environment] docker_image = {image!r} is no image name")
    elif isinstance(image, str):
        run.verifier_dockerfile = f"FROM {image.strip()}\n"
        shadowed = (
            " (over its tests/Dockerfile, as Harbor orders them)" if has_own_dockerfile else ""
        )
        run.notes.append(
            f"separate verifier: runs on {image.strip()}{shadowed} with the verifier tools "
            "layer (`palaestra images build --pack`), given the agent's workdir"
        )
    elif has_own_dockerfile:
        run.notes.append("separate verifier: runs on its tests/Dockerfile image")
    else:
        run.notes.append("separate verifier: a fresh sandbox of the task's environment")
    kept = sorted(k for k in own if k not in ("docker_image", "network_mode", "allowed_hosts"))
    if kept:
        run.notes.append(
            f"[verifier.environment] {', '.join(kept)} kept for export; palaestra's verifier "
            "sandbox has the agent's resources"
        )


def _artifact_source(entry: Any, run: Run) -> str | None:
    if isinstance(entry, dict):
        service = entry.get("service")
        if service not in (None, "main"):
            run.problems.append(
                f"artifact {entry.get('source')!r} comes from the service {service!r}; the "
                "sandbox runs one container"
            )
            return None
        entry = entry.get("source")
    if not isinstance(entry, str) or not entry.strip():
        run.problems.append(f"artifact {entry!r} is not a path")
        return None
    if ".." in entry.split("/"):
        run.problems.append(f"artifact {entry!r} has a '..' component")
        return None
    return entry


def artifacts(meta: dict[str, Any], workdir: str, tests: dict[str, str], run: Run) -> None:
    """`artifacts` against what palaestra's verifier receives: the workdir (module doc)."""
    for name, text in sorted(tests.items()):
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        found = AGENT_LOGS.search(code)
        if found:
            run.problems.append(
                f"the tests read {found.group(0)} (tests/{name}), the agent's Harbor log "
                f"folder; palaestra's verifier receives the workdir {workdir} only"
            )
    entries = meta.get("artifacts", [])
    if not isinstance(entries, list):
        run.problems.append("artifacts must be a list of paths or tables")
        return
    inside: list[str] = []
    outside: list[str] = []
    for entry in entries:
        source = _artifact_source(entry, run)
        if source is None:
            continue
        path = posixpath.normpath(posixpath.join(workdir, source))
        (inside if path == workdir or path.startswith(workdir + "/") else outside).append(path)
    if inside:
        run.notes.append(
            f"artifacts {', '.join(inside)} are in the workdir: the verifier receives them "
            "and the episode's final state keeps them"
        )
    if outside and run.separate:
        run.problems.append(
            f"artifacts {', '.join(outside)} lie outside the workdir {workdir}: the separate "
            "verifier needs them, and palaestra's verifier receives the workdir only"
        )
    elif outside:
        run.notes.append(
            f"artifacts {', '.join(outside)} lie outside the workdir: kept for export, not "
            "collected (the episode keeps its workdir)"
        )


# -- a seeded trajectory -----------------------------------------------------------------------
def trajectory(folder: Path, run: Run) -> None:
    """`trajectory.json` beside the instruction: refused, saying what it holds."""
    path = folder / TRAJECTORY
    if not path.exists() and not path.is_symlink():
        return
    if not within(path, folder) or not path.is_file():
        run.problems.append(f"{TRAJECTORY} is a symlink or no file; packs hold files only")
        return
    what = "an ATIF trajectory"
    try:
        if path.stat().st_size <= MAX_TRAJECTORY_BYTES:
            document = json.loads(path.read_text(encoding="utf-8"))
            steps = document.get("steps") if isinstance(document, dict) else None
            if isinstance(steps, list):
                what = f"{len(steps)} prior ATIF step{'' if len(steps) == 1 else 's'}"
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        what = "a file that is not ATIF JSON"
    run.problems.append(
        f"{TRAJECTORY} seeds the agent's session with {what}; a palaestra episode starts "
        "from its instruction (the policy's context is its client's), so the seeded "
        "trajectory is not supported"
    )
