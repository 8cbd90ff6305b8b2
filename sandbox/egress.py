"""The server's egress proxy: the only way out of a sandbox whose spec has `network`.

An HTTP proxy (``CONNECT host:port`` for https, an absolute-URI request for plain http)
served on listening sockets the server placed inside sandboxes' network namespaces
(`palaestra.sandbox.netns`); it listens on no host port. A request is let through only to a
host name on the operator's allow-list (`AllowList`, the `egress_allow` setting), at an
address that is none of loopback, private, link-local (the cloud metadata service),
multicast, reserved or this host's own (`forbidden_address`): an IP literal, or a name that
resolves to such an address (DNS rebinding), is refused. A sandbox whose spec names
`egress_hosts` (a task's own allow-list) is served `narrowed` to them: a host must be on both
lists. The address checked is the one
connected to. A refusal is a 403 whose body says why, and a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import socket
from asyncio import StreamReader as Reader
from asyncio import StreamWriter as Writer
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from palaestra.sandbox.base import SandboxSpec, SandboxSpecError, SocketService

log = logging.getLogger("palaestra.egress")

# The registries apt, pip and npm use on this project's machines (docs/security.md).
DEFAULT_ALLOW = (
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
)
DEFAULT_PORTS = (80, 443)
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 120.0
MAX_CONNECTIONS = 64  # open at once per sandbox
LOGGED_REFUSALS = 50  # per sandbox; then only counted
CHUNK = 64 * 1024

_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_FORBIDDEN_NETS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "64:ff9b::/96",
        "100::/64",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    )
)
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "host",
}


def _host_name(raw: str) -> str:
    """`raw` as a lower-case host name, or ValueError saying why it is none."""
    host = raw.strip().lower().rstrip(".")
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.match(x) for x in labels):
        raise ValueError(f"{raw!r} is not a host name (letters, digits, '-', dots)")
    if labels[-1].isdigit() or _ip(host) is not None:
        raise ValueError(f"{raw!r} is an IP address, not a host name")
    return host


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.strip("[]"))
    return None


@dataclass(frozen=True)
class Rule:
    """One allow-list entry: a host (``*.`` in front: any name below it, not itself) and
    the ports it may be reached on."""

    host: str
    wildcard: bool
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host


def parse_rule(entry: str) -> Rule:
    """``host``, ``*.domain`` or either with ``:port``; ValueError naming the entry."""
    text = entry.strip()
    ports: tuple[int, ...] = DEFAULT_PORTS
    if ":" in text:
        text, _, port = text.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"egress_allow entry {entry!r}: port {port!r} is not 1-65535")
        ports = (int(port),)
    wildcard = text.startswith("*.")
    try:
        host = _host_name(text[2:] if wildcard else text)
    except ValueError as e:
        raise ValueError(
            f"egress_allow entry {entry!r}: {e}; write a host, *.domain or host:port"
        ) from None
    return Rule(host, wildcard, ports)


@dataclass(frozen=True)
class AllowList:
    """The hosts sandboxes may reach through the proxy (empty: none)."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        return cls(tuple(parse_rule(e) for e in entries))

    def allows(self, host: str, port: int) -> bool:
        return any(r.matches(host, port) for r in self.rules)


def parse_reachable(entries: Iterable[str]) -> frozenset[tuple[str, int]]:
    """``ip:port`` entries (``[v6]:port``) as pairs; ValueError naming the bad one."""
    out: set[tuple[str, int]] = set()
    for entry in entries:
        host, sep, port = entry.strip().rpartition(":")
        ip = _ip(host) if sep and host else None
        if ip is None or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"egress_private entry {entry!r}: write ip:port, e.g. 10.0.0.5:3141")
        out.add((str(ip), int(port)))
    return frozenset(out)


def is_local_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether `ip` is one of this host's own addresses (a bind to it succeeds)."""
    fam = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.bind((str(ip), 0))
    except OSError:
        return False
    return True


def forbidden_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why the proxy never connects to `ip` ("" when it may)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for net in _FORBIDDEN_NETS:
        if ip.version == net.version and ip in net:
            return f"{ip} is in {net} (loopback, private, link-local or reserved)"
    if is_local_address(ip):
        return f"{ip} is this host's own address"
    return ""


class Refused(Exception):
    """A request the proxy does not forward: `status` and the reason in the reply's body."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass
class _Listener:
    owner: str
    task: AllowList | None = None  # the sandbox's own narrower list (`narrowed`)
    open: int = 0
    refused: int = 0


@dataclass
class EgressProxy:
    """The proxy (see the module docstring). `reachable` lists exact ``(ip, port)`` pairs
    that may be connected to although `forbidden_address` refuses them: an operator's
    mirror on a private address (the `egress_private` setting)."""

    allow: AllowList
    reachable: frozenset[tuple[str, int]] = frozenset()
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    _servers: set[asyncio.Server] = field(default_factory=set)

    @classmethod
    def from_settings(cls, allow: Iterable[str], private: Iterable[str]) -> EgressProxy:
        """The proxy of the `egress_allow` and `egress_private` settings."""
        return cls(AllowList.parse(allow), parse_reachable(private))

    @property
    def listeners(self) -> int:
        """Sandboxes served now (each closes its own when it closes)."""
        return len(self._servers)

    def narrowed(self, hosts: Iterable[str]) -> SocketService:
        """This proxy for a sandbox that may reach only `hosts` (each also on the operator's
        list); ValueError naming a bad entry."""
        return _Narrowed(self, AllowList.parse(hosts))

    async def serve(
        self, sock: socket.socket, owner: str, task: AllowList | None = None
    ) -> asyncio.Server:
        """Serve the listening socket `sock` (in sandbox `owner`'s namespace) until the
        returned server is closed (`close` or `aclose`); `task`: `narrowed`'s list."""
        lst = _Listener(owner, task)

        async def handle(r: Reader, w: Writer) -> None:
            await self._handle(lst, r, w)

        server = await asyncio.start_server(handle, sock=sock, limit=MAX_HEAD_BYTES)
        self._servers.add(server)
        return server

    async def close(self, server: asyncio.Server) -> None:
        """Stop serving one sandbox: its listener and its open connections."""
        self._servers.discard(server)
        server.close()
        with contextlib.suppress(Exception):
            server.close_clients()  # type: ignore[attr-defined]  # Python ≥ 3.13
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    async def aclose(self) -> None:
        for s in list(self._servers):
            await self.close(s)

    # ---- one connection ------------------------------------------------------------------

    async def _handle(self, lst: _Listener, r: Reader, w: Writer) -> None:
        if lst.open >= MAX_CONNECTIONS:
            w.close()
            return
        lst.open += 1
        host, port = "?", 0
        try:
            try:
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
                method, host, port, rest = parse_head(head)
                up_r, up_w = await self._connect(host, port, lst.task)
            except Refused as e:
                self._refuse(lst, w, host, port, e)
                return
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            try:
                if method == "CONNECT":
                    w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await self._pipe(r, up_w, up_r, w)
                else:
                    up_w.write(rest)
                    await self._copy_body(r, up_w, head)
                    await self._pipe(None, up_w, up_r, w)
            finally:
                up_w.close()
        except (OSError, ConnectionError, Refused, ValueError):  # the client or upstream went
            pass
        finally:
            lst.open -= 1
            w.close()

    def _refuse(self, lst: _Listener, w: Writer, host: str, port: int, e: Refused) -> None:
        lst.refused += 1
        if lst.refused <= LOGGED_REFUSALS:
            log.warning("egress refused for sandbox %s: %r:%s: %s", lst.owner, host, port, e)
        body = f"palaestra egress proxy: {host}:{port} refused: {e}\n".encode()
        phrase = {400: "Bad Request", 403: "Forbidden", 501: "Not Implemented"}
        w.write(
            f"HTTP/1.1 {e.status} {phrase.get(e.status, 'Bad Gateway')}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    async def _connect(
        self, host: str, port: int, task: AllowList | None = None
    ) -> tuple[Reader, Writer]:
        """A connection to `host` if the policy lets it through; Refused otherwise."""
        if _ip(host) is not None:
            raise Refused(403, "an IP address; the proxy reaches host names on its allow-list")
        try:
            name = _host_name(host)
        except ValueError as e:
            raise Refused(400, str(e)) from None
        if not self.allow.allows(name, port):
            raise Refused(403, "not on the operator's egress allow-list (egress_allow)")
        if task is not None and not task.allows(name, port):
            raise Refused(403, "not on the task's own allow-list (allowed_hosts)")
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(name, port, type=socket.SOCK_STREAM), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as e:
            raise Refused(502, f"cannot resolve: {e}") from None
        addrs = [str(i[4][0]) for i in infos]
        for a in addrs:
            if (a, port) in self.reachable:
                continue
            try:
                why = forbidden_address(ipaddress.ip_address(a))
            except ValueError:  # a scoped (link-local) address, say
                why = f"{a} is no address the proxy reaches"
            if why:
                raise Refused(403, f"resolves to a forbidden address: {why}")
        err: Exception | None = None
        for a in dict.fromkeys(addrs):
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(a, port, limit=CHUNK), self.connect_timeout_s
                )
            except (OSError, TimeoutError) as e:
                err = e
        raise Refused(502, f"cannot connect: {err}")

    async def _copy_body(self, r: Reader, up: Writer, head: bytes) -> None:
        """Forward a plain-http request's body (Content-Length bytes, nothing after it)."""
        length = header(head, "content-length")
        left = int(length) if length and length.isdigit() else 0
        while left > 0:
            chunk = await asyncio.wait_for(r.read(min(left, CHUNK)), self.idle_timeout_s)
            if not chunk:
                return
            up.write(chunk)
            await up.drain()
            left -= len(chunk)

    async def _pipe(self, r: Reader | None, up_w: Writer, up_r: Reader, w: Writer) -> None:
        """Copy both ways (upstream to client only, without `r`) until a side closes or
        nothing moves for idle_timeout_s."""

        async def copy(src: Reader, dst: Writer) -> None:
            with contextlib.suppress(OSError, ConnectionError, TimeoutError):
                while chunk := await asyncio.wait_for(src.read(CHUNK), self.idle_timeout_s):
                    dst.write(chunk)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()

        jobs = [asyncio.ensure_future(copy(up_r, w))]
        if r is not None:
            jobs.append(asyncio.ensure_future(copy(r, up_w)))
        try:
            await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
            if r is not None:  # the client sent EOF or upstream did: let the other finish
                await asyncio.wait(jobs, timeout=self.idle_timeout_s)
        finally:
            for j in jobs:
                j.cancel()


@dataclass(frozen=True)
class _Narrowed:
    """`EgressProxy.narrowed`: the proxy serving one sandbox with its task's list."""

    proxy: EgressProxy
    task: AllowList

    async def serve(self, sock: socket.socket, key: str) -> asyncio.Server:
        return await self.proxy.serve(sock, key, self.task)

    async def close(self, server: asyncio.Server) -> None:
        await self.proxy.close(server)


def header(head: bytes, name: str) -> str | None:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        k, sep, v = line.partition(":")
        if sep and k.strip().lower() == name:
            return v.strip()
    return None


def parse_head(head: bytes) -> tuple[str, str, int, bytes]:
    """A request head's method, target host and port, and (plain http) the request to send
    upstream; Refused (400/501) for anything else."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    controls = any(ord(c) < 0x21 or ord(c) == 0x7F for c in "".join(parts))
    if len(parts) != 3 or controls or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "not an HTTP/1.x request line")
    method, target, _ = parts
    if method == "CONNECT":
        host, sep, num = target.rpartition(":")
        if not sep or not num.isdigit() or not 0 < int(num) < 65536:
            raise Refused(400, f"CONNECT target {target[:200]!r} is not host:port")
        return method, host.strip("[]"), int(num), b""
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise Refused(400, "a plain request must name an absolute http:// URL")
    if header(head, "transfer-encoding") is not None:
        raise Refused(501, "chunked request bodies are not forwarded")
    try:
        port = url.port or 80
    except ValueError:
        raise Refused(400, f"bad port in {target[:200]!r}") from None
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    out = [f"{method} {path} HTTP/1.1", f"Host: {url.netloc.rpartition('@')[2]}"]
    for line in lines[1:]:
        k, sep, _ = line.partition(":")
        if sep and k.strip().lower() not in _HOP_HEADERS:
            out.append(line)
    out.append("Connection: close")
    return method, url.hostname, port, ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")


def check_network(spec: SandboxSpec, proxy: EgressProxy | None, backend: str) -> None:
    """A backend's check of `spec.network`: the sandbox must get the server's proxy, which
    only a root server can place in a sandbox's namespace."""
    if not spec.network:
        if spec.egress_hosts:
            raise SandboxSpecError("egress_hosts without network: a sandbox with no network")
        return
    try:
        AllowList.parse(spec.egress_hosts)
    except ValueError as e:
        raise SandboxSpecError(f"egress_hosts: {e}") from None
    if proxy is None:
        raise SandboxSpecError(
            f"network=True: this {backend} backend was made without the server's egress"
            " proxy, and a sandbox never gets open network"
        )
    if os.geteuid() != 0:
        raise SandboxSpecError(
            "network=True: egress through the proxy needs the server to run as root (it"
            " places the proxy's socket in the sandbox's network namespace)"
        )
