"""A task's Dockerfile as the terminal family's environment (docs/terminal.md).

The Dockerfile's WORKDIR becomes the task's workdir, the files it COPYs `environment/`
files (binary ones the pack's blobs), its other RUN steps `environment/setup.sh` and its
ENV lines the task's `env`; what the sandbox cannot give (the network, another base image,
services, root, files outside the workdir) becomes a problem that names the instruction.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_WORKDIR = "/app"
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
NAMES_MINOR = re.compile(r"python[:-]?3[.-]\d+")  # python:3.13-slim, t-bench's python-3-13
SHELLS = {"bash", "sh", "/bin/bash", "/bin/sh", "zsh", "sleep", "tail"}
WRITE_CMDS = {"mkdir", "touch", "cp", "mv", "ln", "chmod", "chown", "tee", "install", "rm"}


@dataclass
class EnvPlan:
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # relative to the workdir
    binaries: dict[str, Path] = field(default_factory=dict)  # the same, binary: the source
    build_binaries: dict[str, Path] = field(default_factory=dict)  # a build context's
    setup: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    path: str | None = None  # ENV PATH (kept for tasks that run in their built image)


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


def read_text(path: Path) -> str | None:
    """The file as UTF-8 text, or None if it is binary."""
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
            if not within(path, context):
                plan.problems.append(
                    f"the Dockerfile copies {src}, which is outside the task folder or a symlink"
                )
                continue
            if not path.exists():
                plan.problems.append(f"the Dockerfile copies {src}, which is not in the task")
                continue
            if path.is_dir():
                for f in sorted(p for p in path.rglob("*") if p.is_file()):
                    if not within(f, context):
                        plan.problems.append(f"{f.name} is a symlink; packs hold files only")
                        continue
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


def within(path: Path, root: Path) -> bool:
    """`path` is inside `root` with no symlink on the way (a task's files are its own)."""
    if not path.resolve().is_relative_to(root.resolve()):
        return False
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return False
    return not any((root.joinpath(*parts[: i + 1])).is_symlink() for i in range(len(parts)))


def _excluded(rel: str, exclude: set[str]) -> bool:
    top = rel.split("/")[0]
    return top in exclude or any(fnmatch.fnmatch(rel, pat) for pat in exclude)


def _add_file(plan: EnvPlan, path: Path, rel: str) -> None:
    if rel.startswith("../") or rel == "..":
        plan.problems.append(f"{path.name} would land outside the workdir")
        return
    text = read_text(path)
    if text is None:  # a blob of the pack (server/packs/blobs.py)
        plan.binaries[rel] = path
    else:
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
            elif "python" in image and not (  # one naming a minor: pyminor.py's to note
                image.startswith("palaestra/") or NAMES_MINOR.search(image)
            ):
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
                if len(pair) == 2 and pair[0] == "PATH":
                    plan.path = pair[1]
                elif len(pair) == 2 and pair[0] not in ("PATH", "HOME", "DEBIAN_FRONTEND"):
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
