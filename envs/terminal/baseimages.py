"""Public base images without a registry: the local stand-ins, the operator's mirror, and why
a task's base image cannot be had here (docs/sandbox-images.md, "Base images").

A task's Dockerfile starts `FROM` a public image (`golang:1.22`, `node:20-bookworm`, ...) that
no registry here serves. `Settings.image_aliases` maps each such image to a stand-in built
locally from images/ (Debian bookworm's packages); `Settings.image_registry_mirror` names an
internal registry that serves the public images instead (`FROM golang:1.22` is then pulled as
`<mirror>/library/golang:1.22`). A stand-in carries Debian bookworm's toolchain, so a tag that
asks for a newer one (`golang:1.22` versus bookworm's Go 1.19) is refused at import for the
toolchains whose newer versions break builds (Go, Rust, Node, Java) and noted for C/C++. A base
image with neither a stand-in nor a mirror is refused at import naming the image, never left
for a build log to say.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from palaestra.envs.terminal.dockerfile import dockerfile_instructions
from palaestra.sandbox.docker.standins import DEFAULT_BUILD_HOSTS, TOOLCHAINS, StandIn

_VERSION = re.compile(r"^(\d+)(?:\.(\d+))?")


def split_ref(ref: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; tag "" when it has none (a digest is dropped)."""
    bare = ref.split("@", 1)[0]
    if ":" in bare.rsplit("/", 1)[-1]:
        repo, tag = bare.rsplit(":", 1)
        return repo, tag
    return bare, ""


def alias_of(ref: str, aliases: Mapping[str, str]) -> str | None:
    """The local image `ref` maps to: an exact key, else its repository without tag or digest."""
    if ref in aliases:
        return aliases[ref]
    return aliases.get(split_ref(ref)[0])


def mirrored(ref: str, mirror: str) -> str:
    """`ref` as the operator's registry mirror serves it: Docker Hub's official images under
    `library/` (`golang:1.22` -> `<mirror>/library/golang:1.22`), other Hub images as they are
    named, another registry's images under their host (`<mirror>/ghcr.io/org/img:tag`)."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        path = f"library/{ref}"
    elif "." in first or ":" in first or first == "localhost":
        path = ref if first != "docker.io" else ref.split("/", 1)[1]
    else:
        path = ref
    return f"{mirror.rstrip('/')}/{path}"


def _tag_version(tag: str) -> tuple[int, ...] | None:
    found = _VERSION.match(tag)
    if found is None:
        return None
    return tuple(int(g) for g in found.groups() if g is not None)


def fits(wanted: tuple[int, ...], stand_in: StandIn) -> bool:
    """Whether the stand-in gives `wanted`, compared on the parts both name (`1.19` fits Go
    1.19.8, `18` fits Node 18.20)."""
    return wanted[: len(stand_in.version)] <= stand_in.version[: len(wanted)]


@dataclass
class BaseImages:
    """How FROM lines are served here: the alias map, the operator's mirror (or None), and
    the hosts a build reaches (Settings.build_hosts; envs/terminal/downloads.py)."""

    aliases: Mapping[str, str]
    mirror: str | None = None
    build_hosts: tuple[str, ...] = DEFAULT_BUILD_HOSTS

    def resolve(self, ref: str) -> str | None:
        """The image a build uses for `ref`: the mirror's copy where a mirror is set (local
        palaestra/ images stay as they are), else its stand-in; None where neither serves it."""
        if ref.startswith("palaestra/"):
            return ref
        if self.mirror:
            return mirrored(ref, self.mirror)
        return alias_of(ref, self.aliases)

    def check(self, ref: str) -> tuple[list[str], list[str]]:
        """(problems, notes) of one FROM image: none served, or a toolchain newer than its
        stand-in's (see the module docstring)."""
        if ref.startswith("palaestra/") or self.mirror:
            return [], []
        local = alias_of(ref, self.aliases)
        if local is None:
            return [
                f"base image {ref} has no local stand-in (image_aliases) and no registry "
                "mirror is set (image_registry_mirror)"
            ], []
        repo, tag = split_ref(ref)
        stand_in = TOOLCHAINS.get(repo)
        if (ref in self.aliases and ref != repo) or stand_in is None or local != stand_in.image:
            return [], []  # the operator's own alias, or not a toolchain stand-in
        wanted = _tag_version(tag)
        if wanted is None:
            return [], [f"base image {ref}: runs on {stand_in.toolchain} {stand_in.shown}"]
        if fits(wanted, stand_in):
            return [], []
        shown = ".".join(map(str, wanted))
        if stand_in.strict:
            return [
                f"base image {ref} asks for {stand_in.toolchain} {shown}; its local stand-in "
                f"has {stand_in.shown} (Debian bookworm; set image_registry_mirror, or map "
                f"{ref} to an image of your own in image_aliases)"
            ], []
        return [], [f"base image {ref}: runs on {stand_in.toolchain} {stand_in.shown}"]


def from_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's FROM lines name (not its earlier stages, not ARG-expanded)."""
    stages: set[str] = set()
    found: list[str] = []
    for instr, args in dockerfile_instructions(dockerfile):
        if instr != "FROM":
            continue
        words = [w for w in args.split() if not w.startswith("--")]
        if not words:
            continue
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if words[0].lower() not in stages:
            found.append(words[0])
    return found


def base_problems(dockerfile: str, bases: BaseImages) -> tuple[list[str], list[str]]:
    """(problems, notes) over every FROM image of a task's Dockerfile."""
    problems: list[str] = []
    notes: list[str] = []
    for ref in from_images(dockerfile):
        if "$" in ref:
            problems.append(f"base image {ref} is set by a build argument; name the image")
            continue
        bad, said = bases.check(ref)
        problems += bad
        notes += said
    return problems, notes
