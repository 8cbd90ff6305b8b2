"""Sandboxes: the backend and its warm pool, the images and toolchains a task may name, and
where a sandbox with internet access may go."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    SecretStr,
    field_serializer,
    field_validator,
)

from palaestra.sandbox.base import default_cache
from palaestra.sandbox.docker.engine import BASE_IMAGE
from palaestra.sandbox.docker.standins import DEFAULT_BUILD_HOSTS, DEFAULT_IMAGE_ALIASES
from palaestra.sandbox.egress import DEFAULT_ALLOW, AllowList, parse_reachable
from palaestra.server.settings.shown import secret_shown
from palaestra.shipped import shipped_dir

REPO_IMAGES = shipped_dir("images")  # the image recipes: in the wheel, or the checkout's
BUILT_IMAGES = ("base", "cad", "coding", "terminal")  # images/ when the tree is not at hand


def default_images() -> list[str]:
    """The image recipes the project builds (images/<name>/Dockerfile or build.sh)."""
    if not REPO_IMAGES.is_dir():
        return list(BUILT_IMAGES)
    return sorted(
        d.name
        for d in REPO_IMAGES.iterdir()
        if (d / "Dockerfile").is_file() or (d / "build.sh").is_file()
    )


_MIRROR = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d{1,5})?(?:/[a-z0-9._/-]+)?")


def _host_ca() -> Path | None:
    path = Path("/etc/ssl/certs/ca-certificates.crt")
    return path if path.is_file() else None


class SandboxSettings(BaseModel):
    """The sandbox backend (bwrap, docker, e2b), its folders and its warm pool."""

    model_config = ConfigDict(extra="forbid")

    sandbox: str = Field(default="bwrap", description="sandbox backend")
    cache: Path = Field(
        default_factory=lambda: default_cache(),
        description=(
            "cache folder: the exec helper's build, image rootfs folders, docker's bash, "
            "generated tasks and finance reports"
        ),
    )
    toolchains_dir: Path | None = Field(
        default=None,
        description=(
            "cad toolchains (scripts/bootstrap-cad.sh; default /opt/palaestra/toolchains "
            "where it exists, else .toolchains in the checkout)"
        ),
    )
    images_dir: Path | None = Field(
        default=None,
        description="bwrap image rootfs folders <name>/rootfs (default <cache>/images)",
    )
    exec_helper: bool = Field(
        default=True, description="bwrap: start jails through the exec helper (built on first use)"
    )
    docker_image: str = Field(
        default=BASE_IMAGE, description="docker: the image of a spec without one"
    )
    forkserver: bool = Field(
        default=True,
        description="bwrap: one-shot Python runs in a fork server (false: a fresh sandbox each)",
    )
    e2b_api_key: SecretStr | None = Field(
        default=None, description="e2b backend: the API key (also read from E2B_API_KEY)"
    )
    pool_size: int = Field(
        default=4, ge=0, description="warm sandboxes kept ready per sandbox spec (0: no pool)"
    )
    pool_max_total: int = Field(default=64, ge=1, description="warm sandboxes over all specs")
    spool_dir: Path | None = Field(
        default=None,
        description=(
            "where a workspace moved between sandboxes (a verifier's copy) waits on disk, in "
            "files removed as soon as it is moved; never a folder a sandbox sees (default "
            "<data_dir>/tmp)"
        ),
    )

    @field_serializer("e2b_api_key", when_used="json")
    def _e2b_key_shown(self, value: SecretStr | None, info: FieldSerializationInfo) -> str | None:
        return secret_shown(value, info)  # workers of a cluster front get it whole


class ImageSettings(BaseModel):
    """What a task's `image` and `toolchain` may name (a trust boundary for published packs,
    docs/security.md), and how a task's environment image is built."""

    model_config = ConfigDict(extra="forbid")

    images: list[str] = Field(
        default_factory=lambda: default_images(),
        description="image names a task's `image` may use (default: the recipes under images/)",
    )
    image_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_IMAGE_ALIASES),
        description=(
            "task environment builds: base image -> local image, for FROM lines (a key "
            "without a tag matches every tag); toml table [image_aliases]; default: the "
            "stand-ins under images/ (docs/sandbox-images.md)"
        ),
    )
    image_registry_mirror: str | None = Field(
        default=None,
        description=(
            "an internal registry mirror serving the public base images (host[:port][/path]): "
            "FROM golang:1.22 is pulled as <mirror>/library/golang:1.22 instead of a stand-in"
        ),
    )
    build_hosts: list[str] = Field(
        default_factory=lambda: list(DEFAULT_BUILD_HOSTS),
        description=(
            "hosts a task environment's `docker build` reaches (host, *.domain, or '*' for "
            "any): a Dockerfile that downloads from another is refused at import naming it; "
            "default the package registries (docs/sandbox-images.md)"
        ),
    )
    env_build_timeout_s: float = Field(
        default=1800.0, gt=0, allow_inf_nan=False, description="one environment image's build"
    )
    env_context_max_mb: int = Field(
        default=64, ge=1, description="a task environment's build context at most"
    )
    build_ca_file: Path | None = Field(
        default_factory=lambda: _host_ca(),
        description=(
            "trust store copied into the stand-in base images (a TLS proxy to the package "
            "registry); default the host's /etc/ssl/certs/ca-certificates.crt"
        ),
    )
    toolchains: list[str] = Field(
        default_factory=lambda: ["trimesh", "blender"],
        description="toolchain names a task's `toolchain` may use",
    )

    @field_validator("image_registry_mirror")
    @classmethod
    def _mirror_ref(cls, value: str | None) -> str | None:
        if value is not None and not _MIRROR.fullmatch(value):
            raise ValueError(
                f"image_registry_mirror {value!r} is not host[:port][/path] "
                "(no scheme, e.g. registry.internal:5000 or mirror.example/hub)"
            )
        return value


class EgressSettings(BaseModel):
    """Egress of tasks that declare internet access (docs/security.md "Network")."""

    model_config = ConfigDict(extra="forbid")

    egress_allow: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOW),
        description=(
            "hosts a sandbox with internet access may reach through the egress proxy:"
            " host, *.domain, either with :port (default ports 80, 443); [] for none"
        ),
    )
    egress_private: list[str] = Field(
        default_factory=list,
        description=(
            "ip:port of a mirror on a private address the egress proxy may connect to"
            " (its name still must be on egress_allow)"
        ),
    )

    @field_validator("egress_allow")
    @classmethod
    def _egress_rules(cls, value: list[str]) -> list[str]:
        AllowList.parse(value)
        return value

    @field_validator("egress_private")
    @classmethod
    def _egress_pairs(cls, value: list[str]) -> list[str]:
        parse_reachable(value)
        return value
