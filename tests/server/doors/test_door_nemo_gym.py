"""The NeMo Gym door (server/doors/nemo_gym.py) driven by the `nemo-gym` package's own
client, models, session conformance check, Environment Server and Simple Agent, in their
venv (scripts/nemo-gym-venv.sh), against a real `palaestra serve` (`palaestra conformance`
on it: tests/cli/test_conformance.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess
from docblocks import blocks

from tests.peers import run_peer
from tests.peers.nemo_gym_venv import nemo_gym_python

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def token(server: ServerProcess, name: str) -> str:
    made = httpx.post(
        f"{server.url}/v1/tokens",
        json={"scopes": ["train", "eval"], "name": name},
        headers=server.headers,
    )
    assert made.status_code == 201, made.text
    value: str = made.json()["token"]
    return value


@pytest.fixture(scope="module")
def nemo_python() -> Path:
    return nemo_gym_python()


def test_the_documented_example_runs_as_written(
    served: ServerProcess, nemo_python: Path, tmp_path: Path
) -> None:
    example = [b for b in blocks("integrations.md") if b.arg == "nemo_gym_example.py"]
    assert len(example) == 1, "docs/integrations.md: the NeMo Gym example block is gone"
    (tmp_path / "nemo_gym_example.py").write_text(example[0].body)
    ran = subprocess.run(
        [str(nemo_python), str(tmp_path / "nemo_gym_example.py"), served.url, token(served, "doc")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines()[1:] == ["1.0", "1.0"], ran.stdout
    assert "birch" in ran.stdout.splitlines()[0]


def test_nemo_gyms_own_environment_server_runs_an_episode(
    served: ServerProcess, nemo_python: Path
) -> None:
    """NeMo Gym's single-agent-turn Environment Server and Simple Agent, unmodified, run an
    echo episode through the door (only the model is a stand-in): seed, a direct-HTTP tool
    call with the seed's cookie, verify, close."""
    mine = token(served, "nemo-e2e")
    seen = run_peer(nemo_python, "nemo_gym_episode.py", served.url, mine)
    assert seen["failure"] is None, seen["failure"]
    result = seen["result"]
    assert (result["reward"], result["mask_sample"], result["failure_kind"]) == (1.0, False, None)
    calls = [o for o in result["response"]["output"] if o["type"] == "function_call_output"]
    assert len(calls) == 1 and '"output":"submitted"' in calls[0]["output"]
    episode = result["palaestra"]["episode_id"]
    state = httpx.get(
        f"{served.url}/v1/episodes/{episode}", headers={"Authorization": f"Bearer {mine}"}
    ).json()
    assert state["status"] == "done" and state["step_count"] == 1
    aggregate = seen["aggregate"]  # NeMo Gym's /aggregate_metrics, forwarded to the door
    assert aggregate["agent_metrics"] == {"mean/reward": 1.0, "num_samples": 1, "num_masked": 0}
    assert aggregate["group_level_metrics"][0]["_ng_task_index"] == 0


def test_nemo_gym_client_drives_the_door(served: ServerProcess, nemo_python: Path) -> None:
    mine, other = token(served, "nemo-a"), token(served, "nemo-b")
    seen = run_peer(nemo_python, "nemo_gym_client.py", served.url, mine, other)

    right = seen["right"]
    assert right["cookie_names"] == ["palaestra_nemo_gym"]  # the Environment Server needs one
    episode = right["view"]["episode_id"]
    assert right["seed"]["resources_tools"]["url_path"] == f"/v1/episodes/{episode}/mcp"
    assert "birch" in right["view"]["observation"]["text"]
    assert {t["name"] for t in right["view"]["tools"]} == {"echo", "submit"}
    echoed = {"output": "hello", "images": [], "data": {}, "reward": 0.0}
    assert right["echo"] == [200, {**echoed, "terminated": False, "truncated": False, "info": {}}]
    status, said = right["bad_tool"]
    assert status == 422 and "no_such_tool" in said["detail"]  # the episode goes on
    assert right["submit"][0] == 200 and right["submit"][1]["terminated"] is True
    verdict = {"reward": 1.0, "mask_sample": False, "failure_kind": None, "failure_reason": None}
    assert right["verify"] == verdict
    assert seen["wrong"]["reward"] == 0.0 and seen["wrong"]["mask_sample"] is False
    assert seen["wrong"]["failure_kind"] is None  # a scored 0: NeMo Gym names no failure
    # another token: its cookie names nothing; its close of our id is a close of one it
    # never seeded (NeMo Gym's contract: 200, no effect) and our session lives on
    assert right["foreign_tool"][0] == 404 and right["foreign_verify"][0] == 404
    assert right["foreign_close"][0] == 200 and right["after_foreign_close"] == 200
    assert right["closes"] == [200, 200]
    assert right["seed_after_close"][0] == 409

    bad = seen["bad"]
    for name in ("verify_no_cookie", "verify_unknown", "tool_unknown"):
        assert bad[name][0] == 404 and "seed_session" in bad[name][1]["detail"], name
    for name in ("close_bad_body", "seed_bad_body"):
        assert bad[name][0] == 422 and "detail" in bad[name][1], name
    assert bad["no_token"][0] == 401
    assert seen["conformance"] == "passed"  # nemo_gym.testing.session_conformance


def test_a_post_without_the_cookie_is_no_route(served: ServerProcess) -> None:
    """The door's `POST /{tool}` is NeMo Gym's only with its session cookie: elsewhere an
    unknown route is the contract's 404, and a route of another method 405."""
    missing = httpx.post(f"{served.url}/no-such-route", headers=served.headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert httpx.post(f"{served.url}/healthz", headers=served.headers).status_code == 405
    nan = b'{"verify_responses": [{"reward": NaN}]}'  # Python's parser takes it; JSON does not
    refused = httpx.post(f"{served.url}/aggregate_metrics", content=nan, headers=served.headers)
    assert refused.status_code == 400 and "not JSON" in refused.json()["detail"]
