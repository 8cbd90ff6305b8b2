"""Restarting the server on the same data dir: finished episodes survive whole, episodes
left active become `void`, and a finished episode's writes survive even a SIGKILL."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from palaestra.sdk.errors import ConflictError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import EpisodeState, StepResponse
from tests.servers import packs_dir, settings_env

pytestmark = pytest.mark.slow

ECHO = "palaestra/echo:say-birch"
HE_TRAIN = "openai/humaneval:HumanEval-1"
HE_TRUNCATE = "openai/humaneval:HumanEval-2"


def server_on(data: Path) -> ServerProcess:
    """A server on `data` serving the two packs these tests play (a start reads no other)."""
    packs = packs_dir(data.parent, ["echo", "humaneval"])
    return ServerProcess(data, settings_env({"packs_dirs": [packs]}))


def kill(proc: ServerProcess) -> None:
    """SIGKILL: no shutdown hook, no final flush."""
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait(timeout=10)
    proc.proc = None


def stored_view(state: EpisodeState) -> dict[str, Any]:
    """Everything the store must keep of an episode (timings are rounded, so excluded)."""
    return state.model_dump(mode="json", exclude={"timings", "updated_at"})


def run_finished(client: HTTPClient) -> dict[str, tuple[EpisodeState, StepResponse]]:
    """Two complete episodes, each with a request id on every step."""
    out: dict[str, tuple[EpisodeState, StepResponse]] = {}
    echo = client.reset(ECHO).episode_id
    client.step(echo, {"tool": "echo", "arguments": {"text": "hi"}}, request_id="e-0")
    final = client.step(
        echo, {"tool": "submit", "arguments": {"answer": "hcrib"}}, request_id="e-1"
    )
    out[echo] = (client.state(echo), final)
    coding = client.reset(HE_TRAIN, options={"oracle": True}).episode_id
    client.step(coding, {"tool": "oracle"}, request_id="c-0")
    client.step(coding, {"tool": "run_tests"}, request_id="c-1")
    final = client.step(coding, {"tool": "oracle"}, request_id="c-2")
    out[coding] = (client.state(coding), final)
    return out


def test_restart_after_graceful_stop(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = server_on(data).start()
    try:
        with first.client() as client:
            finished = run_finished(client)
            active = client.reset(HE_TRUNCATE).episode_id
            client.step(
                active,
                {
                    "tool": "write_file",
                    "arguments": {"path": "solution.py", "content": "def f():\n    pass\n"},
                },
                request_id="a-0",
            )
            written = client.step(
                active,
                {"tool": "run_python", "arguments": {"code": "print(6 * 7)"}},
                request_id="a-1",
            )
            assert "42" in written.observation.text
            active_before = client.state(active)
    finally:
        first.stop(signal.SIGINT)

    second = server_on(data).start()
    assert second.port != first.port
    try:
        with second.client() as client:
            for episode, (before, final) in finished.items():
                after = client.state(episode)
                assert after.status == "done" and after.verdict is not None
                assert after.verdict.passed and after.verdict.reward == 1.0
                assert after.step_count == before.step_count == len(after.trajectory)
                assert stored_view(after) == stored_view(before), episode
                assert [r.action for r in after.trajectory] == [r.action for r in before.trajectory]
                assert [r.observation for r in after.trajectory] == [
                    r.observation for r in before.trajectory
                ]
                # The stored verdict is returned, and requests already answered replay.
                assert client.verify(episode) == before.verdict
                replay = client.step(episode, {"tool": "submit"}, request_id=final_id(before))
                assert replay == final
                with pytest.raises(ConflictError):
                    client.step(episode, {"tool": "submit"}, request_id="new")

            after = client.state(active)
            assert after.status == "void"
            assert after.void_reason is not None
            assert re.search(r"restart|shut ?down", after.void_reason), after.void_reason
            assert after.ended_at is not None
            # Its trajectory up to the stop is kept.
            assert after.step_count == len(after.trajectory) == 2
            assert [r.observation for r in after.trajectory] == [
                r.observation for r in active_before.trajectory
            ]
            with pytest.raises(ConflictError):
                client.step(active, {"tool": "submit"})
            response = httpx.post(
                f"{second.url}/v1/episodes/{active}/step",
                json={"action": {"tool": "submit"}},
                headers=second.headers,
            )
            assert response.status_code == 409
            assert response.json()["error"]["code"] == "episode_ended"
            # The new server serves new episodes as usual.
            fresh = client.reset(ECHO).episode_id
            done = client.step(fresh, {"tool": "submit", "arguments": {"answer": "hcrib"}})
            assert done.reward == 1.0
    finally:
        second.stop()
    assert "Traceback" not in first.logs() + second.logs()


def final_id(state: EpisodeState) -> str:
    request_id = state.trajectory[-1].request_id
    assert request_id is not None
    return request_id


def test_sigkill_right_after_episode_end(tmp_path: Path) -> None:
    """A client that saw an episode end must find it whole after a crash: the final
    reply is only sent once the episode is on disk (the store batches writes)."""
    data = tmp_path / "data"
    rounds = 4
    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for _ in range(rounds):
        proc = server_on(data).start()
        url = proc.url
        with httpx.Client(base_url=url, headers=proc.headers) as raw:
            episode = raw.post("/v1/episodes", json={"task": ECHO}).json()["episode_id"]
            step = {"action": {"tool": "echo", "arguments": {"text": "a"}}, "request_id": "s-0"}
            assert raw.post(f"/v1/episodes/{episode}/step", json=step).status_code == 200
            body = {
                "action": {"tool": "submit", "arguments": {"answer": "hcrib"}},
                "request_id": "s-1",
            }
            final = raw.post(f"/v1/episodes/{episode}/step", json=body)
        kill(proc)  # at once, with the final reply just received
        assert final.status_code == 200 and final.json()["terminated"]
        seen.append((episode, final.json(), body))

    survivor = server_on(data).start()
    try:
        with httpx.Client(base_url=survivor.url, headers=survivor.headers) as raw:
            for episode, final, body in seen:
                state = raw.get(f"/v1/episodes/{episode}").json()
                summary = (state["status"], state["step_count"], len(state["trajectory"]))
                assert summary == ("done", 2, 2), (episode, summary, state["void_reason"])
                assert state["verdict"] is not None and state["verdict"]["reward"] == 1.0
                assert state["trajectory"][1]["action"] == body["action"]
                replay = raw.post(f"/v1/episodes/{episode}/step", json=body)
                assert replay.status_code == 200 and replay.json() == final
    finally:
        survivor.stop()


def test_sigkill_voids_active_episode(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = server_on(data).start()
    with proc.client() as client:
        episode = client.reset(HE_TRAIN).episode_id
    kill(proc)
    survivor = server_on(data).start()
    try:
        with survivor.client() as client:
            state = client.state(episode)
            assert state.status == "void"
            assert state.void_reason is not None and "restart" in state.void_reason
            with pytest.raises(ConflictError):
                client.step(episode, {"tool": "submit"})
    finally:
        survivor.stop()
