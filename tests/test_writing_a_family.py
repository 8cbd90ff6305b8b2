"""docs/writing-a-family.md: its example family and pack, built from the page's own code
blocks, pass `palaestra pack check` (and a task that does not fit is refused)."""

from __future__ import annotations

import asyncio
import json
import re
import types
from pathlib import Path

from palaestra.envs.base import Family
from palaestra.server.packs.check import check_pack
from palaestra.server.packs.loader import inspect_pack

DOC = Path(__file__).resolve().parent.parent / "docs" / "writing-a-family.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def example_family() -> Family:
    module = types.ModuleType("arithmetic_example")
    exec(compile("\n".join(blocks("python")), str(DOC), "exec"), module.__dict__)
    family = module.ArithmeticFamily()
    assert isinstance(family, Family)
    return family


def example_pack(root: Path) -> Path:
    manifest = next(b for b in blocks("toml") if b.startswith("name = "))
    root.mkdir()
    (root / "pack.toml").write_text(manifest)
    (root / "tasks.jsonl").write_text(blocks("json")[0])
    return root


def test_the_example_family_passes_pack_check(tmp_path: Path) -> None:
    family = example_family()
    report = asyncio.run(check_pack(example_pack(tmp_path / "pack"), extra_families=[family]))
    assert report.ok, [p.message for p in report.problems]
    assert report.tasks == 2


def test_the_example_family_refuses_a_task_without_its_answer(tmp_path: Path) -> None:
    root = example_pack(tmp_path / "pack")
    task = {"id": "bad", "family": "arithmetic", "split": "train", "public": {}, "private": {}}
    with (root / "tasks.jsonl").open("a") as out:
        out.write(json.dumps(task) + "\n")
    pack, problems = inspect_pack(root, [example_family()])
    assert pack is not None and sorted(pack.tasks) == ["add", "mul"]
    assert any("bad" in p and "public.question" in p for p in problems), problems
