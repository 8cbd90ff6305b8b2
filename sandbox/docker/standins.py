"""The local stand-ins for public base images (images/<name>/Dockerfile, Debian bookworm's
packages), for sites with no registry: the default of `Settings.image_aliases` and what each
toolchain stand-in gives (envs/terminal/baseimages.py judges a task's tag against it;
docs/sandbox-images.md, "Base images"). Data only, so Settings can name it."""

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
# The images/ recipes built only when a pack's environment needs them (`images build --pack`,
# or by name), not by a plain `palaestra images build`.
ON_DEMAND = tuple(sorted({s.image.split("/")[1].split(":")[0] for s in TOOLCHAINS.values()}))

# Base images real Terminal-Bench / Harbor tasks use -> the stand-ins under images/ (the
# default of Settings.image_aliases; a key without a tag matches every tag).
DEFAULT_IMAGE_ALIASES: dict[str, str] = {
    **{
        name: PYTHON
        for name in (
            "python", "python:3", "python:3-slim", "python:latest", "python:slim",
            *(f"python:3.{minor}{v}" for minor in range(8, 15) for v in ("", "-slim",
              "-slim-bookworm", "-bookworm", "-slim-bullseye", "-bullseye")),
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
