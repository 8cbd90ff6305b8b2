"""The family author's surface (issue 33, item 4): one import, typed per-episode state, tools
declared with their handlers and dispatched by `Family.step`, task fields validated once."""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import weakref
from typing import Any

import pytest
from pydantic import Field

import palaestra.envs as envs
from palaestra.envs import (
    Action,
    Assessment,
    EpisodeContext,
    Family,
    InvalidActionError,
    NoArgs,
    Observation,
    PrivateFields,
    PublicFields,
    Sandboxes,
    State,
    StepOutcome,
    Task,
    Tool,
    ToolArgs,
    tool,
)
from palaestra.envs import base as contract
from palaestra.envs.echo import EchoArgs, EchoFamily, EchoPublic, EchoState, SubmitArgs


def test_one_import_holds_the_contract() -> None:
    assert set(contract.__all__) <= set(envs.__all__)
    for name in envs.__all__:
        assert getattr(envs, name) is not None, name
    with pytest.raises(AttributeError):
        _ = envs.NoSuchName  # type: ignore[attr-defined]


def test_a_family_import_stays_light() -> None:
    """No sandbox backend, server module or judge verifier (loaded on first use only)."""
    probe = "import sys, palaestra.envs.echo; print(*sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert not {m for m in loaded if m.startswith("palaestra.server")}
    assert "palaestra.verifiers.judge" not in loaded
    sandbox = {m for m in loaded if m.startswith("palaestra.sandbox")}
    assert sandbox <= {"palaestra.sandbox", "palaestra.sandbox.base", "palaestra.sandbox.forkrun"}


# -- a small family on the surface ---------------------------------------------------------------


class CountArgs(ToolArgs):
    by: int = Field(default=1, ge=1, le=10, description="how much to add")


class CountPublic(PublicFields):
    target: int


class CountPrivate(PrivateFields):
    pass


class CountState(State):
    total: int = 0
    notes: list[str] = Field(default_factory=list)


Ctx = EpisodeContext[CountState]


class CountFamily(Family[CountState]):
    name = "count"
    description = "Count up to a target."
    public_fields = CountPublic
    private_fields = CountPrivate

    async def reset(self, ctx: Ctx) -> Observation:
        ctx.state.notes.append("reset")
        return Observation(text=f"count to {CountPublic.of(ctx.task).target}")

    @tool("Add to the count.")
    async def add(self, ctx: Ctx, args: CountArgs) -> StepOutcome:
        ctx.state.total += args.by
        return StepOutcome(Observation(text=str(ctx.state.total)))

    @tool("Refuse to count.", name="refuse")
    async def _refuse(self, ctx: Ctx) -> StepOutcome:
        raise InvalidActionError("no", code="refused")

    @tool("End the episode.")
    async def submit(self, ctx: Ctx, args: NoArgs) -> StepOutcome:
        return StepOutcome(Observation(text="done"), done=True)

    async def verify(self, ctx: Ctx) -> Assessment:
        right = ctx.state.total == CountPublic.of(ctx.task).target
        return Assessment(reward=float(right), passed=right)

    def oracle(self, task: Task) -> list[Action]:
        return [Action(tool="add", arguments={"by": CountPublic.of(task).target})]


def _task(target: int = 3) -> Task:
    return Task("t", "count", "count/x", "train", "acme/count", "1.0.0", {"target": target}, {})


def _ctx(task: Task) -> EpisodeContext[Any]:
    async def no_sandbox(spec: Any) -> Any:
        raise AssertionError("no sandbox")

    return EpisodeContext("e", task, None, {}, Sandboxes(no_sandbox))


async def _play(family: Family[Any], ctx: EpisodeContext[Any], actions: list[Action]) -> None:
    for action in actions:
        tool_, args = family.parse_action(action)
        await family.step(ctx, tool_, args)


async def test_tools_come_from_their_handlers() -> None:
    family = CountFamily()
    assert [t.name for t in family.tools] == ["add", "refuse", "submit"]
    specs = {s.name: s for s in family.tool_specs()}
    assert specs["add"] == Tool("add", "Add to the count.", CountArgs).spec()
    assert specs["refuse"].parameters == Tool("refuse", "x", NoArgs).spec().parameters
    ctx = _ctx(_task())
    assert isinstance(ctx.state, dict)  # made before reset, not before
    await family.reset(ctx)
    assert isinstance(ctx.state, CountState) and ctx.state.notes == ["reset"]
    await _play(family, ctx, [Action(tool="add", arguments={"by": 2}), Action(tool="add")])
    assert ctx.state.total == 3
    with pytest.raises(InvalidActionError) as refused:
        await _play(family, ctx, [Action(tool="refuse")])
    assert refused.value.code == "refused"
    assert (await family.verify(ctx)).passed


def test_malformed_actions_are_refused_as_before() -> None:
    family = CountFamily()
    with pytest.raises(InvalidActionError, match=r"unknown tool 'nope'; .*: add, refuse, submit"):
        family.parse_action(Action(tool="nope"))
    with pytest.raises(InvalidActionError, match=r"bad arguments for tool 'add': by: "):
        family.parse_action(Action(tool="add", arguments={"by": 0}))
    with pytest.raises(InvalidActionError, match=r"bad arguments for tool 'submit': extra: "):
        family.parse_action(Action(tool="submit", arguments={"extra": 1}))


async def test_a_subclass_overrides_a_handler_and_wraps_step() -> None:
    seen: list[str] = []

    class Doubling(CountFamily):
        async def add(self, ctx: Ctx, args: CountArgs) -> StepOutcome:  # still the tool
            return await super().add(ctx, CountArgs(by=args.by * 2))

        async def step(self, ctx: Ctx, tool: Tool, args: ToolArgs) -> StepOutcome:
            seen.append(tool.name)
            return await super().step(ctx, tool, args)

    family = Doubling()
    assert [t.name for t in family.tools] == ["add", "refuse", "submit"]
    ctx = _ctx(_task())
    await family.reset(ctx)
    await _play(family, ctx, [Action(tool="add", arguments={"by": 2})])
    assert ctx.state.total == 4 and seen == ["add"]


def test_declarations_that_cannot_work_are_refused_at_once() -> None:
    with pytest.raises(TypeError, match="not both"):

        class Both(CountFamily):
            tools = (Tool("x", "x"),)

            @tool("y")
            async def y(self, ctx: Ctx) -> StepOutcome:
                raise AssertionError

    with pytest.raises(TypeError, match="no @tool method for x"):

        class Unhandled(CountFamily):
            tools = (Tool("x", "x"),)

    with pytest.raises(TypeError, match="annotate args"):

        class Unannotated(CountFamily):
            @tool("z")
            async def z(self, ctx: Ctx, args: int) -> StepOutcome:
                raise AssertionError


async def test_state_is_read_by_attribute_only() -> None:
    """A `State` is no dict: its fields are attributes, and a name that is none is an error."""
    family = EchoFamily()
    task = Task("t", "echo", "echo", "train", "acme/e", "1", {"instruction": "x"}, {"answer": "a"})
    ctx = _ctx(task)
    await family.reset(ctx)
    state = ctx.state
    assert isinstance(state, EchoState) and state.answer is None
    await _play(family, ctx, [Action(tool="submit", arguments={"answer": "a"})])
    assert state.answer == "a" and (await family.verify(ctx)).passed
    with pytest.raises(TypeError):
        state["answer"]  # type: ignore[index]
    assert not hasattr(state, "get") and not hasattr(state, "pop")
    with pytest.raises(ValueError, match="no field"):
        state.answr = "typo"  # type: ignore[attr-defined]


async def test_a_composed_familys_state_extends_the_composed_one() -> None:
    """A family that runs another's reset on its own context keeps its own (extended) state."""

    class MoreState(CountState):
        extra: str = ""

    class Composed(Family[MoreState]):
        name = "composed"
        description = "count, composed"
        public_fields = CountPublic
        private_fields = CountPrivate

        def __init__(self) -> None:
            self.inner = CountFamily()

        async def reset(self, ctx: EpisodeContext[MoreState]) -> Observation:
            ctx.state.extra = "mine"
            return await self.inner.reset(ctx)  # type: ignore[arg-type]

        @tool("End.")
        async def submit(self, ctx: EpisodeContext[MoreState]) -> StepOutcome:
            return StepOutcome(Observation(text="done"), done=True)

        async def verify(self, ctx: EpisodeContext[MoreState]) -> Assessment:
            return Assessment(reward=0.0, passed=False)

        def oracle(self, task: Task) -> list[Action]:
            return []

    ctx = _ctx(_task())
    await Composed().reset(ctx)
    assert isinstance(ctx.state, MoreState)
    assert ctx.state.extra == "mine" and ctx.state.notes == ["reset"]


def test_the_state_model_is_inherited_unless_a_class_names_its_own() -> None:
    class Bigger(CountState):
        more: int = 0

    class Named(CountFamily):
        state_model = Bigger

    class Below(Named):
        pass

    assert CountFamily.state_model is CountState and Below.state_model is Bigger
    assert EchoFamily.state_model is EchoState and Family.state_model is None


def test_task_fields_are_validated_once_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    validate = EchoPublic.model_validate.__func__  # type: ignore[attr-defined]

    def counting(cls: type[EchoPublic], value: Any, **kw: Any) -> EchoPublic:
        calls.append(value)
        return validate(cls, value, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(EchoPublic, "model_validate", classmethod(counting))
    task = Task("t", "echo", "echo", "train", "acme/e", "1", {"delay_ms": 5}, {"answer": "a"})
    EchoFamily().validate_task(task)  # what the pack loader does
    views = {id(EchoPublic.of(task)) for _ in range(5)}
    assert len(calls) == 1 and len(views) == 1 and EchoPublic.of(task).delay_ms == 5
    other = Task("u", "echo", "echo", "train", "acme/e", "1", {"delay_ms": 7}, {"answer": "a"})
    assert EchoPublic.of(other).delay_ms == 7 and len(calls) == 2
    # The views are kept with the task (not in any table of the module's): they go with it,
    # and they are not part of its content.
    assert EchoPublic in task.views and task == dataclasses.replace(task)
    held = weakref.ref(task.views[EchoPublic])
    del task, views
    gc.collect()
    assert held() is None


async def test_echo_is_declared_as_before() -> None:
    specs = EchoFamily().tool_specs()
    assert specs == [
        Tool("echo", "Return the given text unchanged.", EchoArgs).spec(),
        Tool("submit", "End the episode with an answer.", SubmitArgs).spec(),
    ]
