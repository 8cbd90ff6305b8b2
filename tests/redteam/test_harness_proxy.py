"""Attacks on the session model proxy (server/harness/): a hostile harness inside the
sandbox speaks to the gateway, a hostile tenant to `/v1/episodes/{id}/llm/…`.

The proxy must reach the endpoint named at reset and nothing else: not a URL in the body,
not an absolute request target or a Host header, not a `..` path, not a redirect the
upstream answers. Two FAKE upstreams (tests/harness_fakes.py) stand for the named
endpoint and a decoy; the decoy must never be hit. The gateway must bound what a
connection may cost (huge bodies, slowloris heads, too many connections), and a session
must answer only its episode's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from palaestra.sdk.errors import UnavailableError
from palaestra.sdk.harness import LlmCall
from palaestra.server.harness.proxy import LlmSession, SessionProxy
from palaestra.server.harness.runner import HarnessRunner
from palaestra.server.manager import EpisodeManager
from tests.conftest import make_settings
from tests.harness_fakes import FakeUpstream, gateway_on_loopback, options
from tests.hosts import local_host
from tests.redteam.tenants import client, tenant

USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def decoy() -> Iterator[FakeUpstream]:
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def named(decoy: FakeUpstream) -> Iterator[FakeUpstream]:
    with FakeUpstream(redirect_to=f"{decoy.url}/ok/chat/completions") as upstream:
        yield upstream


@asynccontextmanager
async def sandbox_gateway(
    endpoint: str, **settings: Any
) -> AsyncIterator[tuple[LlmSession, str, list[LlmCall]]]:
    """A session on `endpoint` and the gateway listener a sandbox would reach."""
    proxy = SessionProxy(make_settings(**settings))
    calls: list[LlmCall] = []
    session = proxy.open(
        "ep", options(endpoint), owner="tok", max_calls=50, max_tokens=1000, on_call=calls.append
    )
    try:
        async with gateway_on_loopback(proxy, "ep") as url:
            yield session, url, calls
    finally:
        await proxy.aclose()


async def raw_exchange(url: str, data: bytes, read_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection to the gateway; what comes back until it closes."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(data)
    await w.drain()
    try:
        return await asyncio.wait_for(r.read(), read_s)
    finally:
        w.close()


async def drip(url: str, seconds: float) -> tuple[bytes, float]:
    """A slowloris head: one header line every 0.1 s for up to `seconds`; what the gateway
    answered and when it closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\n")
    got = b""
    for k in range(int(seconds / 0.1)):
        try:
            w.write(b"x-slow: %d\r\n" % k)
            await w.drain()
            data = await asyncio.wait_for(r.read(4096), 0.1)
        except TimeoutError:
            continue
        except (ConnectionError, OSError):
            break
        if not data:
            break
        got += data
    w.close()
    return got, time.monotonic() - started


def request(target: str, body: bytes = b'{"messages": []}', host: str = "x") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


async def test_urls_in_the_body_and_headers_are_not_followed(
    named: FakeUpstream, decoy: FakeUpstream
) -> None:
    before = len(named.hits)
    elsewhere = f"{decoy.url}/ok"
    body = {
        "messages": USER,
        **{k: elsewhere for k in ("base_url", "api_base", "model_endpoint", "url", "endpoint")},
        "extra_body": {"base_url": elsewhere},
    }
    headers = {"x-forwarded-host": decoy.url[7:], "forwarded": f"host={decoy.url[7:]}",
               "host": decoy.url[7:], "x-original-url": elsewhere}  # fmt: skip
    async with sandbox_gateway(f"{named.url}/ok") as (_, url, _calls):
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.post(CHAT, json=body, headers=headers)
        assert reply.status_code == 200, reply.text
    assert decoy.hits == []
    [hit] = named.hits[before:]
    assert hit.path == "/ok/chat/completions"
    # Nothing of the harness's headers reaches the upstream (its bearer token included).
    assert "x-forwarded-host" not in hit.headers and "authorization" not in hit.headers


async def test_absolute_targets_host_headers_and_dot_paths(
    named: FakeUpstream, decoy: FakeUpstream
) -> None:
    before = len(named.hits)
    async with sandbox_gateway(f"{named.url}/ok") as (_, url, _calls):
        absolute = await raw_exchange(url, request(f"{decoy.url}/ok/chat/completions"))
        assert absolute.startswith(b"HTTP/1.1 400") and b"origin-form" in absolute
        for target in (
            "/v1/../ok/chat/completions",
            "/v1/chat/completions/../../../admin",
            "/../../etc/passwd",
            "/%2e%2e/v1/chat/completions",
            f"//{decoy.url[7:]}/ok/chat/completions",
            "/v1/chat/completions%2f..%2f..",
        ):
            answer = await raw_exchange(url, request(target))
            assert answer.startswith(b"HTTP/1.1 404"), (target, answer[:200])
        assert len(named.hits) == before  # none of those reached even the named endpoint
        hosted = await raw_exchange(url, request(CHAT, b'{"messages": []}', decoy.url[7:]))
        assert hosted.startswith(b"HTTP/1.1 200")
    assert decoy.hits == []
    assert [h.path for h in named.hits[before:]] == ["/ok/chat/completions"]


async def test_redirects_are_not_followed(named: FakeUpstream, decoy: FakeUpstream) -> None:
    async with sandbox_gateway(f"{named.url}/redirect") as (session, url, _calls):
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.post(CHAT, json={"messages": USER})
        assert reply.status_code == 502
        assert session.fault is not None and "redirect" in session.fault
    assert decoy.hits == []


async def test_huge_bodies_are_refused(named: FakeUpstream) -> None:
    before = len(named.hits)
    async with sandbox_gateway(f"{named.url}/ok", llm_max_request_kb=1) as (session, url, _):
        declared = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\ncontent-length: {1 << 30}\r\n\r\n".encode()
        answer = await raw_exchange(url, declared)  # refused before a byte of body is sent
        assert answer.startswith(b"HTTP/1.1 413") and b"llm_max_request_kb" in answer
        chunk = b"x" * 4096
        chunked = (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n".encode()
            + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
        )  # fmt: skip
        answer = await raw_exchange(url, chunked)
        assert answer.startswith(b"HTTP/1.1 413")
        direct = await session.handle("POST", CHAT, b" " * 2048)  # the /llm/ route's way in
        assert direct.status == 413
        head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nx-pad: {'a' * 70_000}\r\n\r\n".encode()
        answer = await raw_exchange(url, head)
        assert answer.startswith(b"HTTP/1.1 431")
    assert len(named.hits) == before and session.calls == 0


async def test_slowloris_and_connection_floods(named: FakeUpstream) -> None:
    fast = {"header_timeout_s": 0.5, "keep_alive_s": 0.5}
    async with sandbox_gateway(f"{named.url}/ok", **fast) as (_, url, _calls):
        got, took = await drip(url, 4.0)
        assert got.startswith(b"HTTP/1.1 408") and took < 2.0
        host, port = url.removeprefix("http://").split(":")
        silent = [await asyncio.open_connection(host, int(port)) for _ in range(64)]
        r65, w65 = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(r65.read(), 2.0) == b""  # the 65th is closed at once
        for r_, w_ in silent:  # and the silent ones are closed by the head timeout
            assert await asyncio.wait_for(r_.read(), 2.0) == b""
            w_.close()
        w65.close()
        # Keep-alive: an idle connection after a request is closed after keep_alive_s.
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        await w.drain()
        first = await asyncio.wait_for(r.readuntil(b"}]}"), 2.0)
        assert first.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(r.read(), 2.0) == b""
        w.close()


# ---- the route: only the episode's owner --------------------------------------------------
async def test_the_route_serves_only_the_owner(
    manager: EpisodeManager, named: FakeUpstream
) -> None:
    proxy = SessionProxy(manager.settings)
    manager.services.sessions = proxy
    owner = tenant(manager, ["train"])
    other = tenant(manager, ["train"])
    admin_token = (manager.settings.data_dir / "admin.token").read_text().strip()
    admin = client(manager, admin_token)
    calls: list[LlmCall] = []
    scoped, server_made = f"{owner.token_id}:mine", "0" * 32
    for key in (scoped, server_made):
        proxy.open(key, options(f"{named.url}/ok"), owner=owner.token_id, max_calls=9,
                   max_tokens=99, on_call=calls.append)  # fmt: skip
    before = len(named.hits)
    path = "/v1/episodes/{}/llm/v1/chat/completions"
    try:
        for episode in ("mine", server_made):
            ok = await owner.http.post(path.format(episode), json={"messages": USER})
            assert ok.status_code == 200, ok.text
            assert ok.json()["choices"][0]["message"]["content"] == "fake says hi"
        models = await owner.http.get("/v1/episodes/mine/llm/v1/models")
        assert models.json()["data"][0]["id"] == "fake"
        assert len(calls) == 2 and len(named.hits) == before + 2

        unknown = await other.http.get("/v1/episodes/mine")
        for who in (other.http, admin):
            for episode in ("mine", scoped, server_made):
                refused = await who.post(path.format(episode), json={"messages": USER})
                assert refused.status_code == 404
                assert refused.json()["error"]["code"] == unknown.json()["error"]["code"]
                message = refused.json()["error"]["message"].replace(episode, "<id>")
                assert message == unknown.json()["error"]["message"].replace("mine", "<id>")
        anonymous = await named_client(manager).post(path.format("mine"), json={})
        assert anonymous.status_code == 401 and "error" in anonymous.json()
        assert len(calls) == 2 and len(named.hits) == before + 2
    finally:
        for c in (owner.http, other.http, admin):
            await c.aclose()
        manager.services.sessions = None
        await proxy.aclose()


def named_client(manager: EpisodeManager) -> httpx.AsyncClient:
    """A client of the app with no token at all."""
    anonymous = client(manager, "")
    del anonymous.headers["authorization"]
    return anonymous


async def test_many_connections_cannot_make_the_server_hold_many_bodies(
    named: FakeUpstream,
) -> None:
    """64 connections each sending a body just under llm_max_request_kb (8 MiB, a few
    hundred MB once parsed into small objects) would make one sandbox hold gigabytes in
    the server: the bodies a sandbox's requests hold at once are bounded to two requests'
    worth, the rest refused with 429; once they end, calls go through again."""
    cap_kb = 64
    size = cap_kb * 1024 - 16
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\ncontent-length: {size}\r\n\r\n".encode()
    async with sandbox_gateway(f"{named.url}/ok", llm_max_request_kb=cap_kb) as (
        session, url, _calls,
    ):  # fmt: skip
        host, port = url.removeprefix("http://").split(":")
        held = []
        for _ in range(6):  # every body but its last byte: none is complete
            r, w = await asyncio.open_connection(host, int(port))
            w.write(head + b" " * (size - 1))
            await w.drain()
            held.append((r, w))
        answers = []
        for r, _w in held:
            try:
                answers.append(await asyncio.wait_for(r.read(), 0.5))
            except TimeoutError:
                answers.append(b"")  # still held: the gateway waits for its last byte
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 429")]
        assert len(refused) >= 4, [a[:60] for a in answers]
        assert b"llm_max_request_kb" in refused[0]
        for _r, w in held:
            w.close()
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.post(CHAT, json={"messages": USER})
        assert reply.status_code == 200, reply.text
        assert session.calls == 1


async def test_a_stream_of_malformed_bodies_is_bounded(named: FakeUpstream) -> None:
    """A body is parsed before it can be refused, and refused ones are no model call: a
    policy posting an 8 MiB JSON bomb with a bad last byte, over and over, kept the server's
    event loop busy (~0.2 s a body) for its whole wall time without spending a call.
    Malformed requests are bounded by max_calls too; past it the session stops (limit),
    and later bodies are refused unread."""
    before = len(named.hits)
    async with sandbox_gateway(f"{named.url}/ok") as (session, url, _calls):
        session.max_calls = 3
        bad = b'{"messages": [' + b"{}," * 1000 + b"{}]"  # no closing brace
        async with httpx.AsyncClient(base_url=url) as http:
            codes = []
            for _ in range(8):
                reply = await http.post(CHAT, content=bad)
                codes.append(reply.json()["error"]["code"])
            assert reply.status_code == 400
        assert codes[:3] == ["invalid_json"] * 3, codes
        assert set(codes[4:]) == {"limit_reached"}, codes
        assert session.limit is not None and "malformed" in session.limit
        assert session.stopped.is_set() and session.fault is None
    assert len(named.hits) == before


class EndlessModels:
    """A hostile upstream (real HTTP on loopback): GET /models answers 200 and then a body
    that never ends, 64 KiB every 10 ms, so no read ever times out."""

    def __init__(self) -> None:
        self.sent = 0

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[")
        try:
            while True:
                w.write(b"0," * 32768)
                await w.drain()
                self.sent += 65536
                await asyncio.sleep(0.01)
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()


async def test_the_reset_probe_reads_no_endless_body(manager: EpisodeManager) -> None:
    """The reset's probe (GET /models) read the whole answer: an upstream that never ends
    its body held the reset, and grew the server's memory, for as long as it liked."""
    hostile = EndlessModels()
    server = await asyncio.start_server(hostile.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await asyncio.wait_for(
            local_host(manager).harness._probe(f"http://127.0.0.1:{port}/v1"), 3.0
        )
    finally:
        server.close()
    assert hostile.sent < 8 << 20


async def test_the_reset_probe_outlasts_no_dripping_head(manager: EpisodeManager) -> None:
    """A head dripped a byte at a time never trips httpx's per-read timeout: the probe is
    bounded in all by harness_probe_timeout_s, then the reset's 503."""

    async def drip(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        with contextlib.suppress(ConnectionError, OSError):
            for byte in b"HTTP/1.1 200 OK\r\nx-slow: " + b"a" * 100:
                w.write(bytes([byte]))
                await w.drain()
                await asyncio.sleep(0.1)
        w.close()

    server = await asyncio.start_server(drip, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    runner = HarnessRunner(make_settings(harness_probe_timeout_s=0.5), None)
    started = time.monotonic()
    try:
        with pytest.raises(UnavailableError, match="does not answer"):
            await runner._probe(f"http://127.0.0.1:{port}/v1")
    finally:
        server.close()
    assert time.monotonic() - started < 2.0
