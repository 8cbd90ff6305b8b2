"""The harnesses this server can start in an episode's sandbox (docs/harness.md).

An entry says how to start one (its argv, its environment, the files it needs written
first), which settings a client may give it (a pydantic model: an unknown key or a wrong
type is a 422 naming it), and what the sandbox must have bound for it to run (`needs`:
host directories bound read-only, or the reason it cannot run here and how to fix that,
a 503 at reset that is the operator's, never the policy's). Nothing here runs a shell: the
argv is a list and config values reach the harness only through its files and flags.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from palaestra.sandbox.base import ExecResult
from palaestra.sdk.errors import InvalidActionError, UnavailableError
from palaestra.sdk.failures import Failure
from palaestra.server import served
from palaestra.server.config import Settings

PROGRAMS_TARGET = "/opt/palaestra/harness"  # where they are bound inside a sandbox
HARNESS_DIR = ".palaestra-harness"  # under the sandbox's workdir: instruction and config
INSTRUCTION_FILE = "instruction.md"
PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class Bound:
    """What a harness needs in the sandbox: read-only binds and environment, or why not."""

    ro_binds: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    unavailable: str | None = None  # the reason, with how to install it


@dataclass(frozen=True)
class Launch:
    """One start of a harness: where it runs, on what, against which model."""

    workdir: str  # the sandbox's workdir (the files below are written under it)
    instruction: str  # the task's first observation: what the agent is asked to do
    base_url: str  # the session proxy, OpenAI style (…/v1)
    model: str

    def path(self, name: str) -> str:
        """`name` under the harness's folder in the sandbox, as an absolute path."""
        return f"{self.workdir}/{HARNESS_DIR}/{name}"

    @property
    def instruction_path(self) -> str:
        return self.path(INSTRUCTION_FILE)


@dataclass(frozen=True)
class Outcome:
    """How a harness says its run ended, read from its output (an ACP client's stop reason):
    the reason, and an agent failure (sdk/failures.py, a kind the policy can cause: the
    episode is verified and scores what it earns, never void) where the run broke down."""

    reason: str
    failure: Failure | None = None


class HarnessConfig(BaseModel):
    """Base of a harness's client settings (`options.harness.config`): unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


@dataclass(frozen=True)
class Harness:
    name: str
    description: str
    config_model: type[HarnessConfig]
    argv: Callable[[Launch, HarnessConfig], list[str]]
    # Files to write before it starts, by name under HARNESS_DIR (its config file).
    files: Callable[[Launch, HarnessConfig], dict[str, str]] = field(default=lambda *_: {})
    needs: Callable[[Settings], Bound] = field(default=lambda _: Bound())
    extra_env: Callable[[Launch], dict[str, str]] = field(default=lambda _: {})
    install: str = ""  # how an operator makes it available
    # How it ended, from its exec's result (None: "exited with code N").
    outcome: Callable[[ExecResult], Outcome | None] = field(default=lambda _: None)

    def config(self, given: dict[str, Any]) -> HarnessConfig:
        """The client's config over the defaults; 422 naming what is wrong."""
        try:
            return self.config_model.model_validate(given)
        except ValidationError as exc:
            allowed = ", ".join(self.config_model.model_fields) or "none"
            problems = "; ".join(
                f"config.{'.'.join(str(p) for p in e['loc']) or '<config>'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidActionError(
                f"harness {self.name!r}: {problems}; its config keys are: {allowed}",
                code="invalid_harness",
            ) from None

    def env(self, launch: Launch, bound: Bound) -> dict[str, str]:
        """The model's address as OpenAI clients read it (the key is a placeholder: the
        sandbox's one listener serves this episode alone), the toolchain's variables and
        the harness's own."""
        return {
            "OPENAI_BASE_URL": launch.base_url,
            "OPENAI_API_BASE": launch.base_url,
            "OPENAI_API_KEY": "palaestra-session",
            "OPENAI_MODEL": launch.model,
            **dict(bound.env),
            **self.extra_env(launch),
        }

    def bound(self, settings: Settings) -> Bound:
        """What to bind for it; 503 naming the reason where it cannot run on this server."""
        bound = self.needs(settings)
        if bound.unavailable is not None:
            raise UnavailableError(
                f"harness {self.name!r} is not available on this server: {bound.unavailable}"
                + (f"; {self.install}" if self.install else ""),
                code="harness_unavailable",
            )
        return bound


class HarnessRegistry:
    """Harnesses by name; `get` is a 422 listing the names for one it does not hold."""

    def __init__(self, harnesses: list[Harness] | None = None) -> None:
        self._by_name = {h.name: h for h in (builtin() if harnesses is None else harnesses)}

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> Harness:
        harness = self._by_name.get(name)
        if harness is None:
            shown = json.dumps(name[:64])
            raise InvalidActionError(
                f"unknown harness {shown}; this server has: {', '.join(self.names())}",
                code="unknown_harness",
            )
        return harness


# -- bash-agent ------------------------------------------------------------------------------


class BashAgentConfig(HarnessConfig):
    max_turns: int = Field(default=30, ge=1, le=1000, description="model calls at most")
    command_timeout_s: float = Field(default=30.0, gt=0, le=600, description="one command")
    api: Literal["chat", "responses"] = Field(
        default="chat", description="the model API it speaks: chat completions or Open Responses"
    )


def programs(_: Settings) -> Bound:
    """The built-in agents' programs, from the copy served to sandboxes (server/served.py)."""
    try:
        programs = served.library().harness
    except served.ServeError as e:
        return Bound(unavailable=str(e))
    if not (programs / "bash_agent.py").is_file():
        return Bound(unavailable=f"{programs / 'bash_agent.py'} is missing from this install")
    return Bound(ro_binds=((str(programs), PROGRAMS_TARGET),))


def _bash_argv(launch: Launch, config: HarnessConfig) -> list[str]:
    assert isinstance(config, BashAgentConfig)
    return [
        PYTHON,
        f"{PROGRAMS_TARGET}/bash_agent.py",
        "--instruction-file",
        launch.instruction_path,
        "--max-turns",
        str(config.max_turns),
        "--command-timeout",
        f"{config.command_timeout_s:g}",
        "--api",
        config.api,
    ]


BASH_AGENT = Harness(
    name="bash-agent",
    description="palaestra's minimal agent (stdlib Python): one bash tool, OpenAI chat calls",
    config_model=BashAgentConfig,
    argv=_bash_argv,
    needs=programs,
    install="reinstall palaestra (server/harness/programs/ ships with it)",
)


def builtin() -> list[Harness]:
    """The harnesses every server has (mini-swe-agent and the ACP agent: see
    server/harness/toolchain.py)."""
    from palaestra.server.harness.acp import ACP_AGENT
    from palaestra.server.harness.miniswe import MINI_SWE_AGENT

    return [BASH_AGENT, MINI_SWE_AGENT, ACP_AGENT]
