"""docs/writing-a-family.md: its example family and pack, built from the page's own code
blocks, pass `palaestra pack check` (and a task that does not fit is refused), and every
sandbox example of the page runs as written on a real bwrap sandbox (tests/docblocks.py
says how the page's blocks are marked)."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import types
from pathlib import Path
from typing import Any

import pytest
from docblocks import blocks, write_files

from palaestra.envs import (
    Action,
    EpisodeContext,
    Family,
    InvalidActionError,
    Sandboxes,
    SandboxSpec,
    Task,
)
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.server.packcheck import check_pack
from palaestra.server.packs.loader import inspect_pack

PAGE = "writing-a-family.md"
IS_ROOT = os.geteuid() == 0


def page_module() -> types.ModuleType:
    """The page's unmarked python blocks, run as one module."""
    module = types.ModuleType("arithmetic_example")
    code = "\n".join(b.body for b in blocks(PAGE) if b.lang == "python" and not b.kind)
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    return module


def example_family() -> Family:
    family = page_module().ArithmeticFamily()
    assert isinstance(family, Family)
    return family


def example_pack(root: Path) -> Path:
    written = write_files(PAGE, root)
    assert sorted(p.name for p in written) == ["pack.toml", "tasks.jsonl"]
    return written[0].parent


def test_the_example_family_passes_pack_check(tmp_path: Path) -> None:
    family = example_family()
    report = asyncio.run(check_pack(example_pack(tmp_path), extra_families=[family]))
    assert report.ok, [p.message for p in report.problems]
    assert report.tasks == 2


def test_the_example_family_needs_one_import() -> None:
    """Everything the page's family names comes from `palaestra.envs` (and pydantic)."""
    code = "\n".join(b.body for b in blocks(PAGE) if b.lang == "python" and not b.kind)
    modules = {
        node.module
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert {m for m in modules if m.split(".")[0] == "palaestra"} == {"palaestra.envs"}
    assert not [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import)]


async def test_the_example_family_plays_an_episode_on_its_typed_state() -> None:
    module = page_module()
    family = module.ArithmeticFamily()
    assert [t.name for t in family.tool_specs()] == ["note", "submit"]
    public, private = {"question": "2 + 3?"}, {"answer": 5}
    task = Task("add", "arithmetic", "x", "train", "acme/arithmetic", "1.0.0", public, private)
    family.validate_task(task)

    async def play(actions: list[Action]) -> tuple[Any, float]:
        ctx = EpisodeContext("e", task, None, {}, Sandboxes(_no_sandbox))
        assert (await family.reset(ctx)).text == "2 + 3?"
        for action in actions:
            tool, args = family.parse_action(action)
            await family.step(ctx, tool, args)
        return ctx.state, (await family.verify(ctx)).reward

    state, reward = await play([Action(tool="note"), *family.oracle(task)])
    assert isinstance(state, module.ArithmeticState)
    assert (state.notes, state.answer, reward) == (1, 5.0, 1.0)
    assert (await play(family.null(task)))[1] == 0.0
    with pytest.raises(InvalidActionError, match="bad arguments for tool 'submit'"):
        family.parse_action(Action(tool="submit", arguments={}))

    # the family's settings: an operator's tolerance lets a near answer pass
    off = [Action(tool="submit", arguments={"value": 5.25})]
    assert (await play(off))[1] == 0.0
    family = module.ArithmeticFamily(settings=module.ArithmeticSettings(tolerance=0.5))
    assert (await play(off))[1] == 1.0


async def _no_sandbox(spec: Any) -> Any:
    raise AssertionError("the example family runs no sandbox")


def test_the_example_family_refuses_a_task_without_its_answer(tmp_path: Path) -> None:
    root = example_pack(tmp_path)
    task = {"id": "bad", "family": "arithmetic", "split": "train", "public": {}, "private": {}}
    with (root / "tasks.jsonl").open("a") as out:
        out.write(json.dumps(task) + "\n")
    pack, problems = inspect_pack(root, [example_family()])
    assert pack is not None and sorted(pack.tasks) == ["add", "mul"]
    assert any("bad" in p and "public.question" in p for p in problems), problems


async def run_sandbox_examples(tmp_path: Path) -> list[str]:
    """Every `sandbox` block in page order, in one namespace, inside a real episode's
    sandboxes (the episode's own made as the manager makes it, before reset)."""
    backend = BwrapBackend(None if IS_ROOT else tmp_path / "rt")
    sandboxes = Sandboxes(backend.create)
    task = Task("add", "arithmetic", "acme/arithmetic", "train", "acme/arithmetic", "1.0.0", {}, {})
    ctx = EpisodeContext("doc-episode", task, None, {}, sandboxes)
    namespace: dict[str, Any] = {**page_module().__dict__, "ctx": ctx}
    ran = []
    try:
        await sandboxes.start(SandboxSpec())
        for block in blocks(PAGE):
            if block.kind != "sandbox":
                continue
            code = compile(
                block.body, block.where(PAGE), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
            result = eval(code, namespace)
            if asyncio.iscoroutine(result):
                await result
            ran.append(block.where(PAGE))
    finally:
        assert await sandboxes.aclose() == []
        await backend.aclose()
    return ran


def test_every_sandbox_example_runs_on_a_real_sandbox(tmp_path: Path) -> None:
    ran = asyncio.run(run_sandbox_examples(tmp_path))
    assert len(ran) >= 9, ran  # spec, episode, exec, limits, files, ls, run_python, verify, gone
