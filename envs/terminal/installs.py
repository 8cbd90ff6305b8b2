"""Test-time package installs of an imported task: which hosts they need, and whether the
operator's egress allow-list (the `egress_allow` setting) lets the verifier reach them.

Terminal-Bench test scripts often install what their tests import (``pip install
requests==2.32.3``) before running pytest. Run as written, in the verifier sandbox, that
install would get the network in the sandbox where the agent's files are: a planted
``sitecustomize.py`` or ``pip/`` package in the workdir could then phone home or fetch a
forged test plugin. So an install line is taken *out* of the test script and its packages
recorded on the task (``[private] verifier_installs``, ``verifier_hosts``: the verifier
phase's network policy); at verification a separate sandbox that never held an agent file
installs them through the egress proxy, narrowed to exactly those hosts, into a folder the
verifier then copies into its own (networkless) sandbox (envs/terminal/testinstall.py).

Only pip requirements by name (``uv pip install``, ``pip3 install``, ``python -m pip
install`` alike) are run that way; npm and cargo installs are named with the hosts they need
and refused (nothing installs them outside the agent's sandbox yet), except a line whose
failure the script itself ignores (``cargo add regex 2>/dev/null || true``, as Terminal-Bench's
aider_polyglot Rust tests do): it is kept, fails in the networkless test sandbox as the
benchmark allows, and the import report notes it."""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from palaestra.sandbox.egress import AllowList

PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org")
NPM_HOSTS = ("registry.npmjs.org",)
CRATES_HOSTS = ("crates.io", "static.crates.io", "index.crates.io")

PIP_LINE = re.compile(
    r"^\s*(?:sudo\s+)?(?:(?:uv\s+pip|pip3?|python3?\s+-m\s+pip)\s+install|uv\s+add)\s+(?P<args>.*?)\s*$"
)
NPM_LINE = re.compile(r"^\s*(?:npm\s+(?:install|i|ci)|yarn\s+add)\b.*$")
CARGO_LINE = re.compile(r"^\s*cargo\s+(?:install|add)\b.*$")
# The end of a line whose failure the script ignores: `|| true`, `|| :`, `|| echo ...`.
IGNORED_FAILURE = re.compile(r"\|\|\s*(?:true|:|echo\b[^|;&]*)\s*$")
# A requirement by name (and version), nothing pip would read as a path, URL or option.
REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?"
    r"((==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!-]+(,(==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!-]+)*)?$"
)
# Options of an install line that change nothing about what is installed where it goes.
HARMLESS = {
    "-q", "--quiet", "-qq", "-U", "--upgrade", "--no-cache-dir", "--break-system-packages",
    "--user", "--system", "--root-user-action=ignore", "--disable-pip-version-check",
    "--no-input", "--progress-bar=off", "--dev",
}  # fmt: skip
MAX_REQUIREMENTS = 50
SEPARATORS = re.compile(r"\s*(?:\|\||&&|;)\s*")
REDIRECT = re.compile(r"^(\d|&)?>>?(&\d|/dev/null)?$|^(\d|&)?>>?/dev/null$")
# What the verifier has itself (the importer drops a line that installs only these).
TOOLING = frozenset({"pytest", "pytest-timeout"})
TOOLING_NOTE = "the test script's pytest install is dropped: the verifier has pytest"
SETTING = "egress_allow"


@dataclass
class Installs:
    """What a test script's install lines ask for: the script without them, the pip
    requirements, the hosts they need, and why any line cannot be run here."""

    script: str
    requirements: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def ignored_install(line: str) -> bool:
    """An npm or cargo install whose failure the script ignores (kept; see the module doc)."""
    code = line.split("#", 1)[0]
    return bool(
        (NPM_LINE.match(code) or CARGO_LINE.match(code)) and IGNORED_FAILURE.search(code.rstrip())
    )


def take_installs(script: str, keep_tooling: bool = False) -> Installs:
    """`script` with its package-install lines taken out (see the module doc). A line of pip
    installs alone (``pip3 install x 2>/dev/null || pip install x`` too) is taken out; one
    asking only for the test tooling the verifier has (pytest, pytest-timeout) needs no
    host, unless `keep_tooling` (a task on an image of its own, which may not have pytest:
    then pytest is installed for the verifier like any other requirement)."""
    kept: list[str] = []
    out = Installs(script="")
    hosts: set[str] = set()
    for line in script.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        parts = [p for p in SEPARATORS.split(code) if p.strip()]
        pips = [m for m in map(PIP_LINE.match, parts) if m]
        if parts and len(pips) == len(parts):
            asked = [_pip_requirements(m.group("args"), line.strip(), out, keep_tooling)
                     for m in pips]  # fmt: skip
            if any(asked):
                hosts.update(PYPI_HOSTS)
            continue
        for pattern, registry in ((NPM_LINE, NPM_HOSTS), (CARGO_LINE, CRATES_HOSTS)):
            if pattern.match(code) and ignored_install(code):
                kept.append(line)
                out.notes.append(
                    f"the tests' `{line.strip()[:80]}` is kept: it fails without the network "
                    f"({', '.join(registry)}), which the script ignores"
                )
                break
            if pattern.match(code):
                hosts.update(registry)
                out.problems.append(
                    f"the tests install packages at test time (`{line.strip()[:80]}`, needs "
                    f"{', '.join(registry)}); only pip installs run outside the agent's "
                    "sandbox here"
                )
                break
        else:
            kept.append(line)
    out.script = "\n".join(kept) + "\n"
    out.hosts = sorted(hosts)
    if len(out.requirements) > MAX_REQUIREMENTS:
        out.problems.append(f"the tests install over {MAX_REQUIREMENTS} packages")
    return out


def _pip_requirements(args: str, shown: str, out: Installs, keep_tooling: bool) -> bool:
    """Add one install's requirements to `out`; whether it needs the registry (a package
    beyond the verifier's tooling, or one it cannot install: the reason is in `out`)."""
    try:
        words = shlex.split(args)
    except ValueError:
        words = [args]
    needs = False
    for word in words:
        if word in HARMLESS or REDIRECT.match(word):
            continue
        if word.startswith("-") or not REQUIREMENT.match(word):
            out.problems.append(
                f"the tests' install `{shown[:80]}` asks for {word!r}: only requirements by "
                "name (and version) are installed for the verifier"
            )
            return True  # the rest may be that option's value
        if re.split(r"[\[=<>~!]", word, maxsplit=1)[0].lower() in TOOLING and not keep_tooling:
            continue
        needs = True
        if word not in out.requirements:
            out.requirements.append(word)
    return needs


def not_allowed(hosts: list[str], operator: tuple[str, ...] | None) -> list[str]:
    """The `hosts` the operator's egress allow-list does not let through (all of them when
    the list is not known here)."""
    if operator is None:
        return list(hosts)
    allow = AllowList.parse(operator)
    return [h for h in hosts if not allow.allows(h, 443)]


def refusal(hosts: list[str], missing: list[str]) -> str:
    """The reason a task with test-time installs is refused: the hosts and the setting."""
    return (
        f"the tests install packages at test time and need {', '.join(hosts)}; "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on the operator's "
        f"egress allow-list: add {'it' if len(missing) == 1 else 'them'} to {SETTING} "
        "(Settings, palaestra.toml) to import this task"
    )


def verifier_installs(
    script: str,
    problems: list[str],
    operator: tuple[str, ...] | None,
    network: Callable[[str], list[str]],
    own_image: bool = False,
) -> tuple[str, list[str], dict[str, Any], list[str]]:
    """A cleaned test script with its package installs taken out: (the script, its problems,
    the private fields of the verifier's installs, notes). `network` names a script's other
    network use (the importer's). Refused, naming the hosts and the setting, unless the
    `operator`'s egress_allow (None: not known here) has them all."""
    found = take_installs(script, keep_tooling=own_image)
    if found.script.splitlines() == script.splitlines():
        return script, problems, {}, found.notes  # no install line taken out
    problems = [p for p in problems if not p.startswith("the tests need the network")]
    problems += network(found.script) + found.problems
    if not found.hosts:  # only the tooling the verifier has
        return found.script, problems, {}, [TOOLING_NOTE, *found.notes]
    missing = not_allowed(found.hosts, operator)
    if missing and not found.problems:
        problems.append(refusal(found.hosts, missing))
    private = {"verifier_installs": found.requirements, "verifier_hosts": found.hosts}
    note = (
        f"the tests' installs ({' '.join(found.requirements)}) run before them in a sandbox "
        f"of their own that never holds the agent's files, through the egress proxy to "
        f"{', '.join(found.hosts)} only; the tests run without the network"
    )
    return found.script, problems, private, [note, *found.notes]


def installs_problems(private: dict[str, Any], operator: tuple[str, ...] | None) -> list[str]:
    """Why an exported task's recorded installs (`verifier_hosts`) cannot run on this
    server: the hosts the `operator`'s egress_allow (None: not known here) lacks."""
    hosts = [str(h) for h in private.get("verifier_hosts") or []]
    missing = not_allowed(hosts, operator) if hosts else []
    return [refusal(hosts, missing)] if missing else []


# A Dockerfile step that fetches a project's dependencies into the image at build time.
FETCHED_AT_BUILD = re.compile(
    r"\bcargo\s+(?:fetch|build|vendor|test)\b|\bgo\s+mod\s+(?:download|vendor)\b"
)
# go.mod's requirements: `require m v1.2.3`, or a `require ( ... )` block's lines.
_GO_REQUIRE = re.compile(r"^require\s+(?:\(([^)]*)\)|(\S+)\s+v\S+)", re.M)


def dependency_problems(build: Mapping[str, str], dockerfile: str) -> list[str]:
    """Why a task whose Rust crate or Go module depends on registry packages cannot run:
    `cargo test` / `go test` would fetch them (crates.io, proxy.golang.org) when the tests
    build, in a sandbox with no network, and nothing installs them for the verifier; none
    where the Dockerfile fetches them into the image (`cargo fetch`, `go mod download`)."""
    if FETCHED_AT_BUILD.search(dockerfile):
        return []
    problems = []
    for path, text in sorted(build.items()):
        name = path.rsplit("/", 1)[-1]
        if name == "Cargo.toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                continue
            crates = sorted(
                crate
                for table in ("dependencies", "dev-dependencies", "build-dependencies")
                for crate, spec in (data.get(table) or {}).items()
                if not (isinstance(spec, dict) and "path" in spec)
            )
            if crates:
                problems.append(
                    f"{path} depends on crates ({', '.join(crates)}) that cargo fetches from "
                    f"{', '.join(CRATES_HOSTS)} when the tests build, with no network there; "
                    "nothing installs crates for the verifier"
                )
        elif name == "go.mod":
            modules = sorted(
                {line.split()[0] for block, one in _GO_REQUIRE.findall(text)
                 for line in (block.splitlines() if block else [one])
                 if line.strip() and not line.strip().startswith("//")}
            )  # fmt: skip
            if modules:
                problems.append(
                    f"{path} requires modules ({', '.join(modules[:5])}) that go fetches from "
                    "proxy.golang.org when the tests build, with no network there"
                )
    return problems
