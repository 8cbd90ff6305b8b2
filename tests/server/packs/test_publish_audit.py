"""Publish (and `pack import --check`) audits a new pack version with the family's cheats
and the generic cheat library (`publish_check_tasks` tasks): a pack where any cheat scores
above its `cheat_max_reward` is refused with the contract's JSON error naming the cheat,
the task and the reward, and nothing is published; a pack that holds is published."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.server.app import create_app
from palaestra.server.config import Settings
from palaestra.server.packs.archive import pack_archive
from palaestra.server.packs.lock import pack_files
from palaestra.server.runtime import build_manager
from tests.server.packs.test_pack_check_report import LenientFamily, lenient_pack

FINQA = Path(__file__).resolve().parents[2] / "fixtures" / "finqa" / "finqa.json"


@pytest.mark.timeout(300)
async def test_publish_refuses_a_pack_a_generic_cheat_beats(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", packs_dirs=[], publish_check_tasks=4)
    manager = build_manager(settings)
    manager.families.add(LenientFamily())
    await manager.start()
    try:
        app = create_app(settings, manager=manager)
        app.state.manager = manager  # the ASGI transport runs no lifespan
        token = (settings.data_dir / "admin.token").read_text().strip()
        headers = {"authorization": f"Bearer {token}", "content-type": "application/gzip"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            weak = pack_archive(lenient_pack(tmp_path, "lenient", {"label": "False"}))
            refused = await http.post("/v1/packs", content=weak, headers=headers)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["code"] == "cheat_over_limit" and error["retryable"] is False
            message = error["message"]
            assert "acme/lenient@0.1.0 refused" in message
            assert "'label-combination/spaced' scored 1.000 on task label" in message
            assert "cheat_max_reward 0.1" in message
            listed = await http.get("/v1/packs/acme/lenient", headers=headers)
            assert listed.status_code == 404  # nothing was published

            strict = pack_archive(lenient_pack(tmp_path, "echo", {"label": "False"}))
            published = await http.post("/v1/packs", content=strict, headers=headers)
            assert published.status_code == 201, published.text
    finally:
        await manager.shutdown()


@pytest.mark.timeout(600)
def test_pack_import_check_audits_the_imported_tasks(tmp_path: Path) -> None:
    """`pack import … --check N` plays the family's cheats and the library on N imported
    tasks and writes the report beside the pack (a dotfile: not part of it)."""
    out = tmp_path / "finqa"
    run = CliRunner().invoke(app, ["pack", "import", "finqa", str(FINQA), str(out), "--check", "2"])
    assert run.exit_code == 0, run.output
    report = json.loads((out / ".palaestra-check.json").read_text())
    assert report["checked"] == 2 and report["over_limit"] == []
    assert {"non-finite", "null-information"} <= set(report["generic"].values())
    assert ".palaestra-check.json" not in pack_files(out)
