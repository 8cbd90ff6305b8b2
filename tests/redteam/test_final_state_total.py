"""Disk exhaustion through kept final states (server/final_state.py): each episode keeps at
most `final_state_max_mb`, but a tenant verifying many distinct workspaces could fill the
disk within `final_state_retention_days`; `final_state_max_total_mb` bounds them all
together, and once there an episode keeps nothing (its record and regrade's 409 say why)
while its verdict is made as ever.

Real bwrap sandboxes, the real app over a real manager (ASGI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import make_settings

from palaestra.server.final_state import FOLDER, FinalStateRecord
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests.redteam.tenants import tenant

HE = "openai/humaneval:HumanEval-1"
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


@pytest.fixture
async def capped(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    settings = make_settings(
        data_dir=tmp_path / "data", final_state_max_mb=1, final_state_max_total_mb=2
    )
    built = build_manager(settings)
    await built.start()
    yield built
    await built.shutdown()


async def test_kept_final_states_stop_at_their_total_cap(capped: EpisodeManager) -> None:
    me = tenant(capped, ["train"])
    records: list[FinalStateRecord] = []
    eids: list[str] = []
    for i in range(6):  # six distinct workspaces of 600 KiB each: 3.6 MiB, over the 2 MiB
        eid = await me.start(task=HE)
        fill = f"import os\nopen('blob', 'wb').write(b'{i}' + os.urandom(600 * 1024))"
        for action in (
            {"tool": "run_python", "arguments": {"code": fill}},
            {"tool": "write_file", "arguments": {"path": "solution.py", "content": SOLUTION}},
            {"tool": "submit", "arguments": {}},
        ):
            reply = await me.http.post(f"/v1/episodes/{eid}/step", json={"action": action})
            assert reply.status_code == 200, reply.text
        assert reply.json()["reward"] == 1.0  # keeping nothing never changes a verdict
        raw = await capped.store.final_state(eid)
        assert raw is not None
        records.append(FinalStateRecord.model_validate_json(raw))
        eids.append(eid)
    folder = capped.settings.data_dir / FOLDER
    total = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert total <= (2 + 1) << 20, total  # the cap, plus at most the one keep that crossed it
    assert records[0].workspace is not None
    refused = [r for r in records if r.workspace is None]
    assert refused and all("final_state_max_total_mb" in (r.why or "") for r in refused)
    last = await me.http.post(f"/v1/episodes/{eids[-1]}/regrade", json={"pack": "openai/humaneval"})
    assert last.status_code == 409 and "final_state_max_total_mb" in last.text
    first = await me.http.post(f"/v1/episodes/{eids[0]}/regrade", json={"pack": "openai/humaneval"})
    assert first.status_code == 200 and first.json()["reward"] == 1.0
    await me.http.aclose()
