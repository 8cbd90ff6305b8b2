"""What a family is: its tools, its task fields, its episode logic and its verifier (DESIGN §1).

This module is the whole contract a family is written against. A family never imports the
server: the episode manager validates each task against the family's field models when a
pack loads, hands the family an `EpisodeContext` per episode, and calls the hooks of
`Family` below (each says when it is called and what it may do). Tool arguments are
pydantic models, so their JSON Schema is what trainers see and a malformed action is
refused with a 422. Sandboxes come from `ctx.sandboxes` only; the manager frees them.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from palaestra.envs.cheatlib import CheatSurface
from palaestra.sandbox import ExecResult, Sandbox, SandboxSpec, SandboxSpecError
from palaestra.sandbox.forkrun import PYTHON, ForkServerUnavailable, PythonRun, PythonRunner
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Action, Limits, Observation, ToolSpec, VerifierInfo
from palaestra.sdk.task import Task
from palaestra.verifiers.judge_protocol import Judges, NoJudges

if TYPE_CHECKING:
    from palaestra.verifiers.judge import JudgedSubject

# -- tools -----------------------------------------------------------------------------------


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


# -- task fields -----------------------------------------------------------------------------


class TaskFieldsError(ValueError):
    """A task whose public or private fields do not fit its family's model."""

    def __init__(self, task: Task, problem: str) -> None:
        super().__init__(f"task {task.id} (family {task.family}): {problem}")
        self.problem = problem  # 'field: what is wrong', without the task


class TaskFields(BaseModel):
    """Base of a family's task field models. Fields a model does not name are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)

    @classmethod
    def side(cls) -> str:
        """ "public" or "private": which of a task's field sets this model reads."""
        raise NotImplementedError

    @classmethod
    def of(cls, task: Task) -> Self:
        """The task's fields as this model (the pack loader checked that they fit)."""
        return cls.model_validate(task.public if cls.side() == "public" else task.private)

    @classmethod
    def check(cls, task: Task) -> None:
        """Raise TaskFieldsError where the task's fields do not fit this model."""
        try:
            cls.of(task)
        except ValidationError as exc:
            problems = "; ".join(
                f"{cls.side()}.{'.'.join(str(p) for p in e['loc']) or '<fields>'}: {e['msg']}"
                for e in exc.errors()
            )
            raise TaskFieldsError(task, problems) from None


class PublicFields(TaskFields):
    """What the agent may see of a task (sent to clients)."""

    @classmethod
    def side(cls) -> str:
        return "public"


class PrivateFields(TaskFields):
    """What only the family's oracle and verifier see (never sent to clients)."""

    @classmethod
    def side(cls) -> str:
        return "private"


# -- steps and verdicts ----------------------------------------------------------------------


@dataclass
class StepOutcome:
    """What one step did. The manager counts `tool_ok`, `timed_out` and `output_bytes` in the
    episode's metrics; `info` is the family's own extras, passed to the client unread."""

    observation: Observation
    done: bool = False
    tool_ok: bool = True  # did the call do what was asked (a command: exit 0, no timeout)
    timed_out: bool = False
    output_bytes: int | None = None  # None: the size of the observation's text
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Assessment:
    """What a verifier decides. The manager adds what every verdict shares (the task digest,
    the duration, the family's `verifier_info()`) and makes the wire `Verdict`."""

    reward: float
    passed: bool
    components: dict[str, float] = field(default_factory=dict)
    feedback: str = ""
    failure: str | None = None  # on a failed attempt, its class (sdk.models.FAILURE_CLASSES)


# -- sandboxes -------------------------------------------------------------------------------

SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]


class Sandboxes:
    """The one way a family gets sandboxes: the episode's own, verifier sandboxes and one-shot
    Python runs. It records every sandbox it creates and the manager frees them all when the
    episode ends (done, void, closed, expired); a family never creates or frees one itself.

    Image choice: a spec with `image=None` runs on the family's `image` where the backend has
    it and on the backend's default where it refuses that image as unknown (bwrap without the
    family's rootfs); `images` remembers the answer across episodes. A spec naming an image
    gets exactly that image."""

    def __init__(
        self,
        create: SandboxFactory,
        *,
        image: str | None = None,
        images: dict[str, bool] | None = None,
        fork_server: PythonRunner | None = None,
    ) -> None:
        self._create = create
        self._image = image
        self._images = images if images is not None else {}
        self._fork_server = fork_server
        self._episode: Sandbox | None = None
        self._spec: SandboxSpec | None = None
        self._made: list[Sandbox] = []

    @property
    def episode(self) -> Sandbox | None:
        """The episode's own sandbox (from `Family.sandbox_spec`); None when the family asks
        for none, and once the episode has ended."""
        return self._episode

    async def start(self, spec: SandboxSpec | None) -> None:
        """The manager's: create the episode's sandbox before `Family.reset`."""
        if spec is not None:
            self._episode = await self._new(spec)
            self._spec = self._episode.spec

    async def verifier(
        self, spec: SandboxSpec | None = None, *, traces_execs: bool = False
    ) -> Sandbox:
        """A fresh sandbox for the verifier (default: the episode sandbox's spec, image
        included); it lives until the episode ends. `traces_execs`: its processes may trace
        their children (`SandboxSpec.traces_execs`, the terminal verifier's exec guard)."""
        if spec is None:
            if self._spec is None:
                raise ValueError("this episode has no sandbox whose spec a verifier could copy")
            spec = self._spec
        if traces_execs:
            spec = dataclasses.replace(spec, traces_execs=True)
        return await self._new(spec)

    async def run_python(self, job: PythonRun) -> ExecResult:
        """Run `job` (`python3 -I -S -c code`) in a one-shot sandbox whose /work holds its
        files alone: a fork of the server's Python fork server where it has one, else a fresh
        sandbox, freed as soon as the run is over. Timeouts and exit codes are data."""
        if self._fork_server is not None:
            try:
                return await self._fork_server(job)
            except ForkServerUnavailable:
                pass  # logged once by the fork server; a fresh sandbox does it
        box = await self._new(SandboxSpec(memory_mb=job.memory_mb, workspace_mb=job.workspace_mb))
        try:
            for path, data in job.files.items():
                await box.write_file(path, data)
            return await box.exec(
                [PYTHON, "-I", "-S", "-c", job.code],
                stdin=job.stdin,
                timeout=job.timeout,
                max_output=job.max_output,
            )
        finally:
            if box in self._made:  # else the episode ended meanwhile: aclose() has it
                self._made.remove(box)
            await box.close()

    async def retire_episode(self) -> None:
        """Free the episode's sandbox now, before the episode ends (a verifier that wants
        every process the agent started dead before its tests run); its spec stays what
        `verifier()` copies."""
        box, self._episode = self._episode, None
        if box is not None:
            self._made.remove(box)
            await box.close()

    def episode_cpu_seconds(self) -> float | None:
        """The manager's: CPU time the episode's sandbox used so far (None: no counter)."""
        return self._episode.cpu_seconds() if self._episode is not None else None

    async def aclose(self) -> list[BaseException]:
        """The manager's: free every sandbox this episode has; returns what failed."""
        made, self._made, self._episode = self._made, [], None
        failed: list[BaseException] = []
        for box in made:
            try:
                await box.close()
            except Exception as exc:
                failed.append(exc)
        return failed

    async def _new(self, spec: SandboxSpec) -> Sandbox:
        box = await self._on_image(spec)
        self._made.append(box)
        return box

    async def _on_image(self, spec: SandboxSpec) -> Sandbox:
        image = self._image
        if spec.image is not None or image is None or self._images.get(image) is False:
            return await self._create(spec)
        try:
            box = await self._create(dataclasses.replace(spec, image=image))
        except SandboxSpecError:
            box = await self._create(spec)  # raises where the spec itself is at fault
            self._images[image] = False
            return box
        self._images[image] = True
        return box


# -- episodes --------------------------------------------------------------------------------


@dataclass
class EpisodeContext:
    """Everything a family sees of one episode; `state` is the family's scratch space."""

    episode_id: str
    task: Task
    seed: int | None
    options: dict[str, Any]
    sandboxes: Sandboxes
    state: dict[str, Any] = field(default_factory=dict)
    # The server's judge endpoints (verifiers/judge_protocol.py); a judge verifier's only way
    # to reach a judge model.
    judges: Judges = field(default_factory=NoJudges)


class Family(abc.ABC):
    """A kind of environment.

    Subclasses set `name`, `description`, `version`, `tools` and the task field models
    `public_fields` and `private_fields`, and implement `reset`, `step`, `verify` and
    `oracle`. Every other hook has a default that does nothing special."""

    name: ClassVar[str]
    description: ClassVar[str]
    version: ClassVar[str] = "0.1.0"
    tools: ClassVar[tuple[Tool, ...]]
    public_fields: ClassVar[type[PublicFields]]
    private_fields: ClassVar[type[PrivateFields]]
    # The family's own image: what a sandbox spec with `image=None` runs on where the
    # backend has it (see `Sandboxes`).
    image: ClassVar[str | None] = None

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

    def validate_task(self, task: Task) -> None:
        """Called by the pack loader on every task of this family: raises TaskFieldsError
        (naming the task and the field) where the fields do not fit the models, and the
        pack is refused. Override to add checks across fields; call super() first."""
        self.public_fields.check(task)
        self.private_fields.check(task)

    def sandbox_spec(self, task: Task) -> SandboxSpec | None:
        """Called at reset, before `reset`: the episode's own sandbox (`ctx.sandboxes.episode`),
        or None if an episode of `task` runs no code. Must not touch the network or disk."""
        return None

    def node_labels(self, task: Task) -> frozenset[str]:
        """Called by a cluster front (server/cluster/): the node labels a worker hosting an
        episode of `task` must have (e.g. `bpy` for Blender), beyond the sandbox backend's."""
        return frozenset()

    def episode_limits(self, task: Task, options: dict[str, Any], limits: Limits) -> Limits:
        """Called at reset with the limits the server grants (from the client's options
        within the operator's ceilings): the episode's limits, e.g. with this family's own
        per-step caps added. Sent to the client with the reset reply."""
        return limits

    def verifier_info(self) -> VerifierInfo:
        """The verifier named in every verdict of this family (default: the family itself)."""
        return VerifierInfo(name=self.name, version=self.version)

    @abc.abstractmethod
    async def reset(self, ctx: EpisodeContext) -> Observation:
        """Called once per episode after its sandbox exists: set up `ctx.state` (and the
        sandbox), return the first observation. SandboxError here refuses the reset (503)."""

    @abc.abstractmethod
    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        """Called for each action, one at a time per episode, with arguments already
        validated. Raise InvalidActionError for an action the family refuses (422, the
        episode goes on); SandboxError ends the episode void. `done=True` ends it verified."""

    @abc.abstractmethod
    async def verify(self, ctx: EpisodeContext) -> Assessment:
        """Called once, when the episode ends by `done`, a limit or the client's verify:
        judge the final state. AgentFault is a 0 with its failure class; SandboxError or
        any other exception makes the episode void (never a 0)."""

    @abc.abstractmethod
    def oracle(self, task: Task) -> list[Action]:
        """The reference solution as actions, built from private fields (never sent to clients)."""

    def judges(self) -> frozenset[str]:
        """The judge endpoints (`ctx.judges.get(name)`) this family's verifier calls. While
        the server has one of them unconfigured the sampler never draws its tasks (they
        could only end void); an explicit `task=` reset still runs them."""
        return frozenset()

    def judged_subject(self, ctx: EpisodeContext) -> JudgedSubject | None:
        """Called on an ended (verified, not void) episode by `POST /v1/groups/verify`: the
        rubric, judge config and subject (task, reference, the episode's final answer) a
        group scorer compares across the episodes of one task. None (the default): this
        family's episodes cannot be judged as a group (422). Must not touch a sandbox (they
        are freed when the episode ends) nor block: read what `step` kept in `ctx.state`."""
        return None

    def null(self, task: Task) -> list[Action]:
        """A do-nothing attempt; it must score 0."""
        return [Action(tool="submit", arguments={})]

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        """Known ways to game this family's verifier, as named action lists.

        `palaestra pack check` plays each one on every task and fails the pack if any
        scores above the pack's `checks.cheat_max_reward` (default 0.1)."""
        return []

    def cheat_surface(self, task: Task) -> CheatSurface:
        """How the generic cheat library (envs/cheatlib.py) may play `task`: this family's
        shell, file-writing and answer tools, the right answer and the label set. Default:
        read off `tools` (a tool taking `command`; one taking `path` and `content`; `submit`
        taking `answer`) and the oracle's last `submit` answer. Override to name a label
        set, another answer tool or the workdir."""
        try:
            oracle = self.oracle(task)
        except Exception:  # pack check reports the oracle's own failure
            oracle = []
        return CheatSurface.of_tools(self.tools, oracle)
