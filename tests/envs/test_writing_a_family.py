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

from docblocks import blocks, write_files

from palaestra.envs.base import EpisodeContext, Family, Sandboxes
from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sdk.task import Task
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
