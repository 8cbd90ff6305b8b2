"""The generic cheating-agent library that `palaestra pack check` plays on every task.

A family's own `cheats(task)` knows its verifier; this library knows the tricks that work
against any verifier with a given tool shape, and is played beside them on every task of
every pack (pack check, publish, `pack import`). Each class is a `GenericCheat`: it says
which tool shapes it applies to (`applies(surface)`) and what it plays on a task
(`plays(task, surface)`, named episodes). A family describes its shapes with
`Family.cheat_surface(task)` (by default read off its tools and its oracle):

- shell (a tool taking `{"command"}`): the command classes of `palaestra.envs.cheats`
  (startup files, pytest config, PATH shadowing, written results, background processes,
  symlinks, exit on import, module shadowing, added test packages and plugins, early exit,
  always-equal objects, reading the verifier, workspace exhaustion);
- file-writing (a tool taking `{"path", "content"}`, no shell): planted startup/pytest
  files, shadowing modules, a test package and a plugin entry point;
- answer (a tool that takes the final answer as text): non-finite numbers, a wrong label or
  number in other forms, every label at once, and null-information play (constants, empty
  text, the prompt sent back).

Every play must score at most the pack's `checks.cheat_max_reward`. A library class is added
with `register(MyCheat())` or an entry point in the group `palaestra.cheats` (docs/cheats.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Protocol

from pydantic import BaseModel

from palaestra.envs import answer_forms as forms
from palaestra.envs import cheats as scripts
from palaestra.sdk.models import Action, Observation
from palaestra.sdk.task import Task

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "palaestra.cheats"
# What a cheat plays: a fixed action list, or one built from the episode's first observation
# (for answers that echo the prompt).
Script = Sequence[Action] | Callable[[Observation], Sequence[Action]]
Play = tuple[str, Script]


class ToolShape(Protocol):
    """What the library reads off a family's tool (`palaestra.envs.base.Tool`)."""

    @property
    def name(self) -> str: ...

    @property
    def args(self) -> type[BaseModel]: ...


@dataclass(frozen=True)
class CheatSurface:
    """How a task's episodes can be played by a cheat: the tools it may use, how it ends,
    and what it knows of the answer's shape.

    `shell`/`files`: the names of a tool taking `{"command"}` / `{"path", "content"}`;
    `answer`: builds the action that submits a text as the final answer; `submit`: how a
    command or file cheat ends; `expected`: the right answer (so answer cheats never play
    it); `labels`: the task's label set (several labels at once is a cheat);
    `workdir`: the workspace's absolute path in the sandbox (arms planted files)."""

    shell: str | None = None
    files: str | None = None
    answer: Callable[[str], Action] | None = None
    submit: Action = field(default_factory=lambda: Action(tool="submit", arguments={}))
    expected: str | None = None
    labels: tuple[str, ...] = ()
    workdir: str = "/work"

    @classmethod
    def of_tools(cls, tools: Iterable[ToolShape], oracle: Sequence[Action] = ()) -> CheatSurface:
        """The shapes read off the tools: the first taking `command`; the first taking
        `path` and `content`; `submit` with a text `answer` (its expected value: the
        oracle's last such action)."""
        tools = list(tools)
        shell = next((t.name for t in tools if "command" in t.args.model_fields), None)
        files = next(
            (t.name for t in tools if {"path", "content"} <= t.args.model_fields.keys()), None
        )
        answer: Callable[[str], Action] | None = None
        expected = None
        if any(t.name == "submit" and "answer" in t.args.model_fields for t in tools):
            answer = _submit_answer
            given = [a.arguments["answer"] for a in oracle if a.tool == "submit"]
            expected = next((str(x) for x in reversed(given) if x is not None), None)
        return cls(shell=shell, files=files, answer=answer, expected=expected)


def _submit_answer(text: str) -> Action:
    return Action(tool="submit", arguments={"answer": text})


class GenericCheat:
    """One class of generic cheat. Subclasses set `name` and `summary` and override
    `applies` and `plays`; the defaults apply nowhere and play nothing."""

    name: str = ""
    summary: str = ""

    def applies(self, surface: CheatSurface) -> bool:
        """Whether this class can be played on a task with these tool shapes."""
        return False

    def plays(self, task: Task, surface: CheatSurface) -> list[Play]:
        """The episodes to play on `task`, each named `<class>` or `<class>/<variant>`."""
        return []

    def domain_limit(self, surface: CheatSurface) -> float | None:
        """None (the default): each play must score at most the pack's `cheat_max_reward` on
        every task. A number: the play's *mean* over a domain's tasks must stay at most it
        (a play that is sometimes the right answer, like a constant label)."""
        return None


# -- shell and file-writing classes ---------------------------------------------------------
class CommandCheat(GenericCheat):
    """One script of `palaestra.envs.cheats` run through the shell tool, then submit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.summary = scripts.summary(name)

    def applies(self, surface: CheatSurface) -> bool:
        return surface.shell is not None

    def plays(self, task: Task, surface: CheatSurface) -> list[Play]:
        assert surface.shell is not None
        [(name, actions)] = scripts.command_cheats(
            (self.name,), tool=surface.shell, submit=surface.submit
        )
        return [(name, actions)]


class FileCheat(GenericCheat):
    """Files written with a file tool, for a family without a shell, then submit."""

    def __init__(self, name: str, summary: str, files: Callable[..., dict[str, str]]) -> None:
        self.name, self.summary, self.files = name, summary, files

    def applies(self, surface: CheatSurface) -> bool:
        return surface.files is not None and surface.shell is None

    def plays(self, task: Task, surface: CheatSurface) -> list[Play]:
        assert surface.files is not None
        files = self.files(sandbox_workdir=surface.workdir)
        return [(self.name, scripts.write_actions(files, surface.files, surface.submit))]


# -- answer classes -------------------------------------------------------------------------
class AnswerCheat(GenericCheat):
    """Answers without the work, each submitted as the task's final answer."""

    def applies(self, surface: CheatSurface) -> bool:
        return surface.answer is not None

    def texts(self, surface: CheatSurface) -> list[tuple[str, str]]:
        return []

    def plays(self, task: Task, surface: CheatSurface) -> list[Play]:
        submit = surface.answer
        assert submit is not None
        return [(f"{self.name}/{variant}", [submit(text)]) for variant, text in self.texts(surface)]


class NonFinite(AnswerCheat):
    name = "non-finite"
    summary = "nan, inf, -inf, Infinity, 1e999 as the answer"

    def texts(self, surface: CheatSurface) -> list[tuple[str, str]]:
        return forms.non_finite()


class Reformatted(AnswerCheat):
    name = "reformatted"
    summary = "a wrong label or number in markup, punctuation, other case, other digits"

    def texts(self, surface: CheatSurface) -> list[tuple[str, str]]:
        return forms.reformatted(surface.expected, labels_of(surface))


class LabelCombination(AnswerCheat):
    name = "label-combination"
    summary = 'every label of the task at once ("True False", "A, B, C, D")'

    def applies(self, surface: CheatSurface) -> bool:
        return surface.answer is not None and len(labels_of(surface)) > 1

    def texts(self, surface: CheatSurface) -> list[tuple[str, str]]:
        return forms.combinations(labels_of(surface))


class NullInformation(AnswerCheat):
    name = "null-information"
    summary = "a constant, empty or blank text, the prompt (or its last line) sent back"

    def plays(self, task: Task, surface: CheatSurface) -> list[Play]:
        submit, expected = surface.answer, surface.expected
        assert submit is not None
        out = super().plays(task, surface)
        for variant in ("echo-prompt", "echo-last-line"):

            def echo(obs: Observation, variant: str = variant) -> list[Action]:
                texts = dict(forms.echoes(obs.text, expected))
                return [submit(texts.get(variant, texts.get("echo-prompt", "")))]

            out.append((f"{self.name}/{variant}", echo))
        return out

    def texts(self, surface: CheatSurface) -> list[tuple[str, str]]:
        return forms.constants(surface.expected)


class ConstantLabel(AnswerCheat):
    name = "constant-label"
    summary = "one label of the task's set on every task (the right one included): its mean "
    summary += "over a domain must stay at most 1/k + 0.05 for k labels"

    def applies(self, surface: CheatSurface) -> bool:
        labels = labels_of(surface)
        return surface.answer is not None and 2 <= len(labels) <= forms.MAX_CONSTANT_LABELS

    def texts(self, surface: CheatSurface) -> list[tuple[str, str]]:
        return [(label, label) for label in labels_of(surface)]

    def domain_limit(self, surface: CheatSurface) -> float | None:
        return 1 / len(labels_of(surface)) + forms.SKEW_MARGIN


def labels_of(surface: CheatSurface) -> tuple[str, ...]:
    return forms.labels_for(surface.expected, surface.labels)


# -- the registry ---------------------------------------------------------------------------
BUILTIN: tuple[GenericCheat, ...] = (
    *(CommandCheat(name) for name in scripts.NAMES),
    FileCheat("planted-files", "startup and pytest files", scripts.planted_files),
    FileCheat("module-shadowing-files", "stdlib/test-tooling module names", scripts.shadow_files),
    FileCheat("test-plugin-files", "a test package and a pytest11 entry", scripts.plugin_files),
    NonFinite(),
    Reformatted(),
    LabelCombination(),
    NullInformation(),
    ConstantLabel(),
)
_registered: list[GenericCheat] = []


def register(cheat: GenericCheat) -> GenericCheat:
    """Add a class to the library (every later `pack check` in this process plays it)."""
    if cheat.name in {c.name for c in library()}:
        raise ValueError(f"a generic cheat named {cheat.name!r} is already in the library")
    _registered.append(cheat)
    return cheat


@functools.cache
def _from_entry_points() -> tuple[GenericCheat, ...]:
    """Classes installed distributions add (group `palaestra.cheats`, value a class or an
    instance); one that fails to load is logged and skipped."""
    found: list[GenericCheat] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            cheat = obj() if isinstance(obj, type) else obj
        except Exception as exc:
            log.warning("generic cheat %s failed to load: %s", ep.name, exc)
            continue
        if isinstance(cheat, GenericCheat):
            found.append(cheat)
        else:
            log.warning("entry point %s is not a GenericCheat; skipped", ep.name)
    return tuple(found)


def library() -> list[GenericCheat]:
    """Every class: the built-in ones, then registered ones, then entry points'."""
    return [*BUILTIN, *_registered, *_from_entry_points()]


@dataclass(frozen=True)
class LibraryPlay:
    """One episode the library plays on a task: its class, name, script and domain limit
    (None: the per-task `cheat_max_reward`)."""

    kind: str
    name: str
    script: Script
    domain_limit: float | None = None


def plays_for(
    task: Task, surface: CheatSurface, extra: Iterable[GenericCheat] = ()
) -> list[LibraryPlay]:
    """Every play of every class that applies to `surface`."""
    out = []
    for cheat in [*library(), *extra]:
        if cheat.applies(surface):
            limit = cheat.domain_limit(surface)
            out += [
                LibraryPlay(cheat.name, name, script, limit)
                for name, script in cheat.plays(task, surface)
            ]
    return out


def describe() -> list[dict[str, str]]:
    """The library as a table (name, shapes, summary), for docs and `pack check --list`."""
    rows = []
    probes = {
        "shell": CheatSurface(shell="bash"),
        "files": CheatSurface(files="write_file"),
        "answer": CheatSurface(answer=_submit_answer, labels=("A", "B")),
    }
    for cheat in library():
        shapes = [shape for shape, surface in probes.items() if cheat.applies(surface)]
        rows.append({"name": cheat.name, "shapes": ", ".join(shapes), "summary": cheat.summary})
    return rows
