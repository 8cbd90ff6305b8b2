"""Harness episodes end to end (server/harness/runner.py): a real `palaestra serve` on
loopback starts the harness inside the episode's bwrap sandbox, whose one way out is the
episode's model session; the model is the real OpenAI-compatible server over HFBackend
with a tiny model built in code (it records the ids it generated), or FakeModel, a
scripted upstream (a fake) where the test needs an agent that does something sensible.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from palaestra.sdk.train.harness import episode_samples
from palaestra.server.harness.toolchain import acp as acp_toolchain
from tests.conftest import ServerProcess, docker_skip_reason, free_port
from tests.docblocks import blocks
from tests.harness_peers import (
    SEALED_TASK,
    SOLVE_0,
    SOLVE_2,
    TRAIN_TASK,
    NoIdsModel,
    RecordingModel,
    call,
    ending,
    finished,
    harness,
    llm_calls,
    recording_model,
    reset,
    started,
    wait_calls,
)
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.server.test_sealed import make_token
from tests.servers import server_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingModel]:
    with recording_model(tmp_path_factory.mktemp("model")) as served:
        yield served


@pytest.fixture(scope="module")
def token(door_server: ServerProcess) -> str:
    return make_token(door_server, "train", "harness")


def test_bash_agent_with_the_real_model(
    door_server: ServerProcess, token: str, model: RecordingModel
) -> None:
    """The tool-calling tiny model answers `submit` at once: one real call, then the
    harness exits and the episode is verified (no solution.py: 0, not void)."""
    sampling = {"temperature": 0.0, "max_tokens": 48}
    episode = started(door_server, token, TRAIN_TASK, harness(model.endpoint, sampling=sampling))
    state = finished(door_server, token, episode)
    assert state["status"] == "done"
    assert state["verdict"]["reward"] == 0.0 and state["verdict"]["failure"] == "missing_file"
    assert state["failure"]["kind"] == "no_answer" and state["failure"]["boundary"] == "agent"
    calls, generated = llm_calls(state), model.generated()
    assert len(calls) == 1 and calls[0]["finish_reason"] == "tool_calls"
    # The trajectory holds exactly the ids the model server generated, never re-tokenized.
    assert [c["prompt_token_ids"] for c in calls] == [g["prompt_token_ids"] for g in generated]
    assert [c["completion_token_ids"] for c in calls] == [g["token_ids"] for g in generated]
    assert len(calls[0]["logprobs"]) == len(calls[0]["completion_token_ids"])
    assert calls[0]["request"]["messages"][1]["content"].startswith("Implement the Python")
    last = ending(state)
    assert last["terminated"] and not last["truncated"]
    assert last["info"]["harness"]["state"] == "exited"
    assert last["info"]["harness"]["exit_code"] == 0  # the agent submitted
    assert last["info"]["harness"]["calls"] == 1


def test_a_harness_speaking_only_responses_trains(
    door_server: ServerProcess, token: str, model: RecordingModel, tmp_path: Path
) -> None:
    """bash-agent with `api: responses` calls `/v1/responses` alone. Scripted, through the
    copy-paste example of docs/integrations.md, it solves the task by a function_call /
    function_call_output round trip (reward 1); on the real model its one call is recorded
    with the ids the server generated; both episodes' records are training samples
    (sdk/train/harness.py), as the other dialects' are."""
    example = [b for b in blocks("integrations.md") if b.arg == "responses_example.py"]
    assert len(example) == 1, "docs/integrations.md: the Open Responses example is gone"
    (tmp_path / "responses_example.py").write_text(example[0].body)
    fake = FakeModel([bash_call(SOLVE_2), submit_call()])
    with fake.serve() as url:
        argv = [sys.executable, str(tmp_path / "responses_example.py"), door_server.url, token,
                url]  # fmt: skip
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    episode, reward, apis, ids = ran.stdout.split()
    assert (reward, apis, ids) == ("1.0", "openresponses,openresponses", "6"), ran.stdout
    assert [m["role"] for m in fake.requests[1]["messages"]] == ["system", "user", "assistant",
                                                                 "tool"]  # fmt: skip
    assert fake.requests[1]["messages"][-1]["content"].startswith("exit status 0")
    assert fake.requests[0]["max_tokens"] == 512  # the reset's sampling, set by the proxy
    solved = call(door_server, token, "GET", f"/v1/episodes/{episode}").json()
    calls = llm_calls(solved)
    assert calls[1]["request"]["input"][-1]["type"] == "function_call_output"
    assert calls[0]["response"]["output"][0]["type"] == "function_call"
    assert {s.reward for s in episode_samples(solved)} == {1.0}  # FakeModel's ids: 2 samples

    sampling = {"temperature": 0.0, "max_tokens": 48}
    option = harness(model.endpoint, sampling=sampling, config={"api": "responses"})
    before = len(model.generated())
    state = finished(door_server, token, started(door_server, token, TRAIN_TASK, option))
    assert state["status"] == "done" and ending(state)["info"]["harness"]["exit_code"] == 0
    [made], generated = llm_calls(state), model.generated()[before:]
    assert made["api"] == "openresponses" and made["finish_reason"] == "tool_calls"
    assert made["request"]["input"][0]["content"].startswith("Implement the Python")
    assert made["response"]["output"][0]["name"] == "submit"
    assert [made["prompt_token_ids"]] == [g["prompt_token_ids"] for g in generated]
    assert [made["completion_token_ids"]] == [g["token_ids"] for g in generated]
    assert len(made["logprobs"]) == len(made["completion_token_ids"]) > 0
    [sample] = episode_samples(state)
    assert sample.prompt_ids == made["prompt_token_ids"]
    assert sample.completion_ids == made["completion_token_ids"]
    assert sample.logprobs == made["logprobs"] and sample.loss_mask == [1] * len(sample.logprobs)


def test_fake_model_drives_the_bash_agent_to_a_solution(
    door_server: ServerProcess, token: str
) -> None:
    fake = FakeModel([bash_call(SOLVE_2), bash_call("python3 -c 'import solution'"), submit_call()])
    with fake.serve() as url:
        episode = started(door_server, token, TRAIN_TASK, harness(url))
        state = finished(door_server, token, episode)
    assert state["verdict"]["reward"] == 1.0, state["verdict"]
    assert len(fake.requests) == 3
    assert [m["role"] for m in fake.requests[1]["messages"]][-1] == "tool"
    assert fake.requests[1]["messages"][-1]["content"].startswith("exit status 0")
    assert len(llm_calls(state)) == 3
    assert ending(state)["reward"] == 1.0


def test_max_calls_stops_a_runaway_harness(door_server: ServerProcess, token: str) -> None:
    fake = FakeModel([bash_call("true")])  # forever
    option = harness("", max_calls=3, config={"max_turns": 500})
    with fake.serve() as url:
        option["model_endpoint"] = url
        state = finished(door_server, token, started(door_server, token, TRAIN_TASK, option))
    assert state["status"] == "done", state["void_reason"]
    assert state["verdict"]["reward"] == 0.0
    assert len(llm_calls(state)) == 3  # the 4th call was refused
    last = ending(state)
    assert last["truncated"] and "max_calls" in last["info"]["harness"]["reason"]


def test_wall_limit_kills_the_harness_and_step_get_delete_while_it_runs(
    door_server: ServerProcess, token: str
) -> None:
    fake = FakeModel([bash_call("sleep 120")])
    with fake.serve() as url:
        option = harness(url, config={"command_timeout_s": 300.0})
        episode = started(door_server, token, TRAIN_TASK, option, max_wall_s=4)
        state = wait_calls(door_server, token, episode, 1)
        assert state["status"] == "active" and state["harness"]["state"] == "running"
        assert [s["action"]["tool"] for s in state["trajectory"]] == ["llm_call"]  # live
        step = call(door_server, token, "POST", f"/v1/episodes/{episode}/step",
                    json={"action": {"tool": "submit", "arguments": {}}})  # fmt: skip
        assert step.status_code == 409 and step.json()["error"]["code"] == "harness_running"
        # Another one, closed while its harness runs: killed at once, no verdict.
        other = started(door_server, token, TRAIN_TASK, option)
        wait_calls(door_server, token, other, 1)
        assert call(door_server, token, "DELETE", f"/v1/episodes/{other}").status_code == 204
        closed = call(door_server, token, "GET", f"/v1/episodes/{other}").json()
        assert closed["status"] == "closed" and closed["verdict"] is None
        state = finished(door_server, token, episode)  # waits for the wall limit
    assert state["status"] == "done" and state["verdict"]["reward"] == 0.0
    last = ending(state)
    assert last["truncated"] and "wall-time" in last["info"]["harness"]["reason"]
    assert last["info"]["harness"]["state"] == "killed"


def test_model_without_token_ids_voids_the_episode(door_server: ServerProcess, token: str) -> None:
    fake = NoIdsModel([bash_call("true")])
    with fake.serve() as url:
        state = finished(door_server, token, started(door_server, token, TRAIN_TASK, harness(url)))
    assert state["status"] == "void"
    assert "token ids" in state["void_reason"], state["void_reason"]
    assert state["verdict"]["status"] == "void"
    assert state["failure"]["kind"] == "model_failed" and state["failure"]["boundary"] == "model"
    assert ending(state)["info"]["failure"]["kind"] == "model_failed"
    assert llm_calls(state) == []


def test_endpoint_that_fails_mid_run_voids_the_episode(
    door_server: ServerProcess, token: str
) -> None:
    fake = FakeModel([bash_call(SOLVE_2), 500])  # then the upstream fails
    with fake.serve() as url:
        state = finished(door_server, token, started(door_server, token, TRAIN_TASK, harness(url)))
    assert state["status"] == "void" and "HTTP 500" in state["void_reason"], state["void_reason"]
    assert state["failure"]["kind"] == "model_failed", state["failure"]
    assert state["failure"]["status"] == 500  # the endpoint's answer, a fact of the failure
    assert len(llm_calls(state)) == 1  # the call that was answered
    assert ending(state)["info"]["harness"]["reason"].startswith("the model endpoint failed")


def test_a_harness_that_gives_up_is_the_agents_zero(door_server: ServerProcess, token: str) -> None:
    fake = FakeModel([{"content": "I will not call any tool."}])  # the agent quits (exit 1)
    with fake.serve() as url:
        state = finished(door_server, token, started(door_server, token, TRAIN_TASK, harness(url)))
    assert state["status"] == "done" and state["verdict"]["reward"] == 0.0
    harness_status = ending(state)["info"]["harness"]
    assert harness_status["state"] == "exited" and harness_status["exit_code"] == 1


def test_endpoint_that_does_not_answer_is_refused_at_reset(
    door_server: ServerProcess, token: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    reply = reset(door_server, token, TRAIN_TASK, harness(dead))
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "endpoint_unavailable" and dead in error["message"]


def test_bad_options_are_refused(door_server: ServerProcess, token: str) -> None:
    unknown = reset(door_server, token, TRAIN_TASK, harness("http://127.0.0.1:9/v1", "nope"))
    assert unknown.status_code == 422
    assert unknown.json()["error"]["code"] == "unknown_harness"
    assert "bash-agent" in unknown.json()["error"]["message"]
    assert "mini-swe-agent" in unknown.json()["error"]["message"]
    extra = reset(door_server, token, TRAIN_TASK, {**harness("http://127.0.0.1:9/v1"), "x": 1})
    assert extra.status_code == 422 and "x" in extra.json()["error"]["message"]
    over = reset(door_server, token, TRAIN_TASK, harness("http://127.0.0.1:9/v1", max_calls=10**6))
    assert over.status_code == 422 and "ceiling_harness_calls" in over.json()["error"]["message"]
    train_only = make_token(door_server, "train")
    no_scope = reset(door_server, train_only, TRAIN_TASK, harness("http://127.0.0.1:9/v1"))
    assert no_scope.status_code == 403 and no_scope.json()["error"]["code"] == "missing_scope"
    far = reset(door_server, token, TRAIN_TASK, harness("http://10.1.2.3:8000/v1"))
    assert far.status_code == 403 and "harness_endpoints" in far.json()["error"]["message"]
    echo = reset(door_server, token, "palaestra/echo:say-birch", harness("http://127.0.0.1:9/v1"))
    assert echo.status_code == 422 and "runs no sandbox" in echo.json()["error"]["message"]


def test_a_sealed_task_stays_sealed(door_server: ServerProcess) -> None:
    evaluator = make_token(door_server, "eval", "harness")
    fake = FakeModel([bash_call(SOLVE_0), submit_call()])
    with fake.serve() as url:
        episode = started(door_server, evaluator, SEALED_TASK, harness(url))
        state = finished(door_server, evaluator, episode)
    verdict = state["verdict"]
    assert verdict["reward"] == 1.0 and "withheld" in verdict["feedback"]
    text = str(state["trajectory"])
    assert "def check(candidate)" not in text and "METADATA" not in text
    assert "withheld" in ending(state)["info"]["verdict"]["feedback"]
    seen: list[Any] = [c["request"]["messages"] for c in llm_calls(state)]
    assert seen[0][1]["content"].startswith("Implement the Python")  # what the agent saw


MINI = "mini-swe-agent"


def _mini_skip(door_server: ServerProcess, token: str) -> str:
    reply = reset(door_server, token, TRAIN_TASK, harness(f"http://127.0.0.1:{free_port()}", MINI))
    if reply.status_code == 503 and reply.json()["error"]["code"] == "harness_unavailable":
        return reply.json()["error"]["message"]
    return ""


def _mini_run(server: ServerProcess, token: str) -> dict[str, Any]:
    fake = FakeModel([bash_call(SOLVE_2), bash_call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")])
    with fake.serve() as url:
        state = finished(server, token, started(server, token, TRAIN_TASK, harness(url, MINI)))
    assert state["status"] == "done", state
    assert len(llm_calls(state)) == 2, ending(state)["info"]["harness_output"]
    return state


def test_mini_swe_agent_in_bwrap(door_server: ServerProcess, token: str) -> None:
    if why := _mini_skip(door_server, token):
        pytest.skip(why)
    state = _mini_run(door_server, token)
    assert state["verdict"]["reward"] == 1.0, ending(state)["info"]["harness_output"]


def _no_docker_base() -> str:
    from palaestra.sandbox.docker.engine import BASE_IMAGE

    return docker_skip_reason(BASE_IMAGE)


docker_server = server_fixture(
    "module", packs=["humaneval"], settings={"sandbox": "docker"}, skip=_no_docker_base
)


def test_mini_swe_agent_in_docker(docker_server: ServerProcess, tmp_path: Path) -> None:
    token = make_token(docker_server, "train", "harness")
    if why := _mini_skip(docker_server, token):
        pytest.skip(why)
    state = _mini_run(docker_server, token)
    assert state["verdict"]["reward"] == 1.0, ending(state)["info"]["harness_output"]


def test_acp_agent_in_docker(docker_server: ServerProcess) -> None:
    """The ACP client and reference agent on the image's python3, the acp toolchain bound
    into the container (tests/server/harness/test_acp_harness.py has the bwrap episode)."""
    if not (chain := acp_toolchain(host_python=False)).available:
        pytest.skip(f"acp toolchain: {chain.reason}")
    token = make_token(docker_server, "train", "harness")
    fake = FakeModel([bash_call(SOLVE_2), submit_call()])
    with fake.serve() as url:
        episode = started(docker_server, token, TRAIN_TASK, harness(url, "acp-agent"))
        state = finished(docker_server, token, episode)
    assert state["verdict"]["reward"] == 1.0, ending(state)["info"]["harness_output"]
    assert ending(state)["info"]["harness"]["reason"] == "the ACP prompt turn ended: end_turn"
    assert len(llm_calls(state)) == 2


def test_mini_swe_agent_with_the_real_model(
    door_server: ServerProcess, token: str, model: RecordingModel
) -> None:
    """The tiny model calls `submit`, a tool mini-swe-agent does not have: mini answers
    each with a format error until it gives up; every call's ids are the server's own."""
    if why := _mini_skip(door_server, token):
        pytest.skip(why)
    before = len(model.generated())
    option = harness(model.endpoint, MINI, sampling={"temperature": 0.0, "max_tokens": 48})
    option["config"] = {"step_limit": 4}
    state = finished(door_server, token, started(door_server, token, TRAIN_TASK, option))
    assert state["status"] == "done" and state["verdict"]["reward"] == 0.0, state["void_reason"]
    calls, generated = llm_calls(state), model.generated()[before:]
    # A call the server refused (mini's growing context past the tiny model's 2048) is
    # recorded too, with its error and no ids: the model generated nothing for it.
    answered = [c for c in calls if "error" not in c["response"]]
    assert answered, ending(state)["info"]["harness_output"]
    assert all(c["completion_token_ids"] == [] for c in calls if c not in answered)
    assert [c["prompt_token_ids"] for c in answered] == [g["prompt_token_ids"] for g in generated]
    assert [c["completion_token_ids"] for c in answered] == [g["token_ids"] for g in generated]
    assert ending(state)["info"]["harness"]["state"] == "exited"


def test_shutdown_kills_a_running_harness(tmp_path: Path) -> None:
    """A server stopped while a harness runs: the harness is killed, its episode void (the
    policy did not cause it), and the restarted server says so."""
    from palaestra.server.config import REPO_PACKS

    (tmp_path / "packs").mkdir()
    (tmp_path / "packs" / "humaneval").symlink_to(REPO_PACKS / "humaneval")
    proc = ServerProcess(tmp_path / "data", {"PALAESTRA_PACKS_DIRS": str(tmp_path / "packs")})
    # An odd duration: `pgrep` looks machine-wide, where others may sleep 300 s too.
    fake = FakeModel([bash_call("sleep 300.017")])
    with fake.serve() as url:
        proc.start()
        try:
            option = harness(url, config={"command_timeout_s": 600.0})
            assert proc.token is not None
            episode = started(proc, proc.token, TRAIN_TASK, option)
            wait_calls(proc, proc.token, episode, 1)
            proc.stop()
            proc.start()
            state = call(proc, proc.token, "GET", f"/v1/episodes/{episode}").json()
        finally:
            proc.stop()
    assert state["status"] == "void" and state["void_reason"] == "server shut down", state
    assert state["failure"]["kind"] == "server_shutdown", state["failure"]
    left = subprocess.run(["pgrep", "-f", r"sleep 300\.017"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the harness's command outlived its server"


def test_wall_limit_in_docker(docker_server: ServerProcess) -> None:
    """The docker sandbox's harness is killed at the wall limit too (its exec swept by
    `kill_all`), and the sandbox still serves the verifier."""
    token = make_token(docker_server, "train", "harness")
    fake = FakeModel([bash_call(SOLVE_2 + " && sleep 120")])
    with fake.serve() as url:
        option = harness(url, config={"command_timeout_s": 300.0})
        episode = started(docker_server, token, TRAIN_TASK, option, max_wall_s=6)
        state = finished(docker_server, token, episode)
    assert state["status"] == "done", state["void_reason"]
    assert state["verdict"]["reward"] == 1.0  # what it wrote before it was killed counts
    last = ending(state)
    assert last["truncated"] and last["info"]["harness"]["state"] == "killed"
