"""Attacks on harness episodes over a real `palaestra serve` (tests/conftest.py door_server):
a token without the scope, another tenant at the episode and its model route, endpoints
that point at the server itself, the metadata service or a private network, harness
names with path characters, config that tries to reach a shell."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import BIN, ServerProcess, cli_env
from tests.harness_peers import (
    TRAIN_TASK,
    call,
    finished,
    harness,
    reset,
    started,
    wait_calls,
)
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.server.test_sealed import make_token

LOOPBACK = "http://127.0.0.1:9/v1"  # never contacted: each attack is refused before


@pytest.fixture(scope="module")
def token(door_server: ServerProcess) -> str:
    return make_token(door_server, "train", "harness")


@pytest.mark.parametrize("scopes", [("train",), ("eval",), ("publish",)])
def test_a_token_without_the_harness_scope(door_server: ServerProcess, scopes: tuple[str]) -> None:
    reply = reset(door_server, make_token(door_server, *scopes), TRAIN_TASK, harness(LOOPBACK))
    assert reply.status_code == 403, reply.text
    error = reply.json()["error"]
    assert error["code"] == "missing_scope"
    assert "harness" in error["message"] or "train" in error["message"]


def test_the_harness_scope_alone_starts_no_episode(door_server: ServerProcess) -> None:
    reply = reset(door_server, make_token(door_server, "harness"), TRAIN_TASK, harness(LOOPBACK))
    assert reply.status_code == 403 and reply.json()["error"]["code"] == "missing_scope"


def test_endpoints_that_are_refused(door_server: ServerProcess, token: str) -> None:
    port = door_server.port
    forbidden = [
        f"http://127.0.0.1:{port}/v1",  # the server itself: its own routes, its admin API
        f"http://localhost:{port}/v1",
        f"http://[::1]:{port}/v1",
        "http://169.254.169.254/latest/meta-data",  # the cloud metadata service
        "http://10.0.0.7:8000/v1",
        "http://192.168.1.1/v1",
        "http://172.16.0.1:8000/v1",
        "http://127.0.0.1.nip.io:8000/v1",  # a name that resolves to loopback: not on the list
        "http://0x7f000001:8000/v1",
        "http://[::ffff:169.254.169.254]/v1",
    ]
    for url in forbidden:
        reply = reset(door_server, token, TRAIN_TASK, harness(url))
        assert reply.status_code == 403, (url, reply.text)
        assert reply.json()["error"]["code"] == "endpoint_forbidden", url
    malformed = [
        "file:///etc/passwd",
        "ftp://127.0.0.1/v1",
        "unix:///var/run/docker.sock",
        "http://user:secret@127.0.0.1:8001/v1",
        "http://127.0.0.1:8001/v1?redirect=http://169.254.169.254",
        "http:///v1",
        "http://127.0.0.1:99999/v1",
    ]
    for url in malformed:
        reply = reset(door_server, token, TRAIN_TASK, harness(url))
        assert reply.status_code == 422, (url, reply.text)


@pytest.mark.parametrize(
    "name", ["../../bin/sh", "bash-agent/../../x", "/usr/bin/python3", "bash-agent;id", "..", "."]
)
def test_harness_names_with_path_characters(
    door_server: ServerProcess, token: str, name: str
) -> None:
    reply = reset(door_server, token, TRAIN_TASK, harness(LOOPBACK, name))
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"]["code"] == "unknown_harness"


@pytest.mark.parametrize(
    "config",
    [
        {"max_turns": "1; rm -rf /"},
        {"command_timeout_s": "$(id)"},
        {"--instruction-file": "/etc/passwd"},
        {"max_turns": 5, "extra_args": ["--base-url", "http://169.254.169.254"]},
        {"max_turns": {"$ne": 1}},
        {"max_turns": True},
    ],
)
def test_config_that_tries_to_inject(
    door_server: ServerProcess, token: str, config: dict[str, object]
) -> None:
    reply = reset(door_server, token, TRAIN_TASK, harness(LOOPBACK, config=config))
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_harness" and "max_turns" in error["message"]


def test_another_tenant_cannot_reach_the_episode_or_its_model_route(
    door_server: ServerProcess, token: str
) -> None:
    other = make_token(door_server, "train", "harness")
    fake = FakeModel([bash_call("sleep 60")])
    with fake.serve() as url:
        option = harness(url, config={"command_timeout_s": 120.0})
        episode = started(door_server, token, TRAIN_TASK, option, max_wall_s=60)
        wait_calls(door_server, token, episode, 1)
        route = f"/v1/episodes/{episode}/llm/v1"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        attempts = [
            call(door_server, other, "GET", f"/v1/episodes/{episode}"),
            call(door_server, other, "POST", f"/v1/episodes/{episode}/verify"),
            call(door_server, other, "DELETE", f"/v1/episodes/{episode}"),
            call(door_server, other, "GET", f"{route}/models"),
            call(door_server, other, "POST", f"{route}/chat/completions", json=body),
        ]
        for reply in attempts:
            assert reply.status_code == 404, reply.text
            assert reply.json()["error"]["code"] == "not_found"
            assert episode not in reply.text or "unknown episode" in reply.text
        assert len(fake.requests) == 1  # the other tenant's call reached no model
        mine = call(door_server, token, "GET", f"{route}/models")  # the owner's own route
        assert mine.status_code == 200 and mine.json()["data"][0]["id"] == "tiny"
        state = call(door_server, token, "GET", f"/v1/episodes/{episode}").json()
        assert state["status"] == "active"  # the other tenant's DELETE did nothing
        assert call(door_server, token, "DELETE", f"/v1/episodes/{episode}").status_code == 204
    after = call(door_server, token, "GET", f"{route}/models")
    assert after.status_code == 404  # the session ended with its episode


def test_cli_makes_a_harness_token(door_server: ServerProcess, tmp_path: Path) -> None:
    """`palaestra token create --scope harness` on the server's data dir: the scope is
    known, and the token passes the scope check (its reset fails further on: 403 for an
    endpoint off the allow-list, not `missing_scope`)."""
    name = f"cli-harness-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(
        [str(BIN / "palaestra"), "token", "create", "--scope", "train", "--scope", "harness",
         "--name", name, "--data-dir", str(door_server.data_dir)],
        env=cli_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    cli_token = made.stdout.strip().splitlines()[-1]
    reply = reset(door_server, cli_token, TRAIN_TASK, harness("http://10.9.9.9/v1"))
    assert reply.status_code == 403 and reply.json()["error"]["code"] == "endpoint_forbidden"


# The policy's own calls from its bash tool, straight to the proxy: a lone UTF-16 surrogate
# escape, NaN and deep nesting are valid to Python's JSON parser, but the first cannot be
# stored as UTF-8, the second is no JSON (a sampling parameter of NaN is the upstream's crash)
# and the third is past what the record's serializer nests.
POLICY_CALL = (
    r"""python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:4000/v1/"""
    r"""chat/completions", b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], """
    r"""\"x\": %s}")'"""
)


@pytest.mark.parametrize(
    "value",
    [r"\"\\ud800\"", "NaN", "-Infinity", "[" * 300 + "]" * 300],
    ids=["surrogate", "nan", "infinity", "deep"],
)
def test_a_request_the_store_cannot_write_does_not_void_the_episode(
    door_server: ServerProcess, token: str, value: str
) -> None:
    """Recording a call is the server's job, so a record that fails to store is a fault,
    void, and one no client can read back loses the episode: either way a policy whose
    request did it would escape its sure 0. The proxy refuses such a request (400)."""
    fake = FakeModel([bash_call(POLICY_CALL % value), submit_call(), submit_call()])
    with fake.serve() as url:
        episode = started(door_server, token, TRAIN_TASK, harness(url), max_wall_s=60)
        state = finished(door_server, token, episode)
    assert state["status"] == "done", state["void_reason"]
    assert state["verdict"]["status"] != "void"
    assert len(fake.requests) == 2  # the harness's two calls; the policy's own reached none
