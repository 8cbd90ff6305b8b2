"""Sealed splits (DESIGN §6): private fields, hidden tests and solutions never leave the server.

Full episodes on sealed held-out tasks of openai/humaneval and palaestra/echo run over HTTP
against a real server: the oracle with the admin token, null and wrong answers with an
`eval` token, refusals for a `train` token. Every response body (errors included), the
state and trajectory, the discovery listings and every server log line are captured and
searched for each task's private data. The episodes the test drives itself never send a
private answer (the wrong answers are built not to), so any hit is a leak.
"""

from __future__ import annotations

import json
import uuid
from functools import cache
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess

from palaestra.sdk.errors import NotFoundError, PermissionDeniedError
from palaestra.sdk.http import HTTPClient, RetryPolicy
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.loader import load_pack
from tests.servers import server_fixture

HE_SEALED = ["HumanEval-0", "HumanEval-5"]
ECHO_SEALED = ["say-apple", "say-fjord"]


class Capture:
    """Every response body seen by the clients of this test, and the requests they sent."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.sent: list[str] = []

    def on_request(self, request: httpx.Request) -> None:
        self.sent.append(request.content.decode(errors="replace"))

    def on_response(self, response: httpx.Response) -> None:
        response.read()
        self.bodies.append(f"{response.status_code} {response.request.url} {response.text}")

    def client(self, url: str, token: str | None) -> HTTPClient:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        http = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=120,
            event_hooks={"request": [self.on_request], "response": [self.on_response]},
        )
        return HTTPClient(url, http=http, retry=RetryPolicy(attempts=1))

    def raw(self, url: str, token: str | None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=url,
            headers=headers,
            timeout=120,
            event_hooks={"request": [self.on_request], "response": [self.on_response]},
        )


def _tasks(pack: str, ids: list[str]) -> list[Task]:
    loaded = load_pack(REPO_PACKS / pack)
    return [loaded.tasks[i] for i in ids]


@cache
def public_corpus() -> str:
    """Every public field of both packs: what discovery may show for any task."""
    packs = [load_pack(REPO_PACKS / name) for name in ("humaneval", "echo")]
    return "\n".join(json.dumps(t.public) for p in packs for t in p.tasks.values())


def secrets_of(task: Task) -> list[str]:
    """Strings that only the task's private fields hold (in no task's public fields)."""
    public = public_corpus()
    found: list[str] = []
    if task.family == "echo":
        found.append(str(task.private["answer"]))
    else:
        for key in ("solution", "tests"):
            for line in str(task.private[key]).splitlines():
                line = line.strip()
                if len(line) >= 16 and line not in public and not line.startswith("#"):
                    found.append(line)
        found.append("def check(candidate)")
    assert len(found) >= 3 or task.family == "echo", found
    assert all(s not in public for s in found)
    return found


server = server_fixture("module", packs=["echo", "humaneval"])  # the sealed splits it probes


def make_token(server: ServerProcess, *scopes: str, name: str | None = None) -> str:
    body = {
        "scopes": list(scopes),
        "name": name or f"test-{'-'.join(scopes)}-{uuid.uuid4().hex[:6]}",
    }
    response = httpx.post(f"{server.url}/v1/tokens", json=body, headers=server.headers)
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def finish(client: HTTPClient, episode: str, action: dict[str, object], limit: int = 5) -> None:
    for _ in range(limit):
        reply = client.step(episode, action)
        if reply.terminated or reply.truncated:
            return
    raise AssertionError("the episode did not end")


WRONG_CODE = "def placeholder_wrong(*args, **kwargs):\n    return None\n"


def test_sealed_private_data_never_leaves_the_server(server: ServerProcess) -> None:
    capture = Capture()
    he_tasks = _tasks("humaneval", HE_SEALED)
    echo_tasks = _tasks("echo", ECHO_SEALED)
    tasks = he_tasks + echo_tasks
    assert all(t.sealed for t in tasks)
    eval_token = make_token(server, "eval")
    train_token = make_token(server, "train")

    with (
        capture.client(server.url, server.token) as admin,
        capture.client(server.url, eval_token) as evaluator,
        capture.client(server.url, train_token) as trainer,
    ):
        for task in tasks:
            ref = f"{task.pack}:{task.id}"
            # 1. The oracle, admin only: it scores, and its trajectory is redacted.
            oracle = admin.reset(ref, options={"oracle": True})
            finish(admin, oracle.episode_id, {"tool": "oracle"})
            assert admin.verify(oracle.episode_id).passed
            state = admin.state(oracle.episode_id)
            assert state.verdict is not None and state.verdict.reward == 1.0
            assert state.trajectory and all(
                r.action.arguments == {"oracle": True} for r in state.trajectory
            )
            # 2. An eval token may not use the oracle on a sealed split.
            with pytest.raises(PermissionDeniedError) as refused:
                evaluator.reset(ref, options={"oracle": True})
            assert "admin" in refused.value.message
            # 3. A train token may not start an episode on a sealed split at all.
            with pytest.raises(PermissionDeniedError) as refused:
                trainer.reset(ref)
            assert task.split in refused.value.message and "eval" in refused.value.message
            # 4. A null episode with the eval token.
            null = evaluator.reset(ref)
            finish(evaluator, null.episode_id, {"tool": "submit", "arguments": {}})
            verdict = evaluator.verify(null.episode_id)
            assert verdict.reward == 0.0 and not verdict.passed
            evaluator.state(null.episode_id)
            # A train token cannot read or drive it either: not its episode, so the 404 of
            # an unknown id (a 403 would tell it the id exists and is sealed).
            with pytest.raises(NotFoundError):
                trainer.state(null.episode_id)
            evaluator.close(null.episode_id)
            # 5. A wrong answer with the eval token (never the private one).
            wrong = evaluator.reset(ref)
            eid = wrong.episode_id
            if task.family == "echo":
                evaluator.step(eid, {"tool": "echo", "arguments": {"text": "x"}})
                submit: dict[str, object] = {
                    "tool": "submit",
                    "arguments": {"answer": "not-the-answer"},
                }
            else:
                write = {"path": "solution.py", "content": WRONG_CODE}
                evaluator.step(eid, {"tool": "write_file", "arguments": write})
                evaluator.step(eid, {"tool": "run_tests", "arguments": {}})
                evaluator.step(eid, {"tool": "run_python", "arguments": {"code": "print(1 + 1)"}})
                submit = {"tool": "submit", "arguments": {}}
            finish(evaluator, eid, submit)
            verdict = evaluator.verify(wrong.episode_id)
            assert not verdict.passed
            evaluator.state(wrong.episode_id)
            # A malformed action on a sealed episode: 422, the episode goes on.
            with capture.raw(server.url, eval_token) as raw:
                again = evaluator.reset(ref)
                bad = raw.post(
                    f"/v1/episodes/{again.episode_id}/step",
                    json={"action": {"tool": "no_such_tool", "arguments": {}}},
                )
                assert bad.status_code == 422
                raw.post(f"/v1/episodes/{again.episode_id}/verify")
                raw.get(f"/v1/episodes/{again.episode_id}")
            # The unknown-task error on a sealed split says nothing private.
            with pytest.raises(NotFoundError):
                evaluator.reset(f"{task.pack}:{task.id}-nope")

        # Discovery and downloads, with every token.
        for token in (server.token, eval_token, train_token):
            with capture.raw(server.url, token) as raw:
                for pack in ("openai/humaneval", "palaestra/echo"):
                    for split in ("heldout", "train", None):
                        params = {"pack": pack, "limit": 1000}
                        if split:
                            params["split"] = split
                        assert raw.get("/v1/tasks", params=params).status_code == 200
                    assert raw.get(f"/v1/packs/{pack}").status_code == 200
                    download = raw.get(f"/v1/packs/{pack}/archive")
                    if token != server.token:
                        assert download.status_code == 403, download.text
                        assert "sealed" in download.json()["error"]["message"]
                raw.get("/v1/packs")
                raw.get("/v1/families")
                raw.get("/v1/sampler")

    # What the test itself sent never held a secret (so any hit below is the server's).
    server.stop()  # flush the log
    logs = server.logs()
    assert logs.strip(), "the server wrote no log lines"
    sent = "\n".join(capture.sent)
    received = "\n".join(
        body for body in capture.bodies if "/archive" not in body or not body.startswith("200")
    )
    for task in tasks:
        for secret in secrets_of(task):
            assert secret not in sent, (task.id, secret)
            assert secret not in received, (task.id, secret)
            assert secret not in logs, (task.id, secret)
    server.start()  # the module's server, for any test after this one


def test_scopes_and_errors(server: ServerProcess) -> None:
    url = server.url
    # No token, a wrong one, a malformed header: 401 with a JSON error that says how to get one.
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic abc"}):
        for method, path in (
            ("GET", "/v1/packs"),
            ("POST", "/v1/episodes"),
            ("POST", "/v1/episodes/x/step"),
            ("GET", "/v1/tokens"),
        ):
            response = httpx.request(method, f"{url}{path}", headers=headers, json={})
            assert response.status_code == 401, (headers, path, response.text)
            error = response.json()["error"]
            assert "admin.token" in error["message"] and "token create" in error["message"]
    # The operations routes and the API description stay open.
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    train = make_token(server, "train", name="scopes-train")
    publish = make_token(server, "publish")
    as_train = {"authorization": f"Bearer {train}"}
    as_publish = {"authorization": f"Bearer {publish}"}
    # Discovery: any valid token.
    assert httpx.get(f"{url}/v1/families", headers=as_publish).status_code == 200
    # Episodes need train (or eval); publish alone is refused, naming the scope.
    refused = httpx.post(
        f"{url}/v1/episodes", json={"task": "palaestra/echo:say-birch"}, headers=as_publish
    )
    assert refused.status_code == 403 and "'train'" in refused.json()["error"]["message"]
    started = httpx.post(
        f"{url}/v1/episodes", json={"task": "palaestra/echo:say-birch"}, headers=as_train
    )
    assert started.status_code == 200
    episode = started.json()["episode_id"]
    step = httpx.post(
        f"{url}/v1/episodes/{episode}/step",
        json={"action": {"tool": "echo", "arguments": {"text": "hi"}}},
        headers=as_train,
    )
    assert step.status_code == 200 and step.json()["observation"]["text"] == "hi"
    # The step fast path checks ownership too: another token's episode is an unknown id.
    other = httpx.post(
        f"{url}/v1/episodes/{episode}/step",
        json={"action": {"tool": "echo", "arguments": {"text": "hi"}}},
        headers=as_publish,
    )
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    # Publishing and token admin: 403 naming the scope.
    denied = httpx.post(f"{url}/v1/packs", content=b"x", headers=as_train)
    assert denied.status_code == 403 and "'publish'" in denied.json()["error"]["message"]
    denied = httpx.get(f"{url}/v1/tokens", headers=as_publish)
    assert denied.status_code == 403 and "'admin'" in denied.json()["error"]["message"]
    # A token revoked over HTTP stops working at once (the cache is dropped).
    listed = httpx.get(f"{url}/v1/tokens", headers=server.headers).json()
    assert any(t["name"] == "scopes-train" for t in listed)
    assert all("token" not in t and "hash" not in t for t in listed)
    gone = httpx.delete(f"{url}/v1/tokens/scopes-train", headers=server.headers)
    assert gone.status_code == 204
    after = httpx.get(f"{url}/v1/families", headers=as_train)
    assert after.status_code == 401


def test_admin_token_file(server: ServerProcess) -> None:
    path = Path(server.data_dir) / "admin.token"
    assert path.stat().st_mode & 0o777 == 0o600
    assert server.token and server.token.startswith("pal_")
    # Only the hash is stored.
    for db in Path(server.data_dir).glob("palaestra.sqlite3*"):
        assert server.token.encode() not in db.read_bytes()
