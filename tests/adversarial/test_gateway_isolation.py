"""A harness sandbox (`SandboxSpec.gateway`) reaches its model gateway and nothing else.

Real sandboxes (bwrap, docker) made with the egress proxy and a gateway (the echo service
of gateway_echo.py): from inside, the probe (programs/gateway_probe.py) tries the other
ports of its loopback, a service on the host's 127.0.0.1 and one on its external address
(both started here), the cloud metadata address, a public address, DNS, an abstract unix
socket the host listens on, the docker socket and the egress proxy's port; and to take the
gateway's port by binding it. Only the gateway answers, before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.egress import EgressProxy

from .gateway_echo import EchoGateway, gateway_backend
from .harness import BACKENDS

pytestmark = pytest.mark.slow

PROBE = (Path(__file__).parent / "programs" / "gateway_probe.py").read_text()
SPEC = SandboxSpec(memory_mb=256, pids=64, default_timeout_s=60.0, gateway="episode-x")
SECRET = b"HOST-SECRET"


def external_address() -> str:
    """This host's address on its default route (no packet sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("203.0.113.1", 9))
        return str(s.getsockname()[0])


async def _secret(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(SECRET)
    with contextlib.suppress(OSError):
        await w.drain()
    w.close()


@contextlib.asynccontextmanager
async def host_services() -> AsyncIterator[dict[str, object]]:
    """A listener on the host's 127.0.0.1, one on its external address, and an abstract
    unix socket, each answering SECRET."""
    ext = external_address()
    name = f"palaestra-gateway-test-{secrets.token_hex(6)}"
    servers = [
        await asyncio.start_server(_secret, "127.0.0.1", 0),
        await asyncio.start_server(_secret, ext, 0),
        await asyncio.start_unix_server(_secret, "\0" + name),
    ]
    try:
        yield {
            "host_port": servers[0].sockets[0].getsockname()[1],
            "ext_ip": ext,
            "ext_port": servers[1].sockets[0].getsockname()[1],
            "abstract": name,
        }
    finally:
        for s in servers:
            s.close()


def blocked(result: str) -> bool:
    return result.startswith("blocked:")


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_gateway_sandbox_reaches_only_its_gateway(backend_name: str) -> None:
    gw = EchoGateway()
    # The egress proxy would let the host's loopback service through (allowed by name,
    # exempted by address): a gateway sandbox must not get it.
    async with host_services() as host:
        egress = EgressProxy.from_settings(
            [f"localhost:{host['host_port']}"], [f"127.0.0.1:{host['host_port']}"]
        )
        backend = gateway_backend(backend_name, gw, egress)
        try:
            async with await backend.create(SPEC) as box:
                assert egress.listeners == 0 and gw.keys == ["episode-x"]
                r = await box.exec(["python3", "-c", PROBE, json.dumps(host)])
                assert r.exit_code == 0, r
                seen = json.loads(r.stdout)
                assert (await box.exec("echo ok")).stdout == "ok\n"
            rd, wr = await asyncio.open_connection("127.0.0.1", host["host_port"])
            assert await rd.read(64) == SECRET  # the host's own service is up, for the host
            wr.close()
        finally:
            await backend.aclose()
    expect = '{"key": "episode-x", "line": "GET /v1/models HTTP/1.1"}'
    for k in ("gateway", "gateway_localhost", "gateway_after", "gateway_localhost_after"):
        assert seen[k] == f"ok: {expect}", (k, seen)
    ways_out = [k for k in seen if k.startswith(("loopback", "bind_"))]
    ways_out += ["host_external", "metadata", "public", "dns_resolve", "dns_udp"]
    ways_out += ["abstract_unix", "docker_socket"]
    for k in ways_out:
        assert blocked(seen[k]), (k, seen)
    for k in ("bind_4000", "bind_4000_any", "bind_4000_reuseport", "bind_4000_other_loopback"):
        assert "Address already in use" in seen[k], (k, seen)
    # ::1 too: taken by the gateway's dual-stack socket, or absent (docker's namespace).
    assert "in use" in seen["bind_4000_v6"] or "Cannot assign" in seen["bind_4000_v6"], seen
    assert "SECRET" not in r.stdout
    assert gw.keys == []
