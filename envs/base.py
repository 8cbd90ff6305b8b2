"""What a family is: its tools, its episode logic and its verifier (DESIGN §1).

A family never imports the server. The episode manager hands it an `EpisodeContext`
(the task, the episode's sandbox, a factory for fresh sandboxes, a scratch dict) and
calls `reset`, `step` and `verify`. Tool arguments are pydantic models, so their JSON
Schema is what trainers see and a malformed action is refused with a 422.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from palaestra.sandbox import Sandbox, SandboxSpec
from palaestra.sandbox.forkserver import PythonRunner
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Action, Observation, ToolSpec, Verdict
from palaestra.sdk.task import Task


class ToolArgs(BaseModel):
    """Base for tool argument models: unknown arguments are a malformed action."""

    model_config = ConfigDict(extra="forbid")


class NoArgs(ToolArgs):
    pass


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[ToolArgs] = NoArgs

    def spec(self) -> ToolSpec:
        return _tool_spec(self.name, self.description, self.args)


@functools.cache
def _tool_spec(name: str, description: str, args: type[ToolArgs]) -> ToolSpec:
    """Built once per tool: JSON Schema generation costs more than a whole no-op step."""
    schema = args.model_json_schema()
    schema.pop("title", None)
    return ToolSpec(name=name, description=description, parameters=schema)


@dataclass
class StepOutcome:
    observation: Observation
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]


@dataclass
class EpisodeContext:
    """Everything a family sees of one episode."""

    episode_id: str
    task: Task
    seed: int | None
    options: dict[str, Any]
    sandbox: Sandbox | None
    new_sandbox: SandboxFactory
    state: dict[str, Any] = field(default_factory=dict)
    # One-shot fresh Python sandboxes (`PythonForkServer.run`), when the server has them.
    run_python: PythonRunner | None = None


class Family(abc.ABC):
    """A kind of environment. Subclasses set `name`, `description`, `version` and `tools`."""

    name: ClassVar[str]
    description: ClassVar[str]
    version: ClassVar[str] = "0.1.0"
    tools: ClassVar[tuple[Tool, ...]]

    def tool_specs(self) -> list[ToolSpec]:
        return [tool.spec() for tool in self.tools]

    def parse_action(self, action: Action) -> tuple[Tool, ToolArgs]:
        """Validate an action against the tool list; raises InvalidActionError (422)."""
        for tool in self.tools:
            if tool.name == action.tool:
                try:
                    return tool, tool.args.model_validate(action.arguments)
                except ValidationError as exc:
                    problems = "; ".join(
                        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                        for e in exc.errors()
                    )
                    raise InvalidActionError(
                        f"bad arguments for tool {action.tool!r}: {problems}"
                    ) from None
        names = ", ".join(t.name for t in self.tools)
        raise InvalidActionError(f"unknown tool {action.tool!r}; this family's tools are: {names}")

    def sandbox_spec(self, task: Task) -> SandboxSpec | None:
        """The sandbox an episode of `task` needs, or None if it runs no code."""
        return None

    @abc.abstractmethod
    async def reset(self, ctx: EpisodeContext) -> Observation: ...

    @abc.abstractmethod
    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome: ...

    @abc.abstractmethod
    async def verify(self, ctx: EpisodeContext) -> Verdict:
        """Turn the final state into a Verdict; raise SandboxError on infrastructure faults."""

    @abc.abstractmethod
    def oracle(self, task: Task) -> list[Action]:
        """The reference solution as actions, built from private fields (never sent to clients)."""

    def null(self, task: Task) -> list[Action]:
        """A do-nothing attempt; it must score 0."""
        return [Action(tool="submit", arguments={})]

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        """Known ways to game this family's verifier, as named action lists.

        `palaestra pack check` plays each one on every task and fails the pack if any
        scores above the pack's `checks.cheat_max_reward` (default 0.1)."""
        return []
