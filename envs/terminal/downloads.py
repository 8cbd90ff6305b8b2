"""Build-time downloads of a task's Dockerfile, judged at import (docs/sandbox-images.md,
"Build-time downloads").

A build here reaches only the package registries (`Settings.build_hosts`: the Debian mirror
apt uses, PyPI, npm). Real task sets start `FROM` a generic base and download their toolchain
from its vendor at build time (Terminal-Bench's aider_polyglot: `curl
https://golang.org/dl/go1.21.5...`, `curl https://sh.rustup.rs | sh`, `curl
https://deb.nodesource.com/setup_20.x | bash -`), which would import and then fail at build.

* On a generic base (one `image_aliases` maps to palaestra/ubuntu or palaestra/python) such
  an installer RUN is taken out and its stage starts `FROM` the toolchain's stand-in instead,
  judged by the tag rule of envs/terminal/baseimages.py: the version that decides is the
  minimum the task's own files declare (go.mod's `go` line; Cargo.toml's `rust-version`,
  else its edition's; package.json's `engines.node`), else the one the download names (none
  named: the latest, newer than any stand-in). Newer than the stand-in: refused, naming both
  and the way out. With `image_registry_mirror` set the stage starts `FROM` the official
  image at the version asked instead (`golang:1.21.5`), which the mirror serves; an exact
  `image_aliases` key for that image (`"golang:1.21.5"`) is the operator's own and serves it.
* A toolchain tag the stand-in is too old for (`FROM golang:1.22`) runs on the stand-in where
  the task's files declare a minimum it meets (go.mod `go 1.18`), noted.
* A Launchpad PPA (`add-apt-repository ppa:deadsnakes/ppa`, Ubuntu's way to a Python its
  release lacks) cannot serve a stand-in, which is Debian bookworm: on a generic base the
  command is taken out (`true` in its place), noted, and apt installs the packages from
  bookworm, which has python3.11; one it lacks fails the build, which `pack import --build`
  turns into a refusal naming it (cli/unbuilt.py).
* Any other URL a RUN fetches (curl, wget, git, pip, ...) or an ADD names, from a host
  not in `build_hosts`, refuses the task naming the host, the URL and the setting.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from palaestra.envs.terminal.baseimages import BaseImages, alias_of, fits, split_ref
from palaestra.envs.terminal.envimage import DOCKERFILE
from palaestra.envs.terminal.installs import dependency_problems
from palaestra.sandbox.docker.standins import GO, NODE, PYTHON, PYTHON313, RUST, UBUNTU, StandIn

Version = tuple[int, ...]
GENERIC = (PYTHON, PYTHON313, UBUNTU)  # stand-ins with no toolchain of their own to keep
_NUMBER = re.compile(r"\d+(?:\.\d+)*")
_URL = re.compile(r"https?://[^\s\"'`<>|;)]+")
_PPA = re.compile(
    r"\b(?:sudo\s+)?(?:add-apt-repository|apt-add-repository)\s+(?:-y\s+)?"
    r"[\"']?ppa:([\w.+-]+/[\w.+-]+)[\"']?(?:\s+-y)?"
)
_LOCAL = {"localhost", "127.0.0.1", "0.0.0.0", "::1"}
# Commands whose URLs are text, not fetches (unless they write an apt source).
_QUIET = {"echo", "printf", "sed", "grep", "test", "[", "export", "env", "true", ":"}
# Rust editions -> the first rustc that has them (Cargo's rule: no edition is 2015).
EDITIONS = {"2015": (1, 0), "2018": (1, 31), "2021": (1, 56), "2024": (1, 85)}


def _version(text: str) -> Version:
    return tuple(int(p) for p in text.split("."))


def _shown(version: Version) -> str:
    return ".".join(map(str, version))


# -- what the task's files declare ---------------------------------------------------------------
Declared = tuple[Version, str]  # (the minimum, where it is said)


def _files(build: Mapping[str, str], name: str) -> list[tuple[str, str]]:
    return sorted(
        (path, text)
        for path, text in build.items()
        if path.rsplit("/", 1)[-1] == name and "node_modules/" not in path
    )


def _go_mod(build: Mapping[str, str]) -> list[Declared]:
    found = []
    for path, text in _files(build, "go.mod"):
        line = re.search(r"^go\s+(\d+(?:\.\d+)*)\s*$", text, re.M)
        if line:
            found.append((_version(line.group(1)), f"{path} `go {line.group(1)}`"))
    return found


def _cargo_toml(build: Mapping[str, str]) -> list[Declared]:
    found = []
    for path, text in _files(build, "Cargo.toml"):
        try:
            package = tomllib.loads(text).get("package")
        except tomllib.TOMLDecodeError:
            continue
        if not isinstance(package, dict):
            continue
        rust = package.get("rust-version")
        edition = str(package.get("edition", "2015"))
        if isinstance(rust, str) and _NUMBER.fullmatch(rust):
            found.append((_version(rust), f'{path} `rust-version = "{rust}"`'))
        elif edition in EDITIONS:
            said = f"edition {edition}" if "edition" in package else "no edition (2015)"
            found.append((EDITIONS[edition], f"{path} {said}"))
    return found


def engines_minimum(spec: str) -> Version | None:
    """The lowest version a package.json `engines.node` range admits (`>=16`, `^18.0.0`,
    `18.x || 20`): the least of each alternative's first version; None where unreadable."""
    lows = []
    for alternative in spec.split("||"):
        words = alternative.strip()
        if words in ("", "*", "x", "latest"):
            return (0,)
        first = _NUMBER.search(words)
        if first is None:
            return None
        if words.startswith("<"):
            return (0,)  # an upper bound only: any older version will do
        lows.append(_version(first.group(0)))
    return min(lows) if lows else None


def _package_json(build: Mapping[str, str]) -> list[Declared]:
    found = []
    for path, text in _files(build, "package.json"):
        try:
            engines = json.loads(text).get("engines")
        except (ValueError, AttributeError):
            continue
        spec = engines.get("node") if isinstance(engines, dict) else None
        low = engines_minimum(spec) if isinstance(spec, str) else None
        if low is not None:
            found.append((low, f"{path} engines.node `{spec}`"))
    return found


# -- the toolchain installers ---------------------------------------------------------------------
@dataclass(frozen=True)
class Installer:
    """A vendor's toolchain download that a stand-in (or the official image) serves."""

    stand_in: StandIn
    official: str  # the Docker Hub repository of its official image
    download: re.Pattern[str]  # a RUN that fetches it
    version: re.Pattern[str]  # the version it names (group 1), if it names one
    declared: Callable[[Mapping[str, str]], list[Declared]]
    declares: str  # where a task declares its minimum, for messages


INSTALLERS = (
    Installer(
        GO, "golang",
        re.compile(r"https?://(?:golang\.org|go\.dev|dl\.google\.com)/(?:dl|go)/go\d"),
        re.compile(r"/go(\d+\.\d+(?:\.\d+)?)\.(?:linux|src)"),
        _go_mod, "go.mod's `go` line",
    ),
    Installer(
        RUST, "rust",
        re.compile(r"https?://(?:sh\.rustup\.rs|static\.rust-lang\.org/(?:rustup|dist))"),
        re.compile(r"(?:--default-toolchain[= ]|/dist/rust-)(\d+\.\d+(?:\.\d+)?)\b"),
        _cargo_toml, "Cargo.toml's rust-version or edition",
    ),
    Installer(
        NODE, "node",
        re.compile(r"https?://(?:deb\.nodesource\.com/setup_|rpm\.nodesource\.com/setup_"
                   r"|nodejs\.org/dist/v\d)"),
        re.compile(r"(?:setup_|nodejs\.org/dist/v)(\d+)(?:\.x\b|[./])"),
        _package_json, "package.json's engines.node",
    ),
)  # fmt: skip
# Repository of a toolchain tag -> the installer whose declared minimum can run it here.
_BY_REPOSITORY = {i.official: i for i in INSTALLERS}


# -- the Dockerfile, instruction by instruction ---------------------------------------------------
@dataclass
class Step:
    """One instruction: its lines in the file (first, after the last) and its words."""

    start: int
    end: int
    instr: str
    args: str


def steps(text: str) -> list[Step]:
    """The Dockerfile's instructions with the lines each spans (continuations joined)."""
    lines = text.splitlines()
    out: list[Step] = []
    start, buf = None, ""
    for i, raw in enumerate(lines):
        line = raw.strip()
        if start is None and (not line or line.startswith("#")):
            continue
        if start is not None and line.startswith("#"):
            continue
        start = i if start is None else start
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        head, _, rest = buf.strip().partition(" ")
        out.append(Step(start, i + 1, head.upper(), rest.strip()))
        start, buf = None, ""
    if start is not None and buf.strip():
        head, _, rest = buf.strip().partition(" ")
        out.append(Step(start, len(lines), head.upper(), rest.strip()))
    return out


def _from_ref(step: Step) -> str | None:
    words = [w for w in step.args.split() if not w.startswith("--")]
    return words[0] if words else None


# -- judging ------------------------------------------------------------------------------------
@dataclass
class Judged:
    problems: list[str]
    notes: list[str]
    image: str | None = None  # the FROM the stage starts with instead


def _minimum(installer: Installer, build: Mapping[str, str]) -> Declared | None:
    declared = installer.declared(build)
    return max(declared) if declared else None


def _serve(installer: Installer, run: str, base: str, build: Mapping[str, str],
           bases: BaseImages) -> Judged:  # fmt: skip
    """Who serves an installer RUN on the generic base `base`, or why nothing does."""
    url = _URL.search(run)
    where = f"`{url.group(0) if url else run[:80]}`"
    named = installer.version.search(run)
    asked = _version(named.group(1)) if named else None
    stand_in = installer.stand_in
    what = f"{stand_in.toolchain} {_shown(asked) if asked else '(the latest)'}"
    official = f"{installer.official}:{_shown(asked) if asked else 'latest'}"
    said = f"the Dockerfile downloads {what} at build time ({where})"
    if bases.mirror:
        return Judged([], [f"{said}: taken out; the build starts FROM {official} (served by "
                           f"the registry mirror, image_registry_mirror) instead of {base}"],
                      official)  # fmt: skip
    own = bases.aliases.get(official)
    if own is not None:
        return Judged([], [f"{said}: taken out; the build starts FROM {own} (image_aliases "
                           f"{official}) instead of {base}"], own)  # fmt: skip
    minimum = _minimum(installer, build)
    need = minimum[0] if minimum else asked
    gives = f"{stand_in.image} ({stand_in.toolchain} {stand_in.shown}, Debian bookworm)"
    if need is not None and fits(need, stand_in):
        because = f"{minimum[1]} needs " if minimum else "it asks for "
        note = (
            f"{said}: taken out; {because}{_shown(need)}, served by {gives}: the build starts "
            f"FROM it instead of {base}"
        )
        return Judged([], [note], stand_in.image)
    because = (
        f"{minimum[1]} needs {_shown(minimum[0])}" if minimum else
        f"the task's files declare no minimum ({installer.declares})"
    )  # fmt: skip
    return Judged([
        f"{said}, newer than its local stand-in {gives} has, and {because}; set "
        f"image_registry_mirror, or map {official} to an image of your own in image_aliases"
    ], [])  # fmt: skip


def _tag(ref: str, build: Mapping[str, str], bases: BaseImages) -> Judged:
    """A toolchain tag newer than its stand-in that the task's declared minimum lets run."""
    repo, _ = split_ref(ref)
    installer = _BY_REPOSITORY.get(repo)
    refused, _notes = bases.check(ref)
    minimum = _minimum(installer, build) if installer and refused else None
    if installer is None or minimum is None or not fits(minimum[0], installer.stand_in):
        return Judged([], [])
    stand_in = installer.stand_in
    return Judged([], [
        f"base image {ref} asks for a newer {stand_in.toolchain} than its local stand-in has; "
        f"{minimum[1]} needs {_shown(minimum[0])}: runs on {stand_in.image} "
        f"({stand_in.toolchain} {stand_in.shown})"
    ], stand_in.image)  # fmt: skip


def _generic(base: str, bases: BaseImages) -> bool:
    """`base` is (or maps to) a stand-in with no toolchain of its own."""
    return base in GENERIC or alias_of(base, bases.aliases) in GENERIC


def reaches(host: str, hosts: tuple[str, ...]) -> bool:
    """Whether a build reaches `host`: listed, under a listed `*.domain`, or '*' listed."""
    host = host.lower().rstrip(".")
    return any(
        h == "*" or h.lower() == host or (h.startswith("*.") and host.endswith(h[1:].lower()))
        for h in hosts
    )


def fetched_urls(step: Step) -> list[str]:
    """The URLs a RUN fetches (those in a command that is not just text, or that writes an apt
    source), or an ADD's remote sources."""
    if step.instr == "ADD":
        return [w for w in step.args.split() if re.match(r"https?://", w)]
    if step.instr != "RUN":
        return []
    urls = []
    for command in re.split(r"&&|\|\||;|\n", step.args):
        words = [w for w in command.split() if not re.match(r"^\w+=", w) and w != "sudo"]
        if words and words[0].strip("(") in _QUIET and "sources.list" not in command:
            continue
        urls += [u.rstrip(".,") for u in _URL.findall(command)]
    return urls


def download_problems(step: Step, hosts: tuple[str, ...]) -> list[str]:
    problems = []
    for url in dict.fromkeys(fetched_urls(step)):
        host = urlsplit(url).hostname or url
        if host in _LOCAL or reaches(host, hosts):
            continue
        problems.append(
            f"the Dockerfile downloads from {host} at build time (`{url}`), which a build "
            f"here does not reach (build_hosts: {', '.join(hosts) or 'none'}); add {host} "
            "to build_hosts where your builds reach it, or '*'"
        )
    return problems


def serve_downloads(
    build: MutableMapping[str, str], bases: BaseImages
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the build-time downloads of a task's build context `build` (see
    the module doc); where a stand-in or the mirror serves one, `build[DOCKERFILE]` is
    rewritten: the installer RUN taken out and its stage started FROM the image that serves it.
    Nothing without a Dockerfile."""
    text = build.get(DOCKERFILE)
    if text is None:
        return [], []
    lines = text.splitlines()
    problems: list[str] = []
    notes: list[str] = []
    stage: Step | None = None  # the FROM of the stage at hand
    served: dict[int, str] = {}  # a stage's FROM line -> the image it starts with instead
    rewritten = False  # a RUN changed in place (a PPA taken out)
    for step in steps(text):
        ref = _from_ref(step) if step.instr == "FROM" else None
        if ref is not None:
            stage = step
            judged = _tag(ref, build, bases)
            notes += judged.notes
            if judged.image:
                served[step.start] = judged.image
            continue
        base = _from_ref(stage) if stage else None
        installer = next((i for i in INSTALLERS if i.download.search(step.args)), None)
        if (
            step.instr == "RUN" and installer and stage and base and stage.start not in served
            and _generic(base, bases)
        ):  # fmt: skip
            judged = _serve(installer, step.args, base, build, bases)
            problems += judged.problems
            notes += judged.notes
            if judged.image:
                served[stage.start] = judged.image
                lines[step.start : step.end] = [
                    f"# (taken out at import: {judged.image} serves it)"
                ] + [""] * (step.end - step.start - 1)
            continue
        if step.instr == "RUN" and base and _generic(base, bases) and _PPA.search(step.args):
            ppas = ", ".join(f"ppa:{m}" for m in _PPA.findall(step.args))
            lines[step.start : step.end] = [f"RUN {_PPA.sub('true', step.args)}"] + [""] * (
                step.end - step.start - 1
            )
            rewritten = True
            notes.append(
                f"the Dockerfile adds a Launchpad PPA ({ppas}), which is for Ubuntu: taken out "
                f"on the Debian bookworm stand-in of {base}, whose own packages serve the "
                "apt installs that follow (a package bookworm lacks fails the build)"
            )
            continue
        problems += download_problems(step, bases.build_hosts)
    froms = {s.start: _from_ref(s) or "" for s in steps(text) if s.instr == "FROM"}
    for at, image in served.items():
        lines[at] = lines[at].replace(froms[at], image, 1)
    if served or rewritten:
        build[DOCKERFILE] = "\n".join(lines) + "\n"
    # and what its tests would download when they build (a crate's or a module's packages)
    return problems + dependency_problems(build, text), notes
