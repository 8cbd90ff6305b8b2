"""A resumed harness episode's wall clock: the harness starts again from its start workspace
and its replay runs its commands again, so its clock must restart where the harness
started. It went on from the checkpoint's elapsed time instead: the replayed commands were
counted twice, and a harness whose commands had taken more than half its wall limit by its
checkpoint was killed mid-replay, the episode void (`resume_failed`) where it would have
finished. A real bash-agent in bwrap, the server SIGKILLed between checkpoint and resume."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess
from tests.harness_peers import SOLVE_2, TRAIN_TASK, finished, harness, started
from tests.peers.fake_model import FakeModel, bash_call
from tests.server.harness.test_harness_checkpoint import checkpointed, resumed, server_on
from tests.server.test_checkpoint_kill import kill
from tests.server.test_sealed import make_token

pytestmark = pytest.mark.slow  # two servers and a replay


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    made: list[ServerProcess] = []
    yield made
    for server in made:
        server.stop()


def test_a_replay_is_not_charged_twice(tmp_path: Path, servers: list[ServerProcess]) -> None:
    # It solves the task, then sleeps past half its wall limit; its second call (checkpointed
    # with the first) sleeps on until the limit ends the run, truncated and verified.
    model = FakeModel([bash_call(SOLVE_2 + " && sleep 4"), bash_call("sleep 60")])
    with model.serve() as url:
        first = server_on(tmp_path / "data").start()
        servers.append(first)
        token = make_token(first, "train", "harness")
        episode = started(first, token, TRAIN_TASK, harness(url), max_wall_s=7)
        checkpointed(first, token, episode, 2)
        kill(first)
        second = server_on(tmp_path / "data").start()
        servers.append(second)
        status, body = resumed(second, token, episode)
        assert status == 200, body
        done = finished(second, token, episode)
    assert done["status"] == "done", done["failure"]
    assert done["verdict"]["reward"] == 1.0, done
    assert "wall-time limit" in done["harness"]["reason"], done["harness"]
    assert len(model.requests) == 2  # both calls answered from the capture the second time
