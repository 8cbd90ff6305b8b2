"""The local stand-ins for public base images (images/<name>/Dockerfile, Debian bookworm's
packages; python3.13's Debian trixie's), for sites with no registry: the default of
`Settings.image_aliases` and what each toolchain stand-in gives (envs/terminal/baseimages.py
judges a task's tag against it; docs/sandbox-images.md, "Base images"). Data only, so
Settings can name it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StandIn:
    """A toolchain stand-in: its image, what it gives, and whether a newer tag is refused."""

    image: str
    toolchain: str
    version: tuple[int, ...]  # Debian bookworm's
    strict: bool = True  # a tag asking for a newer version is refused (else noted)

    @property
    def shown(self) -> str:
        return ".".join(map(str, self.version))


PYTHON = "palaestra/python:latest"
PYTHON313 = "palaestra/python3.13:latest"  # Debian trixie's python3 (images/python3.13)
# The Python minor each stand-in that runs Python has (envs/terminal/pyminor.py).
PYTHON_MINORS: dict[str, tuple[int, int]] = {PYTHON: (3, 11), PYTHON313: (3, 13)}
UBUNTU = "palaestra/ubuntu:latest"
GO = StandIn("palaestra/golang:latest", "Go", (1, 19))
RUST = StandIn("palaestra/rust:latest", "Rust", (1, 63))
NODE = StandIn("palaestra/node:latest", "Node.js", (18,))
JAVA = StandIn("palaestra/java:latest", "Java (OpenJDK)", (17,))
GCC = StandIn("palaestra/gcc:latest", "GCC", (12,), strict=False)
MAVEN = StandIn(JAVA.image, "Maven", (3, 8), strict=False)  # its tag names Maven's version
# The hosts a `docker build` of a task's environment reaches here: the package registries
# (the Debian mirror apt uses, PyPI, npm); the default of `Settings.build_hosts`.
DEFAULT_BUILD_HOSTS = (
    "deb.debian.org", "security.debian.org", "pypi.org", "files.pythonhosted.org",
    "registry.npmjs.org",
)  # fmt: skip
# Repository (no tag: every tag) -> the toolchain stand-in it maps to.
TOOLCHAINS: dict[str, StandIn] = {
    "golang": GO,
    "rust": RUST,
    "node": NODE,
    "openjdk": JAVA,
    "eclipse-temurin": JAVA,
    "amazoncorretto": JAVA,
    "maven": MAVEN,
    "gcc": GCC,
}
TOOLCHAIN_IMAGES = tuple(t.image for t in TOOLCHAINS.values())
# The images/ recipes built only when a pack's environment needs them (`images build --pack`,
# or by name), not by a plain `palaestra images build`.
ON_DEMAND = tuple(sorted({i.split("/")[1].split(":")[0] for i in (PYTHON313, *TOOLCHAIN_IMAGES)}))

# Base images real Terminal-Bench / Harbor tasks use -> the stand-ins under images/ (the
# default of Settings.image_aliases; a key without a tag matches every tag). Python 3.12 to
# 3.14 run on trixie's 3.13: no 3.12 is to be had, and 3.13 runs all of its syntax
# (docs/decisions.md, "Python 3.12 runs on 3.13").
_PY_TAGS = ("", "-slim", "-slim-bookworm", "-bookworm", "-slim-bullseye", "-bullseye",
            "-slim-trixie", "-trixie")  # fmt: skip
DEFAULT_IMAGE_ALIASES: dict[str, str] = {
    **{
        name: PYTHON
        for name in (
            "python", "python:3", "python:3-slim", "python:latest", "python:slim",
            *(f"python:3.{minor}{v}" for minor in range(8, 12) for v in _PY_TAGS),
        )
    },
    **{
        name: PYTHON313
        for name in (
            *(f"python:3.{minor}{v}" for minor in range(12, 15) for v in _PY_TAGS),
            "ghcr.io/laude-institute/t-bench/python-3-13",
        )
    },
    **{
        name: UBUNTU
        for name in (
            "ubuntu", "ubuntu:latest", "ubuntu:20.04", "ubuntu:22.04", "ubuntu:24.04",
            "debian", "debian:bookworm", "debian:bookworm-slim", "debian:12", "debian:12-slim",
            "debian:stable-slim", "buildpack-deps", "buildpack-deps:jammy",
            "buildpack-deps:bookworm", "ghcr.io/laude-institute/t-bench/ubuntu-24-04",
            "ghcr.io/laude-institute/t-bench/base",
        )
    },
    **{repo: stand_in.image for repo, stand_in in TOOLCHAINS.items()},
}  # fmt: skip
