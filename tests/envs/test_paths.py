"""One path rule for every file-taking tool of every family (envs/paths.py): `x`, `./x` and
`<workdir>/x` name the same file; anything outside the workspace is a 422 that names the
path. Real episodes on bwrap sandboxes: coding (HumanEval), terminal (a task whose workdir
is /app, so `/work/x` is outside), cad (the write and run tools, before any toolchain)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings

from palaestra.envs.coding.family import task_solution
from palaestra.envs.paths import workspace_abspath, workspace_relpath
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Action
from palaestra.server.families import FamilyRegistry
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack
from palaestra.server.runtime import build_manager

OK, WHY = bwrap_available()
needs_bwrap = pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")

SAME = ["x.txt", "./x.txt", "/work/x.txt", "//work/x.txt", "/work/./x.txt", "d/../x.txt"]
OUTSIDE = ["/etc/passwd", "../x.txt", "/work/../x.txt", "/workx/y", "a/../../x", "x\0y", ""]


# -- the rule itself ------------------------------------------------------------------------


@pytest.mark.parametrize("path", SAME)
def test_the_three_spellings_name_one_file(path: str) -> None:
    assert workspace_relpath(path) == "x.txt"
    assert workspace_abspath(path) == "/work/x.txt"


@pytest.mark.parametrize("path", OUTSIDE)
def test_outside_the_workspace_is_a_422_naming_the_path(path: str) -> None:
    with pytest.raises(InvalidActionError) as info:
        workspace_relpath(path)
    assert info.value.status == 422 and info.value.code == "bad_path"
    assert repr(path) in info.value.message and "/work" in info.value.message


def test_the_workdir_is_the_family_s_own() -> None:
    assert workspace_abspath("/app/src/m.py", "/app") == "/app/src/m.py"
    assert workspace_abspath("src/m.py", "/app") == "/app/src/m.py"
    with pytest.raises(InvalidActionError, match=r"/work/m\.py"):
        workspace_abspath("/work/m.py", "/app")
    with pytest.raises(InvalidActionError, match="workspace itself"):
        workspace_relpath("/work")
    assert workspace_abspath("/app", "/app", allow_root=True) == "/app"
    assert workspace_relpath(".", allow_root=True) == "."


def test_every_file_taking_tool_is_one_this_file_covers() -> None:
    """A family that grows a tool with a path argument must be added to the tests below."""
    covered = {
        ("coding", "write_file"),
        ("coding", "run_python"),
        ("terminal", "read_file"),
        ("terminal", "write_file"),
        ("terminal", "edit_file"),
        ("terminal", "list_dir"),
        ("cad", "write_file"),
        ("cad", "run_script"),
    }
    found = set()
    for family in FamilyRegistry.discover().all():
        for spec in family.tool_specs():
            props = spec.parameters.get("properties", {})
            if any("path" in name or "file" in name for name in props):
                found.add((family.name, spec.name))
    assert found == covered


# -- through real episodes -------------------------------------------------------------------


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    built = build_manager(make_settings(data_dir=tmp_path / "data"))
    built.packs.add(load_pack(_app_pack(tmp_path / "app-pack")))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


def _app_pack(root: Path) -> Path:
    """A one-task terminal pack whose workdir is /app; the test passes when /app/out.txt
    holds "done"."""
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        'name = "test/paths"\nversion = "0.1.0"\ndescription = "paths"\n'
        'license = "MIT"\nfamilies = ["terminal"]\n\n[splits.train]\n'
    )
    task = {
        "id": "app",
        "family": "terminal",
        "domain": "paths/app",
        "split": "train",
        "difficulty": "easy",
        "public": {"instruction": "write done to out.txt", "workdir": "/app"},
        "private": {
            "verifier": {"test.sh": "#!/bin/bash\ngrep -qx done /app/out.txt\n"},
            "solution": {"solve.sh": "echo done > out.txt\n"},
        },
    }
    (root / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    return root


async def _step(client: AsyncInProcessClient, eid: str, tool: str, **args: Any) -> Any:
    return await client.step(eid, Action(tool=tool, arguments=args).model_dump())


@needs_bwrap
@pytest.mark.parametrize("path", ["solution.py", "./solution.py", "/work/solution.py"])
async def test_coding_solution_scores_however_it_is_named(
    manager: EpisodeManager, path: str
) -> None:
    task = manager.packs.resolve("openai/humaneval:HumanEval-0")
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(task.ref)).episode_id
    wrote = await _step(client, eid, "write_file", path=path, content=task_solution(task))
    assert "solution.py" in wrote.observation.text and "work/work" not in wrote.observation.text
    ran = await _step(client, eid, "run_python", path=path)
    assert ran.observation.data["exit_code"] == 0, ran.observation.text
    final = await _step(client, eid, "submit")
    assert final.info["verdict"]["status"] == "ok"
    assert final.reward == 1.0, final.info["verdict"]


@needs_bwrap
@pytest.mark.parametrize("path", OUTSIDE)
async def test_coding_tools_refuse_paths_outside(manager: EpisodeManager, path: str) -> None:
    client = AsyncInProcessClient(manager)
    eid = (await client.reset("openai/humaneval:HumanEval-0")).episode_id
    for tool, args in (("write_file", {"content": "x"}), ("run_python", {})):
        with pytest.raises(InvalidActionError) as info:
            await _step(client, eid, tool, path=path, **args)
        assert path == "" or repr(path) in info.value.message
    # The episode goes on: a 422 is a refused action, not an end.
    assert (await _step(client, eid, "write_file", path="ok.py", content="")).terminated is False


@needs_bwrap
async def test_terminal_tools_share_the_rule_with_its_own_workdir(
    manager: EpisodeManager,
) -> None:
    client = AsyncInProcessClient(manager)
    eid = (await client.reset("test/paths:app")).episode_id
    wrote = await _step(client, eid, "write_file", path="/app/out.txt", content="dome\n")
    assert wrote.observation.data["path"] == "/app/out.txt"
    for path in ("out.txt", "./out.txt", "/app/out.txt"):
        read = await _step(client, eid, "read_file", path=path)
        assert read.observation.text.startswith("dome"), (path, read.observation.text)
    edited = await _step(client, eid, "edit_file", path="./out.txt", old="dome", new="done")
    assert edited.observation.data["replacements"] == 1
    listed = await _step(client, eid, "list_dir", path="/app")
    assert [e["name"] for e in listed.observation.data["entries"]] == ["out.txt"]
    for path in ("/work/out.txt", "/etc/passwd", "../out.txt", "/app/../etc/passwd", "a\0b"):
        for tool, args in (
            ("read_file", {}),
            ("write_file", {"content": "x"}),
            ("edit_file", {"old": "a", "new": "b"}),
            ("list_dir", {}),
        ):
            with pytest.raises(InvalidActionError) as info:
                await _step(client, eid, tool, path=path, **args)
            assert repr(path) in info.value.message and "/app" in info.value.message
    final = await _step(client, eid, "submit")
    assert final.reward == 1.0, final.info["verdict"]


@needs_bwrap
async def test_cad_tools_share_the_rule(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    listing = await client.tasks(pack="palaestra/cad", limit=1)
    eid = (await client.reset(listing.tasks[0].id)).episode_id
    for path in ("part.py", "./part.py", "/work/part.py"):
        wrote = await _step(client, eid, "write_file", path=path, content="print(1)\n")
        assert wrote.observation.text.endswith(" to part.py"), wrote.observation.text
    for path in OUTSIDE:
        with pytest.raises(InvalidActionError) as info:
            await _step(client, eid, "write_file", path=path, content="x")
        assert path == "" or repr(path) in info.value.message
        with pytest.raises(InvalidActionError) as info:
            await _step(client, eid, "run_script", path=path)
        assert path == "" or repr(path) in info.value.message
