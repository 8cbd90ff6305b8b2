"""Attacks on a harness episode's checkpoint and resume by replay (server/harness_resume.py,
server/harness/replay.py), on a real `palaestra serve` with a bash-agent in bwrap:

- a foreign token's checkpoint or resume of a harness episode is the 404 of an unknown id,
  and leaves the episode resumable for its owner;
- a capture altered in the store after its checkpoint (a token id of a recorded call
  changed: a trainer would learn from ids the model never produced) is refused at resume:
  void `resume_failed` naming the step, no sandbox started, the model never asked;
- a resume whose harness option the operator's settings now refuse (the endpoint taken off
  `harness_endpoints`) is void `resume_failed` naming the setting, never a live harness
  talking to an endpoint no longer allowed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerProcess
from tests.harness_peers import TRAIN_TASK, call, harness, started, wait_calls
from tests.peers.fake_model import FakeModel, bash_call
from tests.server.harness.test_harness_checkpoint import checkpointed, server_on
from tests.server.test_checkpoint_kill import kill
from tests.server.test_sealed import make_token

pytestmark = pytest.mark.slow


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    made: list[ServerProcess] = []
    yield made
    for server in made:
        server.stop()


def tamper(data: Path, episode: str) -> None:
    """Change the first completion token id of the episode's first recorded model call."""
    db = sqlite3.connect(data / "palaestra.sqlite3")
    try:
        (number,) = db.execute(
            "SELECT number FROM episodes WHERE id LIKE ?", (f"%{episode}",)
        ).fetchone()
        rows = db.execute(
            "SELECT idx, record FROM step_records WHERE episode=? ORDER BY idx", (number,)
        ).fetchall()
        idx, raw = rows[0]
        record: Any = json.loads(raw)
        first = record[0] if isinstance(record, list) else record
        first["info"]["llm_call"]["completion_token_ids"][0] += 1
        db.execute(
            "UPDATE step_records SET record=? WHERE episode=? AND idx=?",
            (json.dumps(record), number, idx),
        )
        db.commit()
    finally:
        db.close()


def error(reply: Any) -> dict[str, Any]:
    body: dict[str, Any] = reply.json()["error"]
    return body


def test_foreign_tampered_and_disallowed_harness_resumes(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    model = FakeModel([bash_call("sleep 5"), bash_call("sleep 60")])
    data = tmp_path / "data"
    with model.serve() as url:
        first = server_on(data).start()
        servers.append(first)
        owner = make_token(first, "train", "harness")
        stranger = make_token(first, "train", "harness")
        kept, altered = (started(first, owner, TRAIN_TASK, harness(url)) for _ in range(2))
        moved = started(first, owner, TRAIN_TASK, harness(url.replace("127.0.0.1", "localhost")))
        for episode in (kept, altered, moved):  # each in its `sleep 5`
            checkpointed(first, owner, episode, 1)
        for what in ("checkpoint", "resume"):
            refused = call(first, stranger, "POST", f"/v1/episodes/{kept}/{what}")
            assert refused.status_code == 404, refused.text
        kill(first)
        asked = len(model.requests)
        tamper(data, altered)

        second = server_on(data, harness_endpoints=["127.0.0.1"]).start()
        servers.append(second)
        refused = call(second, stranger, "POST", f"/v1/episodes/{kept}/resume")
        assert refused.status_code == 404 and error(refused)["code"] == "not_found", refused.text

        broken = call(second, owner, "POST", f"/v1/episodes/{altered}/resume")
        assert broken.status_code == 409 and error(broken)["code"] == "resume_failed"
        assert "step 0 was altered" in error(broken)["message"], broken.text
        state = call(second, owner, "GET", f"/v1/episodes/{altered}").json()
        assert state["status"] == "void" and state["failure"]["kind"] == "resume_failed"
        again = call(second, owner, "POST", f"/v1/episodes/{altered}/resume")
        assert again.status_code == 409 and error(again)["code"] == "not_resumable"

        gone = call(second, owner, "POST", f"/v1/episodes/{moved}/resume")
        assert gone.status_code == 409 and error(gone)["code"] == "resume_failed", gone.text
        assert "harness_endpoints" in error(gone)["message"]

        resumed = call(second, owner, "POST", f"/v1/episodes/{kept}/resume")
        assert resumed.status_code == 200, resumed.text
        state = wait_calls(second, owner, kept, 2)  # replayed 1, then the model again
        assert state["status"] == "active" and state["harness"]["calls"] == 2
        assert len(model.requests) == asked + 1
        assert call(second, owner, "DELETE", f"/v1/episodes/{kept}").status_code == 204


def test_a_start_that_cannot_be_kept_leaves_the_harness_running(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """The snapshot store unwritable (here a file where its folder goes; a full disk
    alike): the harness runs on, and its checkpoint is 409 `harness_episode` saying why."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    model = FakeModel([bash_call("sleep 60")])
    with model.serve() as url:
        server = server_on(tmp_path / "data", checkpoint_dir=str(blocker)).start()
        servers.append(server)
        token = make_token(server, "train", "harness")
        episode = started(server, token, TRAIN_TASK, harness(url))
        wait_calls(server, token, episode, 1)
        refused = call(server, token, "POST", f"/v1/episodes/{episode}/checkpoint")
        assert refused.status_code == 409, refused.text
        assert error(refused)["code"] == "harness_episode"
        assert "start workspace was not kept" in error(refused)["message"]
        state = call(server, token, "GET", f"/v1/episodes/{episode}").json()
        assert state["status"] == "active" and state["harness"]["state"] == "running"
        assert call(server, token, "DELETE", f"/v1/episodes/{episode}").status_code == 204
