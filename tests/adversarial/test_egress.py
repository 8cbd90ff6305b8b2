"""Egress of a task that declares internet access: only through the server's allow-list proxy.

Real proxy, real sandboxes (bwrap and docker), loopback only: a local HTTP server on
127.0.0.1 stands for the allowed package mirror (its ``ip:port`` is the operator's
`egress_private` exemption, as a mirror on a private address would be), another for the
server's own port. Where this machine reaches the real mirrors, one real fetch of each kind
(plain http from deb.debian.org, the PyPI simple index through a CONNECT tunnel) too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import PROXY_PORT, Backend, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sandbox.egress import EgressProxy
from palaestra.sdk.models import Action
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.runtime import build_manager

from .harness import BACKENDS, backend_unavailable

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).parent / "programs"
PROBE = (PROGRAMS / "egress_probe.py").read_text()
NO_NETWORK_PROBE = (PROGRAMS / "no_network_probe.py").read_text()
PACK = Path(__file__).parents[1] / "fixtures" / "egress-pack"
SPEC = SandboxSpec(network=True, memory_mb=512, pids=64, default_timeout_s=90.0)


async def _respond(text: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        line = (await r.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0]
        body = text + b" " + line
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()
    w.close()


@contextlib.asynccontextmanager
async def http_server(host: str, text: bytes) -> AsyncIterator[int]:
    server = await asyncio.start_server(lambda r, w: _respond(text, r, w), host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def real_mirror() -> str:
    """The address deb.debian.org has from this host if it answers there, else "-"."""
    try:
        with socket.create_connection(("deb.debian.org", 80), timeout=3) as s:
            return str(s.getpeername()[0])
    except OSError:
        return "-"


@pytest.fixture(scope="module")
def real() -> Iterator[str]:
    yield real_mirror()


def make_backend(name: str, proxy: EgressProxy) -> Backend:
    if (why := backend_unavailable(name)) is not None:
        pytest.skip(why)
    if name == "bwrap":
        return BwrapBackend(egress=proxy)
    from palaestra.sandbox.docker import DockerBackend

    return DockerBackend(egress=proxy)


def blocked(result: str) -> bool:
    return result.startswith("blocked:")


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_only_the_allowed_mirror_through_the_proxy(
    backend_name: str, real: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        http_server("127.0.0.1", b"MIRROR-OK") as mirror,
        http_server("0.0.0.0", b"SERVER-SECRET") as server,
    ):
        # localhost:<server> is allowed by name, and refused: it resolves to loopback.
        allow = [f"localhost:{mirror}", f"localhost:{server}", "deb.debian.org", "pypi.org"]
        exempt = [f"127.0.0.1:{mirror}"]
        proxy = EgressProxy.from_settings(allow, exempt)
        backend = make_backend(backend_name, proxy)
        caplog.set_level(logging.WARNING, logger="palaestra.egress")
        try:
            async with await backend.create(SPEC) as box:
                assert proxy.listeners == 1
                r = await box.exec(["python3", "-c", PROBE, str(mirror), str(server), real])
                assert r.exit_code == 0, r
                seen = json.loads(r.stdout)
            assert proxy.listeners == 0  # closing the sandbox stopped its listener
        finally:
            await backend.aclose()
    # The allowed mirror, plain and through CONNECT.
    assert seen["mirror_plain"].startswith("ok: 200 MIRROR-OK GET /plain HTTP/1.1"), seen
    assert "MIRROR-OK GET /tunnel" in seen["mirror_connect"], seen
    # A host not on the allow-list: a 403 that says why.
    for k in ("disallowed_host", "disallowed_connect"):
        assert blocked(seen[k]) and "403" in seen[k] and "egress allow-list" in seen[k], seen
    # IP literals (the metadata service, loopback) and a name resolving to loopback.
    for k in ("metadata_literal", "metadata_connect", "loopback_literal"):
        assert blocked(seen[k]) and "403" in seen[k] and "IP address" in seen[k], seen
    for k in ("loopback_name", "server_plain"):
        assert blocked(seen[k]) and "forbidden address" in seen[k], seen
    # No way around the proxy: the sandbox's loopback is its own, nothing routes out.
    ways = ("direct_mirror", "direct_server", "direct_public", "udp_dns", "resolve", "raw_socket")
    for k in ways:
        assert blocked(seen[k]), (k, seen)
    assert "SERVER-SECRET" not in r.stdout
    if real != "-":
        assert seen["real_plain"].startswith("ok: 200"), seen
        assert "HTTP/1.1 200" in seen["real_pypi"] and blocked(seen["direct_real"]), seen
    refusals = [m.getMessage() for m in caplog.records if "egress refused" in m.getMessage()]
    assert any("'example.com':443" in m for m in refusals), refusals
    assert any("169.254.169.254" in m for m in refusals), refusals


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_no_internet_declared_means_no_network(backend_name: str) -> None:
    """A backend with the proxy still gives a sandbox that declares nothing no network: no
    proxy variables, nothing on the proxy's port, only a loopback of its own."""
    async with http_server("127.0.0.1", b"MIRROR-OK") as mirror:
        proxy = EgressProxy.from_settings([f"localhost:{mirror}"], [f"127.0.0.1:{mirror}"])
        backend = make_backend(backend_name, proxy)
        try:
            async with await backend.create(SandboxSpec(default_timeout_s=30.0)) as box:
                assert proxy.listeners == 0
                argv = ["python3", "-c", NO_NETWORK_PROBE, str(PROXY_PORT), str(mirror)]
                r = await box.exec(argv)
        finally:
            await backend.aclose()
    assert r.exit_code == 0, r
    assert r.stdout.startswith("[]\n") and "CONNECTED" not in r.stdout, r
    assert r.stdout.count("blocked") == 2, r


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_task_allow_list_narrows_the_proxy_in_a_real_sandbox(
    backend_name: str, real: str
) -> None:
    """A sandbox whose spec names egress_hosts (a Harbor task's allowed_hosts) is refused an
    operator-allowed mirror it does not name, with the reason; what it names still goes
    through."""
    async with (
        http_server("127.0.0.1", b"MIRROR-OK") as mirror,
        http_server("0.0.0.0", b"SERVER-SECRET") as server,
    ):
        proxy = EgressProxy.from_settings([f"localhost:{mirror}"], [f"127.0.0.1:{mirror}"])
        backend = make_backend(backend_name, proxy)
        seen: dict[str, str] = {}
        try:
            for hosts in (("pypi.org",), (f"localhost:{mirror}",)):
                spec = dataclasses.replace(SPEC, egress_hosts=hosts)
                async with await backend.create(spec) as box:
                    r = await box.exec(["python3", "-c", PROBE, str(mirror), str(server), real])
                    assert r.exit_code == 0, r
                    seen[hosts[0]] = json.loads(r.stdout)["mirror_plain"]
        finally:
            await backend.aclose()
    assert blocked(seen["pypi.org"]) and "task's own allow-list" in seen["pypi.org"], seen
    assert seen[f"localhost:{mirror}"].startswith("ok: 200 MIRROR-OK"), seen


@pytest.mark.skipif(backend_unavailable("bwrap") is not None, reason="bwrap unavailable")
async def test_a_task_that_declares_internet_reaches_the_allowed_mirror(tmp_path: Path) -> None:
    """The whole path: the task's `allow_internet`, the server's `egress_allow`, the agent's
    shell and the verifier (tests/fixtures/egress-pack); the agent is told of the proxy."""
    async with http_server("127.0.0.1", b"MIRROR-OK") as mirror:
        pack = tmp_path / "packs" / "egress-pack"
        shutil.copytree(PACK, pack)
        toml = pack / "tasks" / "fetch-index" / "task.toml"
        toml.write_text(toml.read_text().replace("localhost:1/", f"localhost:{mirror}/"))
        settings = Settings(
            data_dir=tmp_path / "data",
            packs_dirs=[tmp_path / "packs"],
            pool_size=0,
            egress_allow=[f"localhost:{mirror}"],
            egress_private=[f"127.0.0.1:{mirror}"],
        )
        manager = build_manager(settings)
        await manager.start()
        try:
            client = AsyncInProcessClient(manager)
            reset = await client.reset("test/egress:fetch-index")
            assert "through the proxy in $HTTPS_PROXY" in reset.observation.text
            solve = (toml.parent / "solution" / "solve.sh").read_text()
            reply = await client.step(
                reset.episode_id, Action(tool="bash", arguments={"command": solve})
            )
            assert not reply.terminated, reply
            reply = await client.step(reset.episode_id, Action(tool="submit", arguments={}))
        finally:
            await manager.shutdown()
    assert reply.terminated and reply.reward == 1.0, reply
