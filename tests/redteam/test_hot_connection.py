"""server/hotconn.py: `palaestra serve` answers the step and batch routes on the connection
itself, under the app. That shorter way keeps HTTP/1.1's rules and the front door's checks,
and a request it does not take (a query string, an escaped path, a chunked body, HTTP/1.0,
`Expect: 100-continue`, a bad token, a body declared too large) gets the app's answer.

Raw sockets, so the tests choose exactly what bytes arrive and when: pipelined requests,
a body in pieces, a client gone halfway.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.server.hotconn import response
from tests.servers import REPO_PACKS, ServerProcess, serve

SLOW_MS = 1500  # the slow task's wait before each echo: longer than the header timeout
MAX_BODY = 1024 * 1024
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("hot")
    slow = base / "slow-pack"
    slow.mkdir()
    (slow / "pack.toml").write_text(
        'name = "test/slow-echo"\nversion = "0.1.0"\ndescription = "An echo that waits."\n'
        'license = "Apache-2.0"\nfamilies = ["echo"]\n\n[splits.train]\nsealed = false\n'
    )
    task = {
        "id": "wait",
        "family": "echo",
        "domain": "echo/say",
        "split": "train",
        "public": {"instruction": "Say anything.", "delay_ms": SLOW_MS},
        "private": {"answer": "x"},
    }
    (slow / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    packs = {"echo": REPO_PACKS / "echo", "slow": slow}
    settings = {"max_body_bytes": MAX_BODY, "header_timeout_s": HEADER_TIMEOUT_S}
    with serve(base, packs=packs, settings=settings) as proc:
        yield proc


def reset(server: ServerProcess, task: str = "palaestra/echo:say-birch") -> str:
    reply = httpx.post(f"{server.url}/v1/episodes", json={"task": task}, headers=server.headers)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["episode_id"])


def say(text: str) -> bytes:
    return json.dumps({"action": {"tool": "echo", "arguments": {"text": text}}}).encode()


def request(
    server: ServerProcess,
    path: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    version: str = "1.1",
    token: str | None = None,
) -> bytes:
    lines = [f"POST {path} HTTP/{version}", "host: x", "content-type: application/json"]
    lines.append(f"authorization: Bearer {server.token if token is None else token}")
    if not {"transfer-encoding", "content-length"} & (headers or {}).keys():
        lines.append(f"content-length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Reader:
    """HTTP/1.1 answers off a socket, one at a time (content-length bodies, as the server's)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed with {self.buffer[:200]!r} unread")
        self.buffer += chunk

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status_line.split()[1] == "100":  # Continue: the real answer follows
            return self.answer()
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Answer(int(status_line.split()[1]), headers, body)

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def connect(server: ServerProcess) -> tuple[socket.socket, Reader]:
    url = httpx.URL(server.url)
    sock = socket.create_connection((url.host, url.port), timeout=10)
    return sock, Reader(sock)


def state(server: ServerProcess, episode: str) -> dict[str, Any]:
    reply = httpx.get(f"{server.url}/v1/episodes/{episode}", headers=server.headers)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_pipelined_requests_are_answered_in_order(served: ServerProcess) -> None:
    """Steps, a slow step, a batch call and an app route sent in one write come back in
    the order they were sent, each once."""
    fast, slow = reset(served), reset(served, "test/slow-echo:wait")
    batch = json.dumps(
        {"items": [{"episode_id": fast, "action": {"tool": "echo", "arguments": {"text": "b"}}}]}
    ).encode()
    sock, reader = connect(served)
    with sock:
        sock.sendall(
            request(served, f"/v1/episodes/{slow}/step", say("first"))
            + request(served, f"/v1/episodes/{fast}/step", say("second"))
            + request(served, "/v1/batch/step", batch)
            + b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            + request(served, f"/v1/episodes/{fast}/step", say("third"))
        )
        answers = [reader.answer() for _ in range(5)]
    assert [a.status for a in answers] == [200] * 5, [a.body for a in answers]
    assert answers[0].json()["observation"]["text"] == "first"
    assert answers[1].json()["observation"]["text"] == "second"
    assert answers[2].json()["items"][0]["result"]["observation"]["text"] == "b"
    assert "status" in answers[3].json()  # the app's own route, between two steps
    assert answers[4].json()["observation"]["text"] == "third"
    assert state(served, fast)["step_count"] == 3 and state(served, slow)["step_count"] == 1


def test_many_pipelined_steps_in_one_write(served: ServerProcess) -> None:
    episode = reset(served)
    count = 45  # the echo task's max_steps is 50
    sock, reader = connect(served)
    with sock:
        sock.sendall(
            b"".join(
                request(served, f"/v1/episodes/{episode}/step", say(str(i))) for i in range(count)
            )
        )
        texts = [reader.answer().json()["observation"]["text"] for _ in range(count)]
    assert texts == [str(i) for i in range(count)]
    assert state(served, episode)["step_count"] == count


def test_a_body_in_pieces_is_waited_for(served: ServerProcess) -> None:
    episode = reset(served)
    whole = request(served, f"/v1/episodes/{episode}/step", say("pieces"))
    sock, reader = connect(served)
    with sock:
        cut = len(whole) - 10
        sock.sendall(whole[:cut])
        time.sleep(0.3)
        sock.sendall(whole[cut:-3])
        time.sleep(0.3)
        sock.sendall(whole[-3:])
        answer = reader.answer()
    assert answer.status == 200 and answer.json()["observation"]["text"] == "pieces"


def test_a_client_gone_halfway_runs_no_step(served: ServerProcess) -> None:
    episode = reset(served)
    whole = request(served, f"/v1/episodes/{episode}/step", say("never"))
    sock, _ = connect(served)
    with sock:
        sock.sendall(whole[:-5])
    time.sleep(0.3)
    sock, reader = connect(served)
    with sock:
        sock.sendall(request(served, f"/v1/episodes/{episode}/step", say("after")))
        assert reader.answer().json()["observation"]["text"] == "after"
    assert state(served, episode)["step_count"] == 1  # the cut step never ran


def test_a_closing_request_is_answered_then_closed(served: ServerProcess) -> None:
    episode = reset(served)
    sock, reader = connect(served)
    with sock:
        sock.sendall(
            request(
                served, f"/v1/episodes/{episode}/step", say("bye"), headers={"connection": "close"}
            )
        )
        answer = reader.answer()
        assert answer.status == 200 and answer.headers.get("connection") == "close"
        assert reader.closed()


def test_the_shorter_way_and_the_app_answer_alike(served: ServerProcess) -> None:
    """The same requests answered on the connection and (a query string sends them the
    app's way) by the app: the same status, headers and body, errors included."""
    episode = reset(served)
    cases = [
        (f"/v1/episodes/{episode}/step", say("same")),
        (f"/v1/episodes/{episode}/step", b'{"action": {"tool": "echo"'),  # malformed: 422
        (f"/v1/episodes/{episode}/step", b'{"action": {"tool": "nope", "arguments": {}}}'),
        ("/v1/episodes/no-such-episode/step", say("x")),  # 404
        ("/v1/batch/step", b'{"items": 3}'),  # a malformed envelope
        ("/v1/batch/step", json.dumps({"items": [{"episode_id": "gone", "action": {}}]}).encode()),
        (f"/v1/episodes/{episode}/step", b"[" * 200 + b"]" * 200),  # too deep for the vetting
    ]
    sock, reader = connect(served)
    with sock:
        for path, body in cases:
            sock.sendall(request(served, path, body))
            hot = reader.answer()
            sock.sendall(request(served, path + "?via=app", body))
            app = reader.answer()
            assert hot.status == app.status, (path, body, hot.body, app.body)
            assert hot.headers["content-type"] == app.headers["content-type"] == "application/json"
            assert {"date", "server"} <= hot.headers.keys()
            if hot.status == 200 and path.startswith("/v1/episodes/"):
                assert hot.json()["observation"] == app.json()["observation"]
            else:
                assert hot.json() == app.json(), (hot.body, app.body)
    assert state(served, episode)["step_count"] == 2  # "same", twice (an unknown tool is a 422)


@pytest.mark.parametrize(
    "how",
    ["escaped path", "HTTP/1.0", "expect", "chunked", "bad token", "too large"],
)
def test_requests_the_shorter_way_leaves_to_the_app(served: ServerProcess, how: str) -> None:
    episode = reset(served)
    path, body = f"/v1/episodes/{episode}/step", say(how)
    options: dict[str, Any] = {}
    expected = 200
    if how == "escaped path":
        path = path.replace("/step", "/st%65p")
    elif how == "HTTP/1.0":
        options["version"] = "1.0"
    elif how == "expect":
        options["headers"] = {"expect": "100-continue"}
    elif how == "chunked":
        options["headers"] = {"transfer-encoding": "chunked"}
        body = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    elif how == "bad token":
        options["token"] = "not-a-token"
        expected = 401
    elif how == "too large":  # the head alone: refused before a byte of the body is read
        options["headers"] = {"content-length": str(MAX_BODY + 1)}
        body = b""
        expected = 413
    sock, reader = connect(served)
    with sock:
        sock.sendall(request(served, path, body, **options))
        answer = reader.answer()
    assert answer.status == expected, answer.body
    if expected == 200:
        assert answer.json()["observation"]["text"] == how
    else:
        assert answer.json()["error"]["code"] in {"invalid_token", "too_large"}
    if how == "bad token":
        assert answer.headers["www-authenticate"].startswith("Bearer")


def test_an_idle_connection_is_closed_after_keep_alive(tmp_path: Path) -> None:
    """The guard's one timer is also uvicorn's keep-alive wait: an idle connection after
    an answer is closed after keep_alive_s, one that keeps stepping is not."""
    with serve(tmp_path, packs=["echo"], settings={"keep_alive_s": 0.5}) as server:
        episode = reset(server)
        sock, reader = connect(server)
        with sock:
            for i in range(8):  # 1.2 s of steps, each 0.15 s after the last answer
                sock.sendall(request(server, f"/v1/episodes/{episode}/step", say(str(i))))
                assert reader.answer().status == 200
                time.sleep(0.15)
            started = time.monotonic()
            sock.settimeout(5)
            assert reader.closed()
            assert time.monotonic() - started < 2.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def padded_step(server: ServerProcess, episode: str, size: int) -> bytes:
    """A step request of exactly `size` bytes, head included (its body padded with spaces)."""
    path, body = f"/v1/episodes/{episode}/step", say("pad")
    head = len(request(server, path, b"")) - 1  # without the "0" of its content-length
    length = next(n for n in range(size - head, 0, -1) if head + len(str(n)) + n == size)
    whole = request(server, path, body + b" " * (length - len(body)))
    assert len(whole) == size
    return whole


def test_requests_queued_behind_a_slow_one_are_not_read_without_bound(
    served: ServerProcess,
) -> None:
    """A tenant pipelines large steps behind a slow one and reads no answer: the server stops
    reading (as uvicorn's own pipeline does) instead of holding every body. (The first
    version resumed reading for queued requests past 64 KiB: +196 MiB on one connection.)"""
    slow, fast = reset(served, "test/slow-echo:wait"), reset(served)
    # uvloop's read size: each read brings a head and more body than uvicorn's 64 KiB mark
    one = padded_step(served, fast, 256_000)
    before = rss_mib(served.proc.pid)
    sock, _ = connect(served)
    sock.settimeout(0.5)  # a send blocked this long: the server has stopped reading
    sent = 0
    with sock:
        sock.sendall(request(served, f"/v1/episodes/{slow}/step", say("slow")))
        try:
            while sent < 400:
                sock.sendall(one)
                sent += 1
        except TimeoutError:
            pass  # the server stopped reading: the socket buffers are full
        grown = rss_mib(served.proc.pid) - before
    assert sent < 100 and grown < 32, f"{sent} requests of 250 KB taken, RSS +{grown:.0f} MiB"


def test_a_queued_request_is_authenticated_when_its_turn_comes(served: ServerProcess) -> None:
    """A token revoked while a request waits behind a slow one: that request gets the 401
    (its token was looked up when its head came; it is looked up again when it runs)."""
    made = httpx.post(
        f"{served.url}/v1/tokens",
        json={"scopes": ["train"], "name": "revoked"},
        headers=served.headers,
    )
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    tenant = {"authorization": f"Bearer {token}"}
    episodes = [
        httpx.post(f"{served.url}/v1/episodes", json={"task": task}, headers=tenant).json()[
            "episode_id"
        ]
        for task in ("test/slow-echo:wait", "palaestra/echo:say-birch")
    ]
    sock, reader = connect(served)
    with sock:
        sock.sendall(
            request(served, f"/v1/episodes/{episodes[0]}/step", say("slow"), token=token)
            + request(served, f"/v1/episodes/{episodes[1]}/step", say("late"), token=token)
        )
        time.sleep(0.3)
        gone = httpx.delete(f"{served.url}/v1/tokens/revoked", headers=served.headers)
        assert gone.status_code == 204, gone.text
        answers = [reader.answer(), reader.answer()]
    assert [a.status for a in answers] == [200, 401], [a.body for a in answers]
    assert state(served, episodes[1])["step_count"] == 0


@pytest.mark.parametrize("via", ["", "?via=app"])
def test_pipelined_steps_longer_than_the_header_timeout_are_all_answered(
    served: ServerProcess, via: str
) -> None:
    """The head timer waits for the client, not for the server: a request already in,
    queued and then run, is not a head the client owes (it closed the connection at
    header_timeout_s and lost a step's answer, both ways, before)."""
    slow = reset(served, "test/slow-echo:wait")
    sock, reader = connect(served)
    with sock:
        sock.sendall(
            b"".join(
                request(served, f"/v1/episodes/{slow}/step{via}", say(str(i))) for i in range(3)
            )
        )
        texts = [reader.answer().json()["observation"]["text"] for _ in range(3)]
    assert texts == ["0", "1", "2"]


def test_an_answer_of_any_status_is_written() -> None:
    """A status outside http.HTTPStatus still gets its status line (the first version raised
    KeyError after marking the answer begun: the connection was cut, with no 500)."""
    data = response(599, b"{}", [(b"server", b"x")], close=True)
    assert data.startswith(b"HTTP/1.1 599 \r\n") and data.endswith(b"\r\n\r\n{}")
    assert b"content-length: 2\r\n" in data and b"connection: close\r\n" in data
    assert response(200, b"[]", [], close=False).startswith(b"HTTP/1.1 200 OK\r\n")
