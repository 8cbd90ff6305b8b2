"""A harness-mode episode cannot be checkpointed (server/checkpoint.py): its harness and
model session live in the server, so a checkpoint answers 409 `harness_episode` and the
episode goes on (docs/decisions.md, "Checkpoint and resume")."""

from __future__ import annotations

import pytest

from tests.conftest import ServerProcess
from tests.harness_peers import TRAIN_TASK, call, harness, started, wait_calls
from tests.peers.fake_model import FakeModel, bash_call
from tests.server.test_sealed import make_token

pytestmark = pytest.mark.slow


def test_a_harness_episode_is_not_checkpointed(door_server: ServerProcess) -> None:
    token = make_token(door_server, "train", "harness")
    fake = FakeModel([bash_call("sleep 120")])
    with fake.serve() as url:
        option = harness(url, config={"command_timeout_s": 300.0})
        episode = started(door_server, token, TRAIN_TASK, option)
        wait_calls(door_server, token, episode, 1)
        path = f"/v1/episodes/{episode}/checkpoint"
        refused = call(door_server, token, "POST", path)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "harness_episode"
        state = call(door_server, token, "GET", f"/v1/episodes/{episode}").json()
        assert state["status"] == "active" and state["harness"]["state"] == "running"
        assert call(door_server, token, "DELETE", f"/v1/episodes/{episode}").status_code == 204
