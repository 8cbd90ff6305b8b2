"""What a family is: its tools, its task fields, its episode logic and its verifier (DESIGN §1).

This module is the whole contract a family is written against; `palaestra.envs` re-exports
it with the wire models, errors and sandbox types a family names (one import). A family
never imports the server: the episode manager validates each task against the family's
field models when a pack loads (the typed view is kept: `Model.of(task)` is a lookup
afterwards), hands the family an `EpisodeContext` per episode (its `state` an instance of
the family's `State` model), and calls the hooks of `Family` below (each says when it is
called and what it may do). Tools are methods marked `@tool`: their argument models give
the JSON Schema trainers see, a malformed action is refused with a 422, and `Family.step`
calls the tool's method. Sandboxes come from `ctx.sandboxes` only; the manager frees them.
"""

from __future__ import annotations

import abc
import copy
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypeVar

from palaestra.envs.cheatlib import CheatSurface
from palaestra.envs.paths import workspace_abspath, workspace_relpath
from palaestra.envs.sandboxes import Sandboxes
from palaestra.sandbox import (
    DEFAULT_MAX_OUTPUT,
    AgentFault,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    SandboxSpecError,
    ShellSession,
    WorkspaceFault,
)
from palaestra.sandbox.base import BASE_PATH, default_cache
from palaestra.sandbox.forkrun import PYTHON, PythonRun
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Action, Limits, Observation, ToolSpec, Verdict, VerifierInfo
from palaestra.sdk.task import Task
from palaestra.verifiers.judge_protocol import (
    JudgeChat,
    Judges,
    JudgeSampling,
    JudgeUnavailable,
    NoJudges,
)

if TYPE_CHECKING:
    from palaestra.verifiers.judge import JudgedSubject

# The family author's surface (re-exported by `palaestra.envs`): this module's contract and
# the wire models, errors, sandbox types and judge endpoints a family names.
__all__ = [
    "BASE_PATH",
    "DEFAULT_MAX_OUTPUT",
    "PYTHON",
    "Action",
    "AgentFault",
    "Assessment",
    "CheatSurface",
    "EpisodeContext",
    "ExecResult",
    "Family",
    "FamilySettings",
    "InvalidActionError",
    "JudgeChat",
    "JudgeSampling",
    "JudgeUnavailable",
    "Judges",
    "Limits",
    "NoArgs",
    "Observation",
    "PrivateFields",
    "PublicFields",
    "PythonRun",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "SandboxPathError",
    "SandboxSpec",
    "SandboxSpecError",
    "Sandboxes",
    "ServerPaths",
    "ShellSession",
    "State",
    "StepOutcome",
    "Task",
    "TaskFields",
    "TaskFieldsError",
    "Tool",
    "ToolArgs",
    "ToolSpec",
    "Verdict",
    "VerifierInfo",
    "WorkspaceFault",
    "tool",
    "workspace_abspath",
    "workspace_relpath",
]

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


Handler = TypeVar("Handler", bound=Callable[..., Awaitable["StepOutcome"]])


@dataclass(frozen=True)
class _Declared:
    tool: Tool
    method: str  # the handler's attribute name on the family
    takes_args: bool  # (self, ctx, args) rather than (self, ctx)


_TOOL_MARK = "__palaestra_tool__"  # on a @tool method: (its Tool, whether it takes args)


def tool(
    description: str, *, name: str | None = None, args: type[ToolArgs] | None = None
) -> Callable[[Handler], Handler]:
    """Declare a family method as a tool: `async def name(self, ctx, args: ArgsModel) ->
    StepOutcome` (or `(self, ctx)` for a tool without arguments). The tool is named after
    the method unless `name` says otherwise; its arguments model is `args`, else the
    annotation of the method's `args` parameter, else `NoArgs`. `Family.step` calls the
    method with the arguments already validated against that model; the family's `tools`
    (and so its `tool_specs()`) list the declared tools in the order the class body has
    them, a base class's first."""

    def declare(handler: Handler) -> Handler:
        params = list(inspect.signature(handler).parameters.values())
        if len(params) not in (2, 3):
            raise TypeError(f"tool {handler.__qualname__}: takes (self, ctx) or (self, ctx, args)")
        model = args or (_annotated(handler, params[2]) if len(params) == 3 else NoArgs)
        declared = (Tool(name or handler.__name__, description, model), len(params) == 3)
        setattr(handler, _TOOL_MARK, declared)
        return handler

    return declare


def _annotated(handler: Callable[..., Any], param: inspect.Parameter) -> type[ToolArgs]:
    """The ToolArgs model `param` is annotated with (a string under postponed annotations,
    read in the handler's module)."""
    hint = param.annotation
    if isinstance(hint, str):
        try:
            hint = eval(hint, getattr(handler, "__globals__", {}))
        except Exception:
            hint = None
    if not (isinstance(hint, type) and issubclass(hint, ToolArgs)):
        raise TypeError(
            f"tool {handler.__qualname__}: annotate {param.name} with a ToolArgs model "
            "defined before the family, or pass @tool(..., args=Model)"
        )
    return hint


def _declared_tools(cls: type) -> dict[str, _Declared]:
    """The @tool methods of `cls` and its bases, by tool name, in declaration order."""
    found: dict[str, _Declared] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            mark: tuple[Tool, bool] | None = getattr(value, _TOOL_MARK, None)
            if inspect.isfunction(value) and mark is not None:
                found[mark[0].name] = _Declared(mark[0], attr, mark[1])
    return found


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
        """The task's fields as this model: validated once per task object (the pack loader's
        check does it), then kept with the task while it lives. Treat it as read-only."""
        view = task.views.get(cls)
        if view is None:
            view = task.views[cls] = cls.model_validate(
                task.public if cls.side() == "public" else task.private
            )
        return view

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


# Validated field views by task object: id(task) -> {model: view}. An entry goes when its
# task is collected (a task's fields never change: its digest covers them).
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


# -- settings --------------------------------------------------------------------------------


class FamilySettings(BaseModel):
    """Base of a family's own settings (`Family.settings_model`): what an operator may set
    for this family alone. Declare fields with defaults; the server builds one from the
    family's slice of its settings (`[families.<name>]` in palaestra.toml, or
    `PALAESTRA_FAMILY_<NAME>__<FIELD>`) and refuses to start on a value that does not fit,
    naming the family and the field. A field the operator did not set keeps its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class ServerPaths:
    """The server-wide folders a family is handed when it is made (from the server's own
    settings, never a family's): where it may cache files, and the sandbox toolchains."""

    cache: Path = field(default_factory=default_cache)  # the server's `cache` setting
    toolchains: Path | None = None  # the `toolchains_dir` setting; None: not set

    def cache_for(self, name: str) -> Path:
        """A family's own cache folder, `<cache>/<name>` (made by whoever writes into it)."""
        return self.cache / name


# -- episodes --------------------------------------------------------------------------------


class State(BaseModel):
    """Base of a family's per-episode state: what its tools keep between steps and its
    verifier reads. Declare fields with defaults (a fresh instance is made before `reset`);
    values may be any Python object (a shell session, a parsed document). It never leaves
    the server: nothing of it is sent to clients. Read and written by attribute only: a
    name that is no field is an error, as a typo should be."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


# A family's State model: `Family[MyState]` makes `ctx.state` a `MyState`. A family that
# declares none gets a dict (`ctx.state["key"]`), as before typed state existed.
S = TypeVar("S", bound=BaseModel, default=Any)


def _no_state() -> Any:
    return {}


@dataclass
class EpisodeContext(Generic[S]):
    """Everything a family sees of one episode. `state` is the family's own: an instance of
    its `State` model (made before `reset`), or a dict where it declares none."""

    episode_id: str
    task: Task
    seed: int | None
    options: dict[str, Any]
    sandboxes: Sandboxes
    state: S = field(default_factory=_no_state)
    # The server's judge endpoints (verifiers/judge_protocol.py); a judge verifier's only way
    # to reach a judge model.
    judges: Judges = field(default_factory=NoJudges)


def _with_state(reset: Callable[[Any, EpisodeContext], Awaitable[Observation]]) -> Any:
    """`reset`, run after `ctx.state` is made an instance of the family's State model
    (kept where it already is one: a family's reset that calls its base's, or a composed
    family's with a State that extends the composed one's)."""

    @functools.wraps(reset)
    async def reset_with_state(self: Family, ctx: EpisodeContext) -> Observation:
        model = type(self).state_model
        if model is not None and not isinstance(ctx.state, model):
            ctx.state = model()
        return await reset(self, ctx)

    setattr(reset_with_state, _MAKES_STATE, True)
    return reset_with_state


_MAKES_STATE = "__palaestra_makes_state__"


class Family(abc.ABC, Generic[S]):
    """A kind of environment.

    Subclasses set `name`, `description`, `version` and the task field models
    `public_fields` and `private_fields`, declare their tools as `@tool` methods, and
    implement `reset`, `verify` and `oracle`. `class MyFamily(Family[MyState])` gives each
    episode a fresh `MyState()` as `ctx.state` before `reset` runs (`state_model`); a
    family with settings of its own declares `settings_model` (a `FamilySettings`) and reads
    `self.settings`. Every other hook has a default that does nothing special.

    (Families written before `@tool` list `tools` as `Tool`s and override `step`; both
    still work, but not mixed in one class.)"""

    name: ClassVar[str]
    description: ClassVar[str]
    version: ClassVar[str] = "0.1.0"
    tools: ClassVar[tuple[Tool, ...]]  # from the @tool methods where the family has them
    public_fields: ClassVar[type[PublicFields]]
    private_fields: ClassVar[type[PrivateFields]]
    # The per-episode state model: from `Family[Model]` unless set; None: a dict.
    state_model: ClassVar[type[BaseModel] | None] = None
    # The family's own settings: an instance of `settings_model` (default: none to set),
    # built by the server from the family's slice of its settings, and the server's folders.
    settings_model: ClassVar[type[FamilySettings]] = FamilySettings
    settings: FamilySettings
    server: ServerPaths
    # The family's own image: what a sandbox spec with `image=None` runs on where the
    # backend has it (see `Sandboxes`).
    image: ClassVar[str | None] = None
    _handlers: ClassVar[dict[str, _Declared]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "state_model" not in vars(cls):
            for base in vars(cls).get("__orig_bases__", ()):  # its own `Family[Model]`
                (arg, *_) = getattr(base, "__args__", (None,))
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    cls.state_model = arg
        reset = vars(cls).get("reset")
        if inspect.isfunction(reset) and not getattr(reset, _MAKES_STATE, False):
            setattr(cls, "reset", _with_state(reset))  # noqa: B010 (mypy: a method)
        declared = cls._handlers = _declared_tools(cls)
        if "tools" in vars(cls):  # listed: the class's own list wins over its bases' tools
            if any(inspect.isfunction(v) and hasattr(v, _TOOL_MARK) for v in vars(cls).values()):
                raise TypeError(f"{cls.__name__}: list `tools` or declare @tool methods, not both")
        elif declared:
            cls.tools = tuple(d.tool for d in declared.values())
        if cls.step is Family.step and hasattr(cls, "tools"):
            missing = [t.name for t in cls.tools if t.name not in declared]
            if missing:
                raise TypeError(f"{cls.__name__}: no @tool method for {', '.join(missing)}")

    def __init__(
        self, settings: FamilySettings | None = None, server: ServerPaths | None = None
    ) -> None:
        """Made by the server once, with `settings` (an instance of `settings_model`, from
        the family's slice of the server's settings) and `server` (its folders); made with
        neither (a test, pack check), the model's defaults and the default folders. A family
        that defines `__init__` takes both and passes them to `super().__init__`."""
        model = type(self).settings_model
        if settings is None:
            settings = model()
        elif not isinstance(settings, model):
            raise TypeError(
                f"{type(self).__name__} takes its settings as a {model.__name__}, "
                f"not a {type(settings).__name__}"
            )
        self.settings = settings
        self.server = server if server is not None else ServerPaths()

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
    async def reset(self, ctx: EpisodeContext[S]) -> Observation:
        """Called once per episode after its sandbox exists, with `ctx.state` a fresh
        instance of `state_model`: set up the state (and the sandbox), return the first
        observation. SandboxError here refuses the reset (503)."""

    async def step(self, ctx: EpisodeContext[S], tool: Tool, args: ToolArgs) -> StepOutcome:
        """Called for each action, one at a time per episode, with arguments already
        validated: calls the tool's @tool method. The method raises InvalidActionError for
        an action the family refuses (422, the episode goes on); SandboxError ends the
        episode void; `done=True` ends it verified. Override to wrap every tool (call
        super().step for the tool's own work)."""
        declared = self._handlers.get(tool.name)
        if declared is None:
            raise NotImplementedError(f"{type(self).__name__} has no handler for {tool.name!r}")
        handler = getattr(self, declared.method)
        outcome: StepOutcome = await (handler(ctx, args) if declared.takes_args else handler(ctx))
        return outcome

    def fork_state(self, state: S) -> S:
        """Called when an episode is forked (`POST /v1/episodes/{id}/fork`), under its lock,
        with no step running: the fork's own state, which must share nothing mutable with
        `state` (the parent goes on unchanged). The default is a deep copy. Override where
        the state holds what cannot be copied (a live shell session: start the fork without
        one) or what is read-only and large (share it)."""
        return copy.deepcopy(state)

    def checkpoint_state(self, state: S) -> Any:
        """Called when an episode is checkpointed (`POST /v1/episodes/{id}/checkpoint`),
        under its lock, with no step running: the state as JSON-able data, stored until a
        `resume` (maybe in another process) gives it to `restore_state`. The default dumps
        the State model (or the dict) as JSON. Override where the state holds what cannot
        outlive the process (a live shell session: leave it out; the resumed episode starts
        without one)."""
        if isinstance(state, BaseModel):
            return state.model_dump(mode="json")
        return json.loads(json.dumps(state))  # a dict state: JSON-able, or TypeError

    def restore_state(self, data: Any) -> S:
        """The state `checkpoint_state` stored, made live again for a resumed episode
        (its workspace already restored). The default validates it into `state_model`."""
        model = type(self).state_model
        if model is None:
            return cast(S, dict(data))
        return cast(S, model.model_validate(data))

    @abc.abstractmethod
    async def verify(self, ctx: EpisodeContext[S]) -> Assessment:
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

    def judged_subject(self, ctx: EpisodeContext[S]) -> JudgedSubject | None:
        """Called on an ended (verified, not void) episode by `POST /v1/groups/verify`: the
        rubric, judge config and subject (task, reference, the episode's final answer) a
        group scorer compares across the episodes of one task. None (the default): this
        family's episodes cannot be judged as a group (422). Must not touch a sandbox (they
        are freed when the episode ends) nor block: read what the tools kept in `ctx.state`."""
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
