"""The NeMo Gym door (server/doors/nemo_gym.py) attacked on a real server over loopback:
another token's cookie, a closed session's cookie, hostile bodies (lone surrogates, huge
numbers, unhashable task indices), a tool named like a root route, a sealed task's verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import ServerProcess, server_fixture

ECHO = Path(__file__).parents[2] / "packs" / "echo"
server = server_fixture(
    packs={"echo": ECHO}, settings={"ors_sessions_per_token": 2, "max_body_bytes": 1 << 16}
)


def token(server: ServerProcess, scopes: list[str]) -> dict[str, str]:
    made = httpx.post(f"{server.url}/v1/tokens", json={"scopes": scopes}, headers=server.headers)
    assert made.status_code == 201, made.text
    return {"authorization": f"Bearer {made.json()['token']}"}


def seed_body(sid: str, task: str = "say-birch", rollout: str = "r") -> dict[str, Any]:
    return {
        "resources_session_id": sid,
        "episode_id": {"rollout_id": rollout},
        "task_id": {"taskset": "palaestra/echo", "task_id": task},
        "task_data": {},
    }


def close_body(sid: str) -> dict[str, Any]:
    return {"resources_session_id": sid, "episode_id": {"rollout_id": "r"}}


def seeded(server: ServerProcess, headers: dict[str, str], sid: str, **kw: Any) -> httpx.Client:
    http = httpx.Client(base_url=server.url, headers=headers, timeout=30)
    reply = http.post("/seed_session", json=seed_body(sid, **kw))
    assert reply.status_code == 200, reply.text
    return http


ROUTES = ["/verify", "/echo", "/nemo_gym/session", "/healthz", "/metrics", "/v1", "/openenv"]


def post(server: ServerProcess, path: str, headers: dict[str, str], **kw: Any) -> httpx.Response:
    return httpx.post(server.url + path, headers=headers, timeout=30, **kw)


def test_another_tokens_cookie_reaches_nothing(server: ServerProcess) -> None:
    """Token B holding A's cookie: every cookie route is 404 (no session of B's), a root
    route's name is no way around it, no token at all is 401; B's close of A's id is B's
    own no-op and A's session goes on."""
    a, b = token(server, ["train"]), token(server, ["train"])
    mine = seeded(server, a, "stolen")
    cookie = dict(mine.cookies)
    for path in ROUTES:
        got = post(server, path, b, json={"text": "x"}, cookies=cookie)
        assert got.status_code == 404 and "no NeMo Gym session" in got.json()["detail"], path
        assert post(server, path, {}, json={"text": "x"}, cookies=cookie).status_code == 401
    closed = post(server, "/close_session", b, json=close_body("stolen"))
    assert closed.status_code == 200
    assert mine.post("/echo", json={"text": "still mine"}).status_code == 200


def test_a_closed_sessions_cookie_steps_nothing(server: ServerProcess) -> None:
    a = token(server, ["train"])
    mine = seeded(server, a, "shut")
    cookie = dict(mine.cookies)
    assert mine.post("/close_session", json=close_body("shut")).status_code == 200
    for path in ["/echo", "/submit"]:
        got = post(server, path, a, json={"text": "x", "answer": "hcrib"}, cookies=cookie)
        assert got.status_code == 409 and "ended" in got.json()["detail"], path
    again = post(server, "/seed_session", a, json=seed_body("shut"))
    assert again.status_code == 409


def test_a_flood_of_seeds_starves_only_its_own_token(server: ServerProcess) -> None:
    a, b = token(server, ["train"]), token(server, ["train"])
    held = [seeded(server, a, f"flood-{n}") for n in range(2)]  # ors_sessions_per_token = 2
    over = post(server, "/seed_session", a, json=seed_body("flood-2"))
    assert over.status_code == 429 and "ors_sessions_per_token" in over.json()["detail"]
    assert over.headers["retry-after"]
    other = seeded(server, b, "flood-0")  # the same id, another token's: its own session
    assert other.post("/echo", json={"text": "b"}).status_code == 200
    for n, http in enumerate(held):
        assert http.post("/echo", json={"text": "a"}).status_code == 200, n


def test_a_sealed_verify_says_nothing_of_the_answer(server: ServerProcess) -> None:
    train, evals = token(server, ["train"]), token(server, ["eval"])
    refused = post(server, "/seed_session", train, json=seed_body("h", task="say-apple"))
    assert refused.status_code == 403 and "sealed" in refused.json()["detail"]
    http = seeded(server, evals, "h", task="say-apple")
    step = http.post("/submit", json={"answer": "wrong"})
    assert step.status_code == 200 and "elppa" not in step.text
    verdict = http.post("/verify", json={"responses_create_params": {}})
    assert verdict.status_code == 200 and "elppa" not in verdict.text
    assert verdict.json()["reward"] == 0.0 and verdict.json()["failure_reason"] is None


HOSTILE_ROWS = [
    b'{"verify_responses": [{"reward": 1' + b"0" * 400 + b"}]}",  # float() overflows
    b'{"verify_responses": [{"reward": 1e400}, {"reward": 1e308}, {"reward": 1e308}]}',
    b'{"verify_responses": [{"_ng_task_index": [1], "reward": 1}]}',  # unhashable
    b'{"verify_responses": [{"_ng_task_index": {"a": 1}, "reward": 1}]}',
    b'{"verify_responses": [{"failure_kind": {"a": [1]}, "reward": "x"}]}',
    b'{"verify_responses": [{"reward": 1, "x": "\\ud800"}]}',
    b'{"verify_responses": "x"}',
    b"\xff\xfe",
    b"[" * 5000 + b"]" * 5000,
]


@pytest.mark.parametrize("raw", HOSTILE_ROWS, ids=range(len(HOSTILE_ROWS)))
def test_aggregate_metrics_answers_hostile_rows_without_a_5xx(
    server: ServerProcess, raw: bytes
) -> None:
    got = post(server, "/aggregate_metrics", token(server, ["train"]), content=raw)
    assert got.status_code < 500, got.text
    if got.status_code == 200:
        assert got.json()["agent_metrics"]["mean/reward"] in (None, 1.0), got.text


@pytest.mark.parametrize(
    "raw",
    [b'{"text": "\\ud800"}', b"[1]", b'"x"', b"1e999999", b"{" * 3000, b"\x00\xff"],
)
def test_a_tool_body_of_the_wrong_kind_is_4xx(server: ServerProcess, raw: bytes) -> None:
    a = token(server, ["train"])
    http = seeded(server, a, f"body-{abs(hash(raw))}")
    got = http.post("/echo", content=raw)
    assert 400 <= got.status_code < 500, got.text
    assert http.post("/echo", json={"text": "after"}).status_code == 200


@pytest.mark.parametrize("path", ["/seed_session", "/verify", "/aggregate_metrics", "/echo"])
def test_a_huge_body_is_413_before_it_is_read(server: ServerProcess, path: str) -> None:
    a = token(server, ["train"])
    http = seeded(server, a, f"huge-{path.strip('/')}")
    got = http.post(path, content=b'{"text": "' + b"a" * (1 << 17) + b'"}')
    assert got.status_code == 413, got.text
    assert http.post("/echo", json={"text": "after"}).status_code == 200
