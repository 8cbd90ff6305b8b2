"""Attacks on regrade (`POST /v1/episodes/{id}/regrade`, server/regrade.py) and on the final
states kept for it (server/final_state.py).

- a foreign regrade: another token's episode, by its id or by the client-chosen id its
  owner gave it, answers the 404 of an unknown id;
- storage exhaustion: an agent that leaves a workspace over `final_state_max_mb` (real
  bytes, or a sparse file whose tar would be huge) gets nothing kept (the record says
  why, regrade answers 409) and nothing over the cap lands on disk; equal workspaces are
  kept once (content-addressed);
- a link out of the workspace: a symlink to a host path (absolute, or climbing out with
  `..`) is dropped from the kept tar (and counted), so a regrade's fresh sandbox never
  gets it; the regrade still grades the solution;
- a sealed task: a regrade by its eval token carries no test source or expected value.

Real bwrap sandboxes, the real app over one manager for the module (ASGI)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import make_settings

from palaestra.server.final_state import FOLDER, FinalStateRecord
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.server.sealed import WITHHELD
from tests.redteam.tenants import Tenant, shape, tenant

HE = "openai/humaneval:HumanEval-1"
HE_SEALED = "openai/humaneval:HumanEval-0"  # the sealed held-out split
CAP_MB = 1
SOLUTION = """def separate_paren_groups(paren_string):
    groups, depth, cur = [], 0, ""
    for c in paren_string.replace(" ", ""):
        cur += c
        depth += 1 if c == "(" else -1
        if depth == 0:
            groups.append(cur)
            cur = ""
    return groups
"""
SUBMIT: dict[str, Any] = {"tool": "submit", "arguments": {}}

module_loop = pytest.mark.asyncio(loop_scope="module")
Factory = Callable[[list[str]], Tenant]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def manager(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EpisodeManager]:
    data = tmp_path_factory.mktemp("regrade-attacks") / "data"
    built = build_manager(make_settings(data_dir=data, final_state_max_mb=CAP_MB))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


@pytest_asyncio.fixture(loop_scope="module")
async def tenants(manager: EpisodeManager) -> AsyncIterator[Factory]:
    made: list[Tenant] = []

    def make(scopes: list[str]) -> Tenant:
        made.append(tenant(manager, scopes))
        return made[-1]

    yield make
    for t in made:
        await t.http.aclose()


def write(content: str, path: str = "solution.py") -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


def run(code: str) -> dict[str, Any]:
    return {"tool": "run_python", "arguments": {"code": code}}


async def play(t: Tenant, task: str, *actions: dict[str, Any], **body: Any) -> str:
    eid = await t.start(task=task, **body)
    for action in actions:
        reply = await t.http.post(f"/v1/episodes/{eid}/step", json={"action": action})
        assert reply.status_code == 200, reply.text
    return eid


async def regrade(t: Tenant, eid: str, pack: str = "openai/humaneval") -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/regrade", json={"pack": pack})


async def record(manager: EpisodeManager, key: str) -> FinalStateRecord:
    raw = await manager.store.final_state(key)
    assert raw is not None
    return FinalStateRecord.model_validate_json(raw)


def kept_files(manager: EpisodeManager) -> list[Path]:
    return [p for p in (manager.settings.data_dir / FOLDER).iterdir() if p.is_file()]


@module_loop
async def test_another_tokens_episode_is_an_unknown_one(tenants: Factory) -> None:
    owner, stranger, evaluator = tenants(["train"]), tenants(["train"]), tenants(["eval"])
    eid = await play(owner, HE, write(SOLUTION), SUBMIT)
    named = await play(owner, HE, write(SOLUTION), SUBMIT, episode_id="mine-1")
    assert (await regrade(owner, eid)).json()["reward"] == 1.0
    unknown = shape(await regrade(stranger, "0" * 32), "0" * 32)
    for thief in (stranger, evaluator):
        assert shape(await regrade(thief, eid), eid) == unknown
        assert shape(await regrade(thief, "mine-1"), "mine-1") == unknown
    assert (await regrade(owner, "mine-1")).status_code == 200
    assert named  # the owner's own id still names its episode


@module_loop
async def test_a_huge_workspace_keeps_nothing_over_the_cap(
    tenants: Factory, manager: EpisodeManager
) -> None:
    me = tenants(["train"])
    real = "x" * (700 * 1024)
    heavy = await play(me, HE, write(real, "a.txt"), write(real, "b.txt"), write(SOLUTION), SUBMIT)
    sparse = await play(me, HE, run("f = open('s', 'wb'); f.truncate(30 << 20); f.close()"), SUBMIT)
    for eid in (heavy, sparse):
        kept = await record(manager, eid)
        assert kept.workspace is None and kept.why and f"({CAP_MB} MiB)" in kept.why
        refused = await regrade(me, eid)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "no_final_state"
        assert "final_state_max_mb" in refused.json()["error"]["message"]
    assert all(p.stat().st_size <= CAP_MB << 20 for p in kept_files(manager))
    # The verdicts were made as ever: keeping never changes one.
    state = (await me.http.get(f"/v1/episodes/{heavy}")).json()
    assert state["verdict"]["reward"] == 1.0
    # Equal states are kept once (content-addressed): two episodes, one state file.
    first = await play(me, HE, write(SOLUTION), SUBMIT)
    second = await play(me, HE, write(SOLUTION), SUBMIT)
    a, b = await record(manager, first), await record(manager, second)
    assert a.state is not None and a.state == b.state


@module_loop
async def test_links_out_of_the_workspace_are_not_kept(
    tenants: Factory, manager: EpisodeManager
) -> None:
    me = tenants(["train"])
    links = (
        "import os; os.symlink('/etc/passwd', 'abs'); os.symlink('../../../etc', 'up');"
        " os.symlink('solution.py', 'inside')"
    )
    eid = await play(me, HE, write(SOLUTION), run(links), SUBMIT)
    kept = await record(manager, eid)
    assert kept.workspace is not None and kept.dropped == 2
    path = manager.settings.data_dir / FOLDER / kept.workspace.removeprefix("sha256:")
    with tarfile.open(fileobj=io.BytesIO(path.read_bytes())) as tf:
        names = {m.name.removeprefix("./"): m for m in tf.getmembers()}
    assert "abs" not in names and "up" not in names
    assert names["inside"].issym() and names["inside"].linkname == "solution.py"
    reply = await regrade(me, eid)
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == 1.0 and "root:" not in reply.text


@module_loop
async def test_a_sealed_regrade_reveals_no_hidden_answer(tenants: Factory) -> None:
    evaluator = tenants(["eval"])
    wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
    eid = await play(evaluator, HE_SEALED, write(wrong), SUBMIT)
    reply = await regrade(evaluator, eid)
    assert reply.status_code == 200, reply.text
    verdict = reply.json()
    assert verdict["reward"] == 0.0 and WITHHELD in verdict["feedback"]
    assert "assert" not in reply.text and "candidate" not in reply.text
