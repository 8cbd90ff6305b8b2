"""One tenant cannot slow, fill or evict another through its connections (issue 34).

Before: the slowloris guard (server/guards.py) closed every connection that sent no new
request head within header_timeout_s, WebSockets included (after the upgrade the HTTP
protocol sees no more requests), so an OpenEnv `/ws` session was cut a few seconds in even
while it stepped; and one client holding sockets that never sent a request could fill
max_connections, so every new connection, an authenticated trainer's too, got the 429.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import ServerProcess
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.servers import server_fixture

ECHO = "palaestra/echo:say-birch"
SAY = {"tool": "echo", "arguments": {"text": "hi"}}
HEADER_TIMEOUT_S = 1.0
IDLE_TTL_S = 3.0
PER_CLIENT = 4  # max_unauthenticated_per_client
MOST = 16  # max_connections (its least)
# What a hostile socket sends: nothing, part of a head, a head and part of its body.
HOLDS = [
    b"",
    b"GET /healthz HTTP/1.1\r\nhost: x\r\n",
    b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 99\r\n\r\n{",
]

sessions = server_fixture(
    "module",
    packs=["echo"],
    settings={
        "header_timeout_s": HEADER_TIMEOUT_S,
        "idle_ttl_s": IDLE_TTL_S,
        "reaper_interval_s": 0.5,
    },
)
crowded = server_fixture(
    "module",
    packs=["echo"],
    settings={
        "header_timeout_s": 30,  # the attacker's sockets outlive each test: only the caps act
        "max_connections": MOST,
        "max_unauthenticated_per_client": PER_CLIENT,
    },
)


# -- WebSocket sessions live as long as they are used -------------------------------------------
def ws_session(server: ServerProcess) -> ClientConnection:
    url = server.url.replace("http://", "ws://") + "/openenv/palaestra/echo/ws"
    return connect(url, additional_headers={"authorization": f"Bearer {server.token}"})


def frame(ws: ClientConnection, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps({"type": kind, "data": data}))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=10))
    assert answer["type"] == "observation", answer
    return answer


def test_a_websocket_in_use_outlives_the_header_timeout(sessions: ServerProcess) -> None:
    with ws_session(sessions) as ws:
        frame(ws, "reset", {"task": "say-birch"})
        start = time.monotonic()
        steps = 0
        while time.monotonic() - start < 3.5 * HEADER_TIMEOUT_S:
            try:
                stepped = frame(ws, "step", SAY)
            except ConnectionClosed as exc:
                elapsed = time.monotonic() - start
                pytest.fail(f"a stepping session was cut after {elapsed:.1f} s: {exc}")
            steps += 1
            if stepped["data"]["done"]:
                frame(ws, "reset", {"task": "say-birch"})
            time.sleep(0.2)
        assert steps >= 5


def test_an_idle_websocket_ends_at_idle_ttl_not_a_fixed_timer(sessions: ServerProcess) -> None:
    with ws_session(sessions) as ws:
        frame(ws, "reset", {"task": "say-birch"})
        start = time.monotonic()
        with pytest.raises(TimeoutError):  # past header_timeout_s and still open
            ws.recv(timeout=2 * HEADER_TIMEOUT_S)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=3 * IDLE_TTL_S)
        elapsed = time.monotonic() - start
    assert IDLE_TTL_S - 0.5 <= elapsed <= 2.5 * IDLE_TTL_S, elapsed
    assert closed.value.rcvd is not None and "idle_ttl_s" in closed.value.rcvd.reason


# -- connections: strangers are capped per client and evicted when the server is full -----------
def hostile(server: ServerProcess, source: str, head: bytes = b"") -> socket.socket:
    """A raw connection from the loopback address `source` that sends `head` and no more."""
    sock = socket.create_connection(("127.0.0.1", server.port), source_address=(source, 0))
    if head:
        sock.sendall(head)
    return sock


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (without waiting for it to)."""
    sock.settimeout(0.01)
    try:
        return sock.recv(65536) == b""  # a refusal's 429, if any, would come first
    except TimeoutError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def wait_closed(socks: list[socket.socket], count: int, within_s: float) -> list[bool]:
    """Which of `socks` the server closed, once `count` of them are (or `within_s` passed)."""
    deadline = time.monotonic() + within_s
    state = [False] * len(socks)
    while True:
        state = [done or closed(sock) for done, sock in zip(state, socks, strict=True)]
        if sum(state) >= count or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()
        time.sleep(0.3)  # the server sees them go before the next test counts


def test_strangers_over_the_per_client_cap_are_closed_early(
    crowded: ServerProcess, held: list[socket.socket]
) -> None:
    extra = 6
    start = time.monotonic()
    for i in range(PER_CLIENT + extra):
        held.append(hostile(crowded, "127.0.0.2", HOLDS[i % len(HOLDS)]))
        time.sleep(0.02)  # in order: the oldest go first
    state = wait_closed(held, extra, within_s=3)
    assert time.monotonic() - start < 5  # header_timeout_s is 30
    assert state == [True] * extra + [False] * PER_CLIENT, state
    # Another address is not this one's business: its strangers stay.
    other = [hostile(crowded, "127.0.0.3") for _ in range(PER_CLIENT)]
    held.extend(other)
    time.sleep(0.3)
    assert not any(closed(sock) for sock in other)


def test_a_slow_reader_is_a_stranger_too(crowded: ServerProcess, held: list[socket.socket]) -> None:
    """Answers it never reads (a tiny receive buffer, many pipelined requests) hold a
    connection as a silent one does: the server waits on it, so it may be evicted, and
    the answer it was sent is dropped rather than flushed to it forever."""
    heads = b"GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n" * 200
    for _ in range(PER_CLIENT):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind(("127.0.0.6", 0))
        sock.connect(("127.0.0.1", crowded.port))
        sock.sendall(heads)
        held.append(sock)
    time.sleep(1.0)  # each answer stalls on a full buffer
    held.append(hostile(crowded, "127.0.0.6"))
    oldest = held[0]
    oldest.settimeout(5)
    ended = False
    try:
        while oldest.recv(1 << 20):  # what was under way, then the end
            pass
        ended = True
    except ConnectionResetError:
        ended = True
    except TimeoutError:
        pass
    assert ended, "a stranger that reads nothing held its place"


def test_a_full_server_still_serves_an_authenticated_tenant(
    crowded: ServerProcess, held: list[socket.socket]
) -> None:
    sources = [f"127.0.0.{i}" for i in range(2, 2 + MOST // PER_CLIENT)]
    for i in range(MOST):  # every connection the server allows, none authenticated
        held.append(hostile(crowded, sources[i % len(sources)], HOLDS[i % len(HOLDS)]))
    time.sleep(0.3)
    stop = threading.Event()

    def churn() -> None:  # the attacker keeps opening while the tenant works
        i = 0
        while not stop.is_set():
            held.append(hostile(crowded, sources[i % len(sources)], HOLDS[i % len(HOLDS)]))
            i += 1
            time.sleep(0.01)

    attacker = threading.Thread(target=churn, daemon=True)
    attacker.start()
    try:
        with httpx.Client(base_url=crowded.url, headers=crowded.headers, timeout=5) as tenant:
            start = time.monotonic()
            reset = tenant.post("/v1/episodes", json={"task": ECHO})
            assert reset.status_code == 200, reset.text
            episode = reset.json()["episode_id"]
            for _ in range(10):
                step = tenant.post(f"/v1/episodes/{episode}/step", json={"action": SAY})
                assert step.status_code == 200, step.text
                if step.json()["terminated"] or step.json()["truncated"]:
                    break
            assert time.monotonic() - start < 3
    finally:
        stop.set()
        attacker.join()
    assert sum(closed(sock) for sock in held[:MOST]) >= 1  # room was made from strangers
