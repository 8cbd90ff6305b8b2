"""Requests that used to cost the server too much, or answered outside the error contract.

Before: unknown routes and wrong methods answered FastAPI's `{"detail": ...}`; a deep JSON
body sank FastAPI's `json.loads` (RecursionError: a 500) and the batch route's fallback
parser; bodies had no size bound but the pack route's; a batch over its item limit was a
generic 422; and uvicorn kept a connection that never sent a request head open forever.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conftest import ServerProcess, make_settings

from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests.servers import server_fixture

from .conftest import app_client

ECHO = "palaestra/echo:say-birch"
BODY_LIMIT = 64 * 1024
MAX_VALUES = 20_000  # a 1025-item batch (the count test) holds about 9,000


module_loop = pytest.mark.asyncio(loop_scope="module")  # the module's one manager


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    """One manager for the module (its start is most of a test's cost), small limits."""
    data = tmp_path_factory.mktemp("limits-api") / "data"
    settings = make_settings(
        data_dir=data, max_body_bytes=BODY_LIMIT, max_batch_items=8, max_json_values=MAX_VALUES
    )
    manager = build_manager(settings)
    await manager.start()
    try:
        async with app_client(manager) as client:
            yield client
    finally:
        await manager.shutdown()


def assert_contract(reply: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The reply is `{"error": {"code", "message", "retryable"}}` with `status`."""
    assert reply.status_code == status, (reply.status_code, reply.text)
    body = reply.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) >= {"code", "message", "retryable"}, error
    assert error["message"], error
    if code is not None:
        assert error["code"] == code, error
    return dict(error)


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# -- error shape on every kind of refusal -------------------------------------------------------
FRAMEWORK_ERRORS = [
    ("GET", "/nope", 404),
    ("GET", "/v1/nope", 404),
    ("POST", "/v1/episodes/x/nope", 404),
    ("PUT", "/v1/episodes", 405),
    ("DELETE", "/healthz", 405),
    ("PATCH", "/v1/packs", 405),
]


@module_loop
async def test_framework_errors_use_the_contract_shape(api: httpx.AsyncClient) -> None:
    for method, path, status in FRAMEWORK_ERRORS:
        error = assert_contract(await api.request(method, path), status)
        assert path in error["message"]
    assert "allow" in (await api.put("/v1/episodes")).headers


async def test_a_crash_in_the_front_door_is_a_500_in_the_contract_shape(
    manager: EpisodeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front door runs ahead of FastAPI's error middleware (server/app.py): its own
    failure is answered there, as the contract's 500, on the hot path and off it."""

    def broken(headers: Any) -> Any:
        raise RuntimeError("the token table is gone")

    monkeypatch.setattr(manager.services.auth, "from_headers", broken)
    async with app_client(manager) as client:
        step = {"action": {"tool": "echo", "arguments": {"text": "hi"}}}
        error = assert_contract(await client.post("/v1/episodes/x/step", json=step), 500)
        assert error["code"] == "internal" and "RuntimeError" in error["message"]
        assert_contract(await client.get("/v1/tasks"), 500, "internal")
        monkeypatch.undo()
        assert (await client.get("/v1/tasks")).status_code == 200  # nothing else broke


@module_loop
async def test_validation_errors_use_the_contract_shape(api: httpx.AsyncClient) -> None:
    assert_contract(await api.post("/v1/episodes", json={"task": 5}), 422, "invalid_request")
    assert_contract(await api.post("/v1/tokens", content=b"{nope"), 422)
    assert_contract(await api.get("/v1/tasks", params={"limit": "x"}), 422)
    assert_contract(await api.post("/v1/episodes/x/step", content=b"[]"), 422)


# -- body size ---------------------------------------------------------------------------------
@module_loop
async def test_a_body_over_the_limit_is_413(api: httpx.AsyncClient) -> None:
    big = b'{"task": "' + b"a" * (BODY_LIMIT + 10) + b'"}'

    async def chunks() -> Any:  # no Content-Length: counted while it streams
        for _ in range(4):
            yield b" " * (BODY_LIMIT // 2)

    for path in ("/v1/episodes", "/v1/episodes/x/step", "/v1/batch/step", "/v1/tokens"):
        error = assert_contract(await api.post(path, content=big), 413, "too_large")
        assert "max_body_bytes" in error["message"]
        assert_contract(await api.post(path, content=chunks()), 413, "too_large")


@module_loop
async def test_a_body_under_the_limit_still_works(api: httpx.AsyncClient) -> None:
    padded = b'{"task": "%s"}' % ECHO.encode() + b" " * (BODY_LIMIT - 100)
    reply = await api.post(
        "/v1/episodes", content=padded, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 200, reply.text


# -- JSON nesting ------------------------------------------------------------------------------
@module_loop
async def test_deep_json_is_422_not_500(api: httpx.AsyncClient) -> None:
    for path in ("/v1/episodes", "/v1/tokens", "/v1/batch/reset", "/v1/batch/step"):
        for depth in (65, 5_000, 30_000):
            error = assert_contract(await api.post(path, content=deep(depth)), 422)
            assert "64" in error["message"] or "JSON" in error["message"], error


@module_loop
async def test_deep_json_inside_an_action_is_422(api: httpx.AsyncClient) -> None:
    reset = await api.post("/v1/episodes", json={"task": ECHO})
    eid = reset.json()["episode_id"]
    body = b'{"action": {"tool": "say", "arguments": {"x": ' + deep(20_000) + b"}}}"
    assert_contract(await api.post(f"/v1/episodes/{eid}/step", content=body), 422)
    items = b'{"items": [{"episode_id": "%s", "action": {"tool": "say", "arguments": {"x": ' % (
        eid.encode()
    )
    assert_contract(await api.post("/v1/batch/step", content=items + deep(20_000) + b"}}}]}"), 422)
    # Brackets inside strings are not nesting.
    text = {"action": {"tool": "submit", "arguments": {"answer": "[" * 5000}}}
    step = await api.post(f"/v1/episodes/{eid}/step", json=text)
    assert step.status_code == 200, step.text


@module_loop
async def test_a_body_of_many_tiny_values_is_413_before_any_parse(api: httpx.AsyncClient) -> None:
    """`[0,0,0,…]` in a step's arguments: under max_body_bytes, but a parser spent a quarter
    of a second of the event loop (every tenant's) on 16 MB of them (8 million values).
    Refused by the scan (max_json_values), which runs off the event loop for a large body."""
    reset = await api.post("/v1/episodes", json={"task": ECHO})
    eid = reset.json()["episode_id"]
    values = b"[" + b"0," * MAX_VALUES + b"0]"
    body = b'{"action": {"tool": "echo", "arguments": {"junk": ' + values + b"}}}"
    error = assert_contract(await api.post(f"/v1/episodes/{eid}/step", content=body), 413)
    assert "max_json_values" in error["message"], error
    items = b'{"items": [{"episode_id": "%s", "action": {"tool": "echo", "arguments": {"x": ' % (
        eid.encode()
    )
    error = assert_contract(
        await api.post("/v1/batch/step", content=items + values + b"}}}]}"), 413
    )
    assert "max_json_values" in error["message"], error
    # As many values in one string is a string.
    text = {"action": {"tool": "echo", "arguments": {"text": "0," * MAX_VALUES}}}
    step = await api.post(f"/v1/episodes/{eid}/step", json=text)
    assert step.status_code == 200, step.text


# -- batch size --------------------------------------------------------------------------------
@module_loop
async def test_a_batch_over_max_batch_items_is_413(api: httpx.AsyncClient) -> None:
    for count in (9, 1025):
        step = {"episode_id": "e", "action": {"tool": "x", "arguments": {}}}
        reply = await api.post("/v1/batch/step", json={"items": [step] * count})
        error = assert_contract(reply, 413, "too_large")
        assert "max_batch_items" in error["message"] and "at most 8" in error["message"]
        resets = [{"task": ECHO}] * count
        assert_contract(await api.post("/v1/batch/reset", json={"items": resets}), 413)


@module_loop
async def test_lone_surrogates_are_refused_before_the_store(api: httpx.AsyncClient) -> None:
    raw = b'{"items": [{"episode_id": "\\udc00", "action": {"tool": "x", "arguments": {}}}]}'
    assert_contract(await api.post("/v1/batch/step", content=raw), 422, "invalid_request")


# -- connections and request heads (a real `palaestra serve`) ----------------------------------
guarded = server_fixture(
    "module", settings={"header_timeout_s": 1, "max_connections": 16, "max_header_bytes": 8192}
)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed `sock` within `seconds`, and what it sent before."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        return True, got
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def test_a_silent_connection_is_closed(guarded: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        closed, _ = _closed_within(sock, 5)
    assert closed, "a connection that never sent a request head stayed open"


def test_a_trickled_request_head_is_closed(guarded: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        closed = False
        for _ in range(10):  # a header line every 0.4 s: never a whole head
            try:
                sock.sendall(b"x-slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.4)
        if not closed:
            closed, _ = _closed_within(sock, 3)
        assert closed and time.monotonic() - start < 6, "slowloris kept its connection"


def test_a_kept_alive_connection_has_the_timeout_after_each_answer(
    guarded: ServerProcess,
) -> None:
    """The head timer runs again from each answer (not from the connect): requests every
    0.6 s keep a connection for 3 s of a 1 s timeout, and silence after the last answer
    closes it about a second later (before uvicorn's own keep-alive of 5 s)."""
    request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.settimeout(5)
        for _ in range(5):
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "an answer on a live connection"
            time.sleep(0.6)
        answered = time.monotonic()
        closed, _ = _closed_within(sock, 4)
        assert closed, "a connection silent after its answer stayed open"
        assert time.monotonic() - answered < 2.5


def test_an_oversized_request_head_is_431(guarded: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 20_000)
        closed, got = _closed_within(sock, 5)
    assert closed
    assert got.startswith(b"HTTP/1.1 431"), got[:200]
    assert b'"headers_too_large"' in got


def test_connections_over_the_limit_are_refused_and_others_served(
    guarded: ServerProcess,
) -> None:
    # Tenants' requests under way (authenticated, a body still to come): none of them may
    # make room for the new one (idle strangers do: tests/redteam/test_connection_abuse.py).
    held = [socket.create_connection(("127.0.0.1", guarded.port)) for _ in range(16)]
    head = (
        f"POST /v1/episodes/x/step HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {guarded.token}"
        "\r\ncontent-length: 100\r\n\r\n"
    )
    for sock in held:
        sock.sendall(head.encode())
    time.sleep(0.2)
    try:
        with socket.create_connection(("127.0.0.1", guarded.port)) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            _, got = _closed_within(extra, 5)
        assert got.startswith(b"HTTP/1.1 429"), got[:200]
        assert b'"capacity"' in got and b"retry-after: 1" in got.lower()
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # once they are gone, everyone is served again
        try:
            if httpx.get(f"{guarded.url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not recover its connections"
        time.sleep(0.1)
    ok = httpx.get(f"{guarded.url}/readyz", timeout=5)
    assert ok.status_code == 200, ok.text
