"""Red team of ACP harness episodes (server/harness/acp.py) on a real server: a policy that
breaks the ACP session (its command writes into the agent's stdout pipe through /proc, so
the client reads a line that is not JSON) gets its 0 with the typed agent failure
`agent_crash`/`harness_protocol`, never a void and never a 5xx; bad ACP options are a 422
naming the key. The client's own attack tests (paths out of the workspace, malformed
messages of every kind) are tests/adversarial/test_acp_client.py."""

from __future__ import annotations

import pytest

from palaestra.server.harness.toolchain import acp
from tests.conftest import ServerProcess
from tests.harness_peers import TRAIN_TASK, ending, finished, harness, llm_calls, reset, started
from tests.peers.fake_model import FakeModel, bash_call
from tests.server.test_sealed import make_token

CHAIN = acp()
# Every process whose command line names the agent gets a line that is not JSON on its
# stdout: the agent's is the client's ACP pipe ([a] keeps this command from matching itself).
BREAK = (
    "for p in /proc/[0-9]*; do grep -qa 'acp_[a]gent.py' $p/cmdline 2>/dev/null && "
    "printf 'I am not JSON-RPC\\n' > $p/fd/1; done"
)


@pytest.fixture(scope="module")
def token(door_server: ServerProcess) -> str:
    return make_token(door_server, "train", "harness")


@pytest.mark.slow  # a whole episode
@pytest.mark.skipif(not CHAIN.available, reason=f"acp toolchain: {CHAIN.reason}")
def test_a_policy_that_breaks_the_protocol_scores_zero(
    door_server: ServerProcess, token: str
) -> None:
    fake = FakeModel([bash_call(BREAK)])
    with fake.serve() as url:
        episode = started(door_server, token, TRAIN_TASK, harness(url, "acp-agent"))
        state = finished(door_server, token, episode)
    assert state["status"] == "done", state["void_reason"]
    assert state["verdict"]["reward"] == 0.0
    failure = state["failure"]
    assert failure["kind"] == "agent_crash" and failure["boundary"] == "agent", failure
    assert failure["failure_class"] == "harness_protocol"
    assert "not JSON" in failure["reason"] and failure["exit_code"] == 3
    last = ending(state)
    assert last["info"]["harness"]["state"] == "failed"
    assert last["info"]["harness"]["reason"].startswith("the ACP agent broke the protocol")
    assert last["info"]["failure"] == failure
    assert len(llm_calls(state)) == 1  # the call that made it is recorded, to be trained on


def test_bad_acp_options_are_refused(door_server: ServerProcess, token: str) -> None:
    endpoint = "http://127.0.0.1:9/v1"
    unknown = reset(door_server, token, TRAIN_TASK, harness(endpoint, "acp-agent",
                    config={"agent_argv": ["/bin/sh"]}))  # fmt: skip
    assert unknown.status_code == 422, unknown.text
    message = unknown.json()["error"]["message"]
    assert "config.agent_argv" in message and "max_turns, command_timeout_s" in message
    wrong = reset(door_server, token, TRAIN_TASK, harness(endpoint, "acp-agent",
                  config={"max_turns": "many"}))  # fmt: skip
    assert wrong.status_code == 422 and "config.max_turns" in wrong.json()["error"]["message"]
