"""The ORS door (server/doors/ors.py) driven by the unmodified `ors-sdk` client in its own
venv against a real `palaestra serve`: discovery, sealed splits, sessions on echo and
HumanEval, per-tool rewards, stored verdicts, auth and another token's sessions."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from palaestra.sdk.models import Observation, StepResponse, ToolSpec
from palaestra.server.doors import ors
from server.test_api import canonical, longest_line
from tests.peers import peer_python, run_peer

pytestmark = pytest.mark.slow

ORS_SDK = "ors-sdk==0.1.0"
HE_TRAIN = "openai/humaneval@1.0.0:HumanEval-1"
HE_SEALED = "openai/humaneval@1.0.0:HumanEval-0"


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


def prompt_of(server: ServerProcess, task: str) -> str:
    pack, _, _ = task.partition("@")
    listed = httpx.get(
        f"{server.url}/v1/tasks", params={"pack": pack, "limit": 1000}, headers=server.headers
    ).json()
    public: dict[str, Any] = next(t for t in listed["tasks"] if t["id"] == task)["public"]
    return str(public["prompt"])


def test_ors_sdk_drives_the_door(served: ServerProcess) -> None:
    mine, other = token(served, "ors-a"), token(served, "ors-b")
    solutions = {
        HE_TRAIN: prompt_of(served, HE_TRAIN) + canonical(1),
        HE_SEALED: prompt_of(served, HE_SEALED) + "    return True\n",  # wrong: fails tests
    }
    python = peer_python("ors", ORS_SDK)
    seen = run_peer(python, "ors_client.py", served.url, mine, other, json.dumps(solutions))

    assert sorted(seen["splits"]["openai/humaneval"]) == ["heldout", "train"]
    # A sealed split lists ids and public fields only: no tests, no solution.
    heldout = seen["heldout_tasks"]
    assert len(heldout) == 33 == seen["num_heldout"]
    assert HE_SEALED in {t["id"] for t in heldout}
    assert seen["task_range"] == [t["id"] for t in heldout[:3]]
    assert all(set(t["public"]) == {"prompt", "entry_point"} for t in heldout)
    raw = json.dumps(heldout)
    assert "def check(candidate)" not in raw and "canonical_solution" not in raw
    assert longest_line(canonical(0)) not in raw
    assert set(seen["env_tools"]) == {"write_file", "run_python", "run_tests", "submit"}

    echo = seen["echo"]
    assert "birch" in echo["prompt"][0]
    assert set(echo["tools"]) == {"echo", "submit"}
    assert {t["name"] for t in echo["openai_tools"]} == {"echo", "submit"}
    assert echo["foreign"] == [404, 404, 404, 404]  # another token: as if it did not exist
    assert echo["say"]["blocks"][0]["text"] == "hello" and echo["say"]["finished"] is False
    assert echo["say"]["reward"] == 0.0
    assert "no_such_tool" in echo["bad_tool"]
    assert echo["submit"]["reward"] == 1.0 and echo["submit"]["finished"] is True
    assert echo["submit"]["metadata"]["verdict"]["passed"] is True

    train, sealed = seen["coding"][HE_TRAIN], seen["coding"][HE_SEALED]
    assert set(train["tools"]) == {"write_file", "run_python", "run_tests", "submit"}
    assert train["write"]["reward"] == 0.0 and not train["write"]["finished"]
    assert train["submit"]["reward"] == 1.0 and train["submit"]["finished"]
    assert sealed["submit"]["reward"] == 0.0 and sealed["submit"]["finished"]
    assert "withheld" in sealed["submit"]["metadata"]["verdict"]["feedback"]
    said = json.dumps(sealed["submit"])
    assert "def check(candidate)" not in said and "assert candidate" not in said
    assert longest_line(canonical(0)) not in said

    assert "Authentication failed (401)" in seen["bad_token"]
    assert "env.session(task=...)" in seen["by_index"]

    # Each session is a stored, verified episode of its owner; another token gets 404.
    for sid, passed in ((echo["sid"], True), (train["sid"], True), (sealed["sid"], False)):
        state = httpx.get(
            f"{served.url}/v1/episodes/{sid}", headers={"authorization": f"Bearer {mine}"}
        )
        assert state.status_code == 200, state.text
        body = state.json()
        assert body["status"] == "done" and body["verdict"]["passed"] is passed
        assert body["step_count"] == len(body["trajectory"]) >= 2
        assert "def check(candidate)" not in state.text
        theirs = httpx.get(
            f"{served.url}/v1/episodes/{sid}", headers={"authorization": f"Bearer {other}"}
        )
        assert theirs.status_code == 404


def test_door_refusals_in_ors_shape(served: ServerProcess) -> None:
    answer = httpx.get(
        f"{served.url}/palaestra/echo/splits",
        headers={"user-agent": "ors-sdk/0.2.0", "x-api-key": served.token or ""},
    )
    assert answer.status_code == 400
    plain = httpx.get(f"{served.url}/openai/humaneval/splits", headers=served.headers)
    assert sorted(plain.json(), key=str) == [
        {"name": "heldout", "type": "test"},  # sealed
        {"name": "train", "type": "train"},
    ]
    assert set(answer.json()) == {"detail"} and "0.2" in answer.json()["detail"]
    missing = httpx.get(f"{served.url}/palaestra/echo/splits")
    assert missing.status_code == 401 and set(missing.json()) == {"detail"}
    unknown = httpx.get(f"{served.url}/nobody/nothing/splits", headers=served.headers)
    assert unknown.status_code == 404 and "nobody/nothing" in unknown.json()["detail"]
    forged = httpx.post(
        f"{served.url}/create",
        json={"task_spec": {"instruction": "anything", "private": {"answer": "x"}}},
        headers={**served.headers, "x-session-id": "forged"},
    )
    assert forged.status_code == 400 and "task_spec.id" in forged.json()["detail"]
    made = httpx.post(
        f"{served.url}/v1/tokens",
        json={"scopes": ["train"], "name": "ors-train"},
        headers=served.headers,
    )
    sealed = httpx.post(
        f"{served.url}/create",
        json={"task_spec": {"id": HE_SEALED}, "env_name": "openai/humaneval"},
        headers={"x-api-key": made.json()["token"], "x-session-id": "s1"},
    )
    assert sealed.status_code == 403 and "'eval'" in sealed.json()["detail"]
    elsewhere = httpx.post(
        f"{served.url}/create",
        json={"task_spec": {"id": HE_SEALED}, "env_name": "palaestra/echo"},
        headers={**served.headers, "x-session-id": "s2"},
    )
    assert elsewhere.status_code == 400 and "palaestra/echo" in elsewhere.json()["detail"]


def test_answers_fit_ors_models() -> None:
    """Our tool-call answer (with an image), tools and splits, as ors-sdk's models read them."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8).decode()
    reply = StepResponse(
        observation=Observation(text="rendered", images=[png], data={"mesh": 1}),
        reward=0.25,
        terminated=True,
    )
    tools = [ToolSpec(name="render", description="draw it")]
    answers = {
        "call": ors.tool_output(reply),
        "tools": ors.tool_view(tools),
        "splits": [{"name": "heldout", "type": ors.split_type("heldout", True)}],
    }
    seen = run_peer(peer_python("ors", ORS_SDK), "ors_shapes.py", json.dumps(answers))
    assert seen.get("error") is None and seen["ok"] is True
    assert seen["blocks"] == [
        {"type": "text", "text": "rendered", "detail": None},
        {"type": "image", "data": png, "mimeType": "image/png", "detail": None},
    ]
    assert answers["call"]["output"]["reward"] == 0.25
    assert answers["call"]["output"]["metadata"]["data"] == {"mesh": 1}


def sse_end(answer: httpx.Response) -> dict[str, Any]:
    """The JSON of an ORS stream's `end` event."""
    assert answer.status_code == 200, answer.text
    events = [block.split("\r\n") for block in answer.text.split("\r\n\r\n") if block]
    ends = [lines[1].removeprefix("data: ") for lines in events if lines[0] == "event: end"]
    assert len(ends) == 1, answer.text
    ended: dict[str, Any] = json.loads(ends[0])
    return ended


def test_resumed_call_replays(served: ServerProcess) -> None:
    """A stream resumed with its task_id answers the same step again, never a second one."""
    headers = {**served.headers, "x-session-id": "resumed"}
    created = httpx.post(
        f"{served.url}/create",
        json={"task_spec": {"id": "palaestra/echo:say-birch"}, "env_name": "palaestra/echo"},
        headers=headers,
    )
    assert created.status_code == 200 and created.json() == {"sid": "resumed"}
    call = {"name": "echo", "input": {"text": "once"}, "task_id": "call-1"}
    first = sse_end(httpx.post(f"{served.url}/palaestra/echo/call", json=call, headers=headers))
    again = sse_end(httpx.post(f"{served.url}/palaestra/echo/call", json=call, headers=headers))
    assert first == again and first["output"]["blocks"][0]["text"] == "once"
    state = httpx.get(f"{served.url}/v1/episodes/resumed", headers=served.headers).json()
    assert state["step_count"] == 1 and state["status"] == "active"
    closed = httpx.post(f"{served.url}/delete", headers=headers)
    assert closed.status_code == 200
    state = httpx.get(f"{served.url}/v1/episodes/resumed", headers=served.headers).json()
    assert state["status"] == "closed"
    gone = httpx.get(f"{served.url}/palaestra/echo/task_tools", headers=headers)
    assert gone.status_code == 404 and set(gone.json()) == {"detail"}


def test_palaestra_prefixes_keep_the_contract_shape(served: ServerProcess) -> None:
    """ORS's routes sit at the root; paths under /v1 and /openenv are never an ORS
    environment, so unknown ones answer the contract's error, not ORS's."""
    for method, path, status in (
        ("POST", "/v1/tasks", 405),  # GET /v1/tasks exists
        ("GET", "/v1/nothing/tools", 404),
        ("POST", "/v1/episodes/call", 404),
        ("GET", "/openenv/x/splits", 404),
    ):
        answer = httpx.request(method, served.url + path, headers=served.headers)
        assert answer.status_code == status, (path, answer.text)
        assert set(answer.json()) == {"error"}, (path, answer.text)
