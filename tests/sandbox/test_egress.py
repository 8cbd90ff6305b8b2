"""The egress policy's parts: allow-list rules, forbidden addresses, request parsing, the
settings that configure them, and the task field that asks for internet access (the proxy
and real sandboxes: tests/adversarial/test_egress.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import shutil
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from palaestra.envs.terminal.family import TerminalFamily
from palaestra.envs.terminal.harbor.reader import HarborReader
from palaestra.sandbox.base import PROXY_ENV, SandboxSpec, SocketService, sandbox_env
from palaestra.sandbox.egress import (
    DEFAULT_ALLOW,
    AllowList,
    EgressProxy,
    Refused,
    forbidden_address,
    parse_head,
    parse_reachable,
)
from palaestra.sdk.task import Task
from palaestra.server.config import Settings

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_allow_list_matching() -> None:
    allow = AllowList.parse(["PyPI.org.", "*.debian.org", "mirror.internal:3141", "localhost"])
    assert allow.allows("pypi.org", 443) and allow.allows("pypi.org", 80)
    assert not allow.allows("pypi.org", 22)  # only 80 and 443 without a port
    assert not allow.allows("evilpypi.org", 443) and not allow.allows("pypi.org.evil.com", 443)
    assert allow.allows("deb.debian.org", 80) and allow.allows("a.b.debian.org", 443)
    assert not allow.allows("debian.org", 80)  # *.x is below x, not x itself
    assert not allow.allows("debian.org.attacker.net", 80)
    assert allow.allows("mirror.internal", 3141) and not allow.allows("mirror.internal", 443)
    assert allow.allows("localhost", 80)
    assert not AllowList().allows("pypi.org", 443)  # empty: nothing


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("*", "not a host name"),
        ("https://pypi.org", "port"),
        ("pypi.org/simple", "not a host name"),
        ("10.0.0.5", "IP address"),
        ("2130706433", "IP address"),
        ("pypi.org:99999", "port"),
        ("", "not a host name"),
    ],
)
def test_bad_allow_entries_are_named(entry: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as e:
        AllowList.parse(["pypi.org", entry])
    assert repr(entry) in str(e.value)


def test_settings_validate_and_show_the_egress_fields() -> None:
    assert Settings().egress_allow == list(DEFAULT_ALLOW)
    assert Settings().egress_private == []
    with pytest.raises(ValidationError, match="egress_allow entry '\\*'"):
        Settings(egress_allow=["pypi.org", "*"])
    with pytest.raises(ValidationError, match="egress_private entry 'mirror:80'"):
        Settings(egress_private=["mirror:80"])
    assert parse_reachable(["10.0.0.5:3141", "[fd00::1]:80"]) == {
        ("10.0.0.5", 3141),
        ("fd00::1", 80),
    }


def _own_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("203.0.113.1", 9))  # no packet sent: only the route's source address
        return str(s.getsockname()[0])


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "127.1.2.3",
        "0.0.0.0",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",  # the cloud metadata service
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "fe80::1",
    ],
)
def test_forbidden_addresses(addr: str) -> None:
    assert forbidden_address(ipaddress.ip_address(addr))


def test_this_hosts_own_address_is_forbidden() -> None:
    """Whatever range it is in (here 192.0.2.2, a range the proxy otherwise reaches)."""
    assert forbidden_address(ipaddress.ip_address(_own_address()))


@pytest.mark.parametrize("addr", ["1.1.1.1", "151.101.0.223", "2606:4700::1111"])
def test_public_addresses_are_not_forbidden(addr: str) -> None:
    assert forbidden_address(ipaddress.ip_address(addr)) == ""


def test_parse_head() -> None:
    method, host, port, rest = parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (method, host, port, rest) == ("CONNECT", "pypi.org", 443, b"")
    head = (
        b"GET http://deb.debian.org/debian/?a=1 HTTP/1.1\r\nHost: evil.example\r\n"
        b"Proxy-Authorization: x\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n"
    )
    method, host, port, rest = parse_head(head)
    assert (method, host, port) == ("GET", "deb.debian.org", 80)
    assert rest.startswith(b"GET /debian/?a=1 HTTP/1.1\r\nHost: deb.debian.org\r\n")
    assert b"evil" not in rest and b"Proxy-" not in rest and b"keep-alive" not in rest
    assert rest.endswith(b"Accept: */*\r\nConnection: close\r\n\r\n")
    for bad, status in [
        (b"GET /relative HTTP/1.1\r\n\r\n", 400),
        (b"GET ftp://x.org/ HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT pypi.org HTTP/1.1\r\n\r\n", 400),
        (b"POST http://x.org/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"garbage\r\n\r\n", 400),
        (b"GET http://pypi.org/x\nInjected:1 HTTP/1.1\r\n\r\n", 400),
    ]:
        with pytest.raises(Refused) as e:
            parse_head(bad)
        assert e.value.status == status, bad


def test_proxy_variables_only_with_network() -> None:
    assert set(PROXY_ENV) <= set(sandbox_env(SandboxSpec(network=True), "/work"))
    assert not set(PROXY_ENV) & set(sandbox_env(SandboxSpec(), "/work"))


def _task(public: dict[str, object]) -> Task:
    return Task("t", "terminal", "d", "train", "p/q", "1", public, {"verifier": {"test.sh": ""}})


def test_terminal_task_field_sets_the_spec() -> None:
    family = TerminalFamily()
    spec = family.sandbox_spec(_task({"instruction": "x"}))
    assert spec is not None and spec.network is False  # the default: no network
    spec = family.sandbox_spec(_task({"instruction": "x", "allow_internet": True}))
    assert spec is not None and spec.network is True


@pytest.mark.parametrize(
    ("extra", "internet"),
    [
        ("", False),  # Harbor's own default is open internet: palaestra's is none
        ("allow_internet = true\n", True),
        ("allow_internet = false\n", False),
        ('network_mode = "no-network"\n', False),
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', True),
    ],
)
def test_harbor_internet_maps_to_the_field(tmp_path: Path, extra: str, internet: bool) -> None:
    folder = tmp_path / "sum-column"
    shutil.copytree(FIXTURES / "harbor" / "sum-column", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text() + extra)
    public = HarborReader(tmp_path, None).convert(folder, "train", "h").toml["public"]
    assert public.get("allow_internet", False) is internet


def test_the_server_backends_get_the_configured_proxy() -> None:
    from palaestra.server.runtime import make_backend

    settings = Settings(sandbox="bwrap", egress_allow=["pypi.org"], egress_private=[])
    backend = make_backend(settings)
    egress = getattr(backend, "egress", None)
    assert egress is not None and egress.allow.allows("pypi.org", 443)
    assert not egress.allow.allows("deb.debian.org", 80)


async def _upstream(seen: list[bytes]) -> tuple[asyncio.Server, int]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        seen.append(await r.read(65536))
        await asyncio.sleep(0.2)  # whatever else the client pipelined has arrived by now
        with contextlib.suppress(asyncio.TimeoutError):
            seen.append(await asyncio.wait_for(r.read(65536), 0.2))
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _via(proxy: SocketService, request: bytes) -> bytes:
    """`request` sent through `proxy` served on a loopback listener (no sandbox)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    server = await proxy.serve(listener, "test")
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request)
        await w.drain()
        reply = await asyncio.wait_for(r.read(), 10)
        w.close()
        return reply
    finally:
        await proxy.close(server)


async def test_a_plain_request_forwards_one_request_and_nothing_after_it() -> None:
    seen: list[bytes] = []
    up, port = await _upstream(seen)
    proxy = EgressProxy.from_settings([f"localhost:{port}"], [f"127.0.0.1:{port}"])
    try:
        reply = await _via(
            proxy,
            f"GET http://localhost:{port}/a HTTP/1.1\r\nHost: evil\r\n\r\n"
            "GET http://pypi.org/smuggled HTTP/1.1\r\nHost: pypi.org\r\n\r\n".encode(),
        )
    finally:
        up.close()
    assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b"ok")
    first = seen[0]
    assert first.startswith(b"GET /a HTTP/1.1\r\nHost: localhost:%d\r\n" % port), seen
    assert b"smuggled" not in b"".join(seen) and b"evil" not in first


async def test_refusals_are_403_with_the_cause_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = EgressProxy.from_settings(["pypi.org"], [])
    caplog.set_level(logging.WARNING, logger="palaestra.egress")
    reply = await _via(proxy, b"CONNECT evil.example.com:443 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"evil.example.com:443 refused: not on the operator's egress allow-list" in reply
    reply = await _via(proxy, b"CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403") and b"an IP address" in reply
    reply = await _via(proxy, b"CONNECT pypi.org:22 HTTP/1.1\r\n\r\n")  # only 80 and 443
    assert reply.startswith(b"HTTP/1.1 403")
    logged = [r.getMessage() for r in caplog.records]
    assert any("'evil.example.com':443" in m for m in logged), logged


async def test_a_task_allow_list_narrows_the_operators() -> None:
    """A sandbox whose spec names egress_hosts (a Harbor task's allowed_hosts) reaches a host
    only when both lists have it: the operator's list alone lets nothing else through."""
    seen: list[bytes] = []
    up, port = await _upstream(seen)
    proxy = EgressProxy.from_settings([f"localhost:{port}", "pypi.org"], [f"127.0.0.1:{port}"])
    request = f"GET http://localhost:{port}/a HTTP/1.1\r\n\r\n".encode()
    try:
        refused = await _via(proxy.narrowed(["pypi.org"]), request)
        through = await _via(proxy.narrowed([f"localhost:{port}"]), request)
        wider = await _via(proxy.narrowed(["evil.example.com", f"localhost:{port}"]),
                           b"CONNECT evil.example.com:443 HTTP/1.1\r\n\r\n")  # fmt: skip
    finally:
        up.close()
    assert refused.startswith(b"HTTP/1.1 403") and b"task's own allow-list" in refused
    assert through.startswith(b"HTTP/1.1 200 OK") and len(seen) == 1  # one request went up
    # The task's list never widens the operator's.
    assert wider.startswith(b"HTTP/1.1 403") and b"operator's egress allow-list" in wider


def test_a_task_allow_list_reaches_the_sandbox_spec() -> None:
    from palaestra.sandbox import netns
    from palaestra.sandbox.base import SandboxSpecError
    from palaestra.sandbox.egress import check_network

    public = {"instruction": "x", "allow_internet": True, "allowed_hosts": ["pypi.org"]}
    spec = TerminalFamily().sandbox_spec(_task(public))
    assert spec is not None and spec.network and spec.egress_hosts == ("pypi.org",)
    proxy = EgressProxy.from_settings(["pypi.org"], [])
    listener = netns.listener_for(spec, "box", proxy, None)
    assert listener is not None and listener.service != proxy  # served narrowed
    bad = SandboxSpec(network=True, egress_hosts=("10.0.0.1",))
    with pytest.raises(SandboxSpecError, match="egress_hosts"):
        check_network(bad, proxy, "bwrap")
    with pytest.raises(SandboxSpecError, match="without network"):
        check_network(SandboxSpec(egress_hosts=("pypi.org",)), proxy, "bwrap")
