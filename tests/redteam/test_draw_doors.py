"""Held-out draws (server/draws.py) through the other ways an episode starts, on a real
server over loopback: after a rotation, a fork of a live episode of the retired draw, a
resume of one checkpointed before it, a NeMo Gym seed, a batch reset, an OpenEnv reset and
the pack archive serve an eval token nothing of the retired draw, and a train token no
draw at all."""

from __future__ import annotations

from typing import Any

import httpx

from tests.redteam.test_heldout_draws import FIXTURE, PACK, heldout, token
from tests.servers import ServerProcess, server_fixture

server = server_fixture(
    packs={"heldout-codes": FIXTURE, "echo": FIXTURE.parents[2] / "packs" / "echo"}
)


def post(server: ServerProcess, path: str, headers: dict[str, str], **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=60, **kw)


def rotate(server: ServerProcess) -> None:
    done = post(server, f"/v1/packs/{PACK}/heldout/rotate", server.headers)
    assert done.status_code == 200, done.text


def test_a_retired_draw_is_not_forked_or_resumed(server: ServerProcess) -> None:
    """An eval token's live episode of draw N, after a rotation: its fork (a new episode)
    is 404 draw_retired; one checkpointed before the rotation and parked by a restart is
    not resumed (void, resume_failed); the live one itself still finishes."""
    evaluator = token(server, ["eval"])
    old = sorted(heldout(server))
    live = post(server, "/v1/episodes", evaluator, json={"task": old[0]})
    parked = post(server, "/v1/episodes", evaluator, json={"task": old[1]})
    assert live.status_code == parked.status_code == 200, live.text
    live_id, parked_id = live.json()["episode_id"], parked.json()["episode_id"]
    kept = post(server, f"/v1/episodes/{parked_id}/checkpoint", evaluator)
    assert kept.status_code == 200, kept.text
    rotate(server)
    assert not set(heldout(server)) & set(old)
    fork = post(server, f"/v1/episodes/{live_id}/fork", evaluator, json={})
    assert fork.status_code == 404, fork.text
    assert fork.json()["error"]["code"] == "draw_retired"
    done = post(server, f"/v1/episodes/{live_id}/verify", evaluator)
    assert done.status_code == 200, done.text  # episodes already running finish
    server.stop()
    server.start()
    resumed = post(server, f"/v1/episodes/{parked_id}/resume", evaluator)
    assert resumed.status_code == 409, resumed.text
    assert resumed.json()["error"]["code"] == "resume_failed"
    assert "retired" in resumed.json()["error"]["message"]


def test_no_door_serves_a_draw_to_a_train_token(server: ServerProcess) -> None:
    trainer = token(server, ["train"])
    current = sorted(heldout(server))[0]
    task_id = current.rpartition(":")[2]
    seeded = post(
        server,
        "/seed_session",
        trainer,
        json={
            "resources_session_id": "s",
            "episode_id": {"rollout_id": "r"},
            "task_id": {"taskset": PACK, "task_id": task_id},
            "task_data": {},
        },
    )
    assert seeded.status_code == 403, seeded.text
    batch = post(server, "/v1/batch/reset", trainer, json={"items": [{"task": current}]})
    assert batch.status_code == 200, batch.text
    (item,) = batch.json()["items"]
    assert item.get("result") is None and item["error"]["status"] == 403, item
    openenv = post(server, f"/openenv/{PACK}/reset", trainer, json={"task": current})
    assert openenv.status_code in (403, 404), openenv.text
    archive = httpx.get(f"{server.url}/v1/packs/{PACK}/archive", headers=trainer)
    assert archive.status_code in (403, 404), archive.status_code
