"""The fields of a terminal task (the pack loader checks them; the family reads them)."""

from __future__ import annotations

import posixpath
from typing import Any, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from palaestra.envs import PrivateFields, PublicFields
from palaestra.envs.paths import DEFAULT_WORKDIR
from palaestra.envs.terminal.installs import REQUIREMENT
from palaestra.sandbox.egress import AllowList

SETUP_TIMEOUT_S = 120.0


class TerminalPublic(PublicFields):
    instruction: str = ""
    workdir: str = DEFAULT_WORKDIR
    image: str | None = None  # default: the family's image where the backend has it
    workspace_mb: int = 256
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 512
    env: dict[str, str] = Field(default_factory=dict)
    environment: dict[str, str] = Field(default_factory=dict)  # files put in the workdir
    # Binary files by digest, "environment/<path>" -> "sha256:<hex>" (the pack loader checks
    # them, server/packs/blobs.py): the environment's are put in the workdir too.
    blobs: dict[str, str] = Field(default_factory=dict)
    setup_timeout_s: float = SETUP_TIMEOUT_S
    timeout_s: float | None = None
    # Egress through the server's allow-list proxy (the operator's egress_allow), never
    # open; False (the default): no network at all.
    allow_internet: bool = False
    # With allow_internet: the only hosts the sandbox may reach (host, *.domain, host:port),
    # each also on the operator's list (a Harbor task's allowed_hosts). Empty: that list.
    allowed_hosts: list[str] = Field(default_factory=list)
    agent_timeout_s: float | None = None  # the episode's wall time unless the client sets one

    @field_validator("workdir", "env", "environment", mode="before")
    @classmethod
    def _unset(cls, value: object, info: ValidationInfo) -> object:
        """An empty or null field reads as not given."""
        if value in (None, ""):
            return DEFAULT_WORKDIR if info.field_name == "workdir" else {}
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, workdir: str) -> str:
        if not posixpath.isabs(workdir) or posixpath.normpath(workdir) == "/":
            raise ValueError(f"workdir must be an absolute path, got {workdir!r}")
        return posixpath.normpath(workdir)

    @model_validator(mode="after")
    def _hosts(self) -> Self:
        if self.allowed_hosts and not self.allow_internet:
            raise ValueError("allowed_hosts without allow_internet: a task with no network")
        AllowList.parse(self.allowed_hosts)  # ValueError naming a bad entry
        return self


class TerminalPrivate(PrivateFields):
    verifier: dict[str, str] = Field(default_factory=dict)  # verifier/test.sh and its files
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    verifier_timeout_s: float | None = None
    reward_file: bool = False
    # The verifier sandbox's image (default: the agent's): "verifier" (uv/uvx and pytest
    # wheels on the default image) or a task's own tests/Dockerfile image (the importer
    # writes its digest tag); envs/terminal/verifierimage.py builds both.
    verifier_image: str | None = None
    solution: dict[str, str] = Field(default_factory=dict)  # solution/solve.sh
    # Test-time installs (envs/terminal/installs.py): pip requirements by name installed for
    # the verifier, before its tests, in a sandbox of their own that reaches only
    # `verifier_hosts` through the egress proxy (each also on the operator's egress_allow).
    verifier_installs: list[str] = Field(default_factory=list)
    verifier_hosts: list[str] = Field(default_factory=list)
    # The fields of an imported Harbor task.toml that no field above holds, as given (for
    # `palaestra pack export harbor`; envs/terminal/harbor/).
    harbor: dict[str, Any] = Field(default_factory=dict)
    # build/: the Docker build context the task's environment image is built from
    # (envs/terminal/envimage.py); the task then runs in that image on docker.
    build: dict[str, str] = Field(default_factory=dict)
    # Binary files by digest, "verifier/<path>" (staged with the verifier's files),
    # "solution/<path>" or "build/<path>" -> "sha256:<hex>".
    blobs: dict[str, str] = Field(default_factory=dict)

    @field_validator("verifier", "solution", "build", "fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _unset(cls, value: object, info: ValidationInfo) -> object:
        if value is None:
            return [] if info.field_name in ("fail_to_pass", "pass_to_pass") else {}
        return value

    @field_validator("verifier_installs")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        bad = [r for r in value if not REQUIREMENT.match(r)]
        if bad:
            raise ValueError(f"verifier_installs {bad[0]!r} is not a requirement by name")
        return value

    @model_validator(mode="after")
    def _verifiable(self) -> Self:
        if self.verifier_installs and not self.verifier_hosts:
            raise ValueError("verifier_installs without verifier_hosts: nothing to install from")
        AllowList.parse(self.verifier_hosts)  # ValueError naming a bad entry
        if "test.sh" not in self.verifier and not (self.fail_to_pass or self.pass_to_pass):
            raise ValueError(
                "neither verifier/test.sh nor [private] fail_to_pass / pass_to_pass: "
                "the task cannot be verified"
            )
        return self
