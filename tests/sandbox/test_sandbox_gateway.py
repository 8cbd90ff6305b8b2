"""`SandboxSpec.gateway` on the bwrap and docker backends: the sandbox reaches its own
session at http://127.0.0.1:4000 (a test `SocketService`, adversarial/gateway_echo.py),
two sandboxes get their own keys, closing a sandbox closes its listener; the checks that
refuse a spec; the warm pool never keeps one; the server's wiring (make_backend, ceilings).
What a gateway sandbox cannot reach: tests/adversarial/test_gateway_isolation.py."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from adversarial.gateway_echo import EchoGateway, gateway_backend
from adversarial.harness import BACKENDS, backend_unavailable

from palaestra.sandbox.base import (
    GATEWAY_PORT,
    SandboxSpec,
    SandboxSpecError,
    check_gateway,
)
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sandbox.egress import EgressProxy
from palaestra.sandbox.pool import WarmPool
from palaestra.server.ceilings import check_spec
from palaestra.server.config import Settings
from palaestra.server.runtime import make_backend

FETCH = (Path(__file__).parents[1] / "adversarial" / "programs" / "gateway_fetch.py").read_text()
SPEC = SandboxSpec(memory_mb=256, pids=64, default_timeout_s=30.0)
# docker is the slow tier's (tests/README.md)
GATEWAY_BACKENDS = [
    pytest.param(b, marks=pytest.mark.slow) if b == "docker" else b for b in BACKENDS
]


def gateway_spec(key: str) -> SandboxSpec:
    return SandboxSpec(**{**SPEC.__dict__, "gateway": key})


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the gateway's listener is placed in the sandbox's namespace by root")


@pytest.mark.parametrize("backend_name", GATEWAY_BACKENDS)
async def test_each_sandbox_reaches_its_own_session(backend_name: str) -> None:
    needs_root()
    gw = EchoGateway()
    backend = gateway_backend(backend_name, gw)
    try:
        a, b = await asyncio.gather(
            backend.create(gateway_spec("episode-a")), backend.create(gateway_spec("episode-b"))
        )
        assert gw.keys == ["episode-a", "episode-b"]
        ra, rb = await asyncio.gather(
            a.exec(["python3", "-c", FETCH]), b.exec(["python3", "-c", FETCH])
        )
        assert ra.exit_code == 0 and rb.exit_code == 0, (ra, rb)
        assert json.loads(ra.stdout) == {"key": "episode-a", "line": "GET /v1/models HTTP/1.1"}
        assert json.loads(rb.stdout)["key"] == "episode-b"
        env = await a.exec("env")
        assert "proxy" not in env.stdout.lower(), env.stdout  # no egress variables
        await a.close()
        assert gw.keys == ["episode-b"]  # closing a sandbox closed its listener, only its
        assert gw.sockets[0].fileno() == -1 or gw.sockets[1].fileno() == -1
        rb = await b.exec(["python3", "-c", FETCH])
        assert json.loads(rb.stdout)["key"] == "episode-b", rb
        await b.close()
        assert gw.keys == [] and all(s.fileno() == -1 for s in gw.sockets)
    finally:
        await backend.aclose()
    assert backend.live_count == 0


async def test_a_restarted_container_gets_its_listener_back() -> None:
    """docker restarts a container whose processes no exec could kill (the pids limit): its
    fresh network namespace gets the listener again before anything runs in it."""
    needs_root()
    gw = EchoGateway()
    backend = gateway_backend("docker", gw)
    try:
        box = await backend.create(gateway_spec("episode-r"))
        box._kill_sync = lambda: False  # type: ignore[attr-defined]  # no exec could kill
        await box.kill_all()  # type: ignore[attr-defined]
        assert gw.keys == ["episode-r"] and gw.sockets[0].fileno() == -1
        r = await box.exec(["python3", "-c", FETCH])
        assert r.exit_code == 0 and json.loads(r.stdout)["key"] == "episode-r", r
    finally:
        await backend.aclose()
    assert gw.keys == []


@pytest.mark.parametrize("backend_name", GATEWAY_BACKENDS)
async def test_specs_the_backends_refuse(backend_name: str) -> None:
    gw = EchoGateway()
    egress = EgressProxy.from_settings([], [])
    backend = gateway_backend(backend_name, gw, egress)
    bare = gateway_backend(backend_name, None, egress)
    try:
        with pytest.raises(SandboxSpecError, match="gateway with network=True"):
            await backend.create(SandboxSpec(network=True, gateway="k"))
        with pytest.raises(SandboxSpecError, match="without the server's model gateway"):
            await bare.create(gateway_spec("k"))
        for key in ("", "a\nb", "x" * 257):
            with pytest.raises(SandboxSpecError, match="session key"):
                await backend.create(gateway_spec(key))
    finally:
        await backend.aclose()
        await bare.aclose()
    assert gw.keys == [] and backend.live_count == 0


def test_a_gateway_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxSpecError, match="needs the server to run as root"):
        check_gateway(gateway_spec("k"), EchoGateway(), "bwrap")
    check_gateway(SPEC, None, "bwrap")  # no gateway asked: nothing to check


def test_the_e2b_backend_refuses_a_gateway() -> None:
    pytest.importorskip("e2b", reason="the e2b SDK is not installed")
    from palaestra.sandbox.e2b import E2BBackend

    backend = E2BBackend(api_key="unused")
    with pytest.raises(SandboxSpecError, match="without the server's model gateway"):
        asyncio.run(backend.create(gateway_spec("k")))


@pytest.mark.skipif(backend_unavailable("bwrap") is not None, reason="bwrap unavailable")
async def test_the_warm_pool_never_keeps_a_gateway_sandbox() -> None:
    needs_root()
    gw = EchoGateway()
    pool = WarmPool(BwrapBackend(gateway=gw), size=2, refill_delay_s=0.0)
    try:
        spec = gateway_spec("episode-p")
        pool.prewarm(spec)
        box = await pool.create(spec)
        await asyncio.sleep(0.3)  # a refill, were there one, would have started by now
        assert pool.pooled == 0 and pool.stats().specs == 0 and pool.live_count == 1
        assert gw.keys == ["episode-p"]  # the one handed out, nothing made ahead
        r = await box.exec(["python3", "-c", FETCH])
        assert json.loads(r.stdout)["key"] == "episode-p", r
        await box.close()
        assert pool.live_count == 0 and gw.keys == []
    finally:
        await pool.aclose()


def test_the_server_wires_the_gateway(tmp_path: Path) -> None:
    gw = EchoGateway()
    settings = Settings(data_dir=tmp_path / "data", pool_size=0)
    backend = make_backend(settings, gateway=gw)
    assert getattr(backend, "gateway", None) is gw
    assert getattr(make_backend(settings), "gateway", "absent") is None
    check_spec(gateway_spec("episode-1"), settings, "harness")  # ceilings accept it
    assert GATEWAY_PORT == 4000
