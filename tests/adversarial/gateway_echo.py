"""A small `SocketService` for the gateway tests: an HTTP echo of the session key it serves
and the request line, standing for the session model proxy (server/harness/gateway.py),
and the backends made with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass, field

import pytest

from palaestra.sandbox.base import Backend
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sandbox.egress import EgressProxy

from .harness import backend_unavailable


@dataclass
class EchoGateway:
    """Answers every request on a served socket with ``{"key", "line"}`` as JSON."""

    servers: dict[asyncio.Server, str] = field(default_factory=dict)
    sockets: list[socket.socket] = field(default_factory=list)

    async def serve(self, sock: socket.socket, key: str) -> asyncio.Server:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                head = await r.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                body = json.dumps({"key": key, "line": line}).encode()
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                w.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
                await w.drain()
            w.close()

        server = await asyncio.start_server(handle, sock=sock)
        self.servers[server] = key
        self.sockets.append(sock)
        return server

    async def close(self, server: asyncio.Server) -> None:
        self.servers.pop(server, None)
        server.close()
        await server.wait_closed()

    @property
    def keys(self) -> list[str]:
        return sorted(self.servers.values())


def gateway_backend(
    name: str, gateway: EchoGateway | None, egress: EgressProxy | None = None
) -> Backend:
    """A backend of `name` made with `gateway` (and `egress`); a skip where it cannot run."""
    if (why := backend_unavailable(name)) is not None:
        pytest.skip(why)
    if name == "bwrap":
        return BwrapBackend(egress=egress, gateway=gateway)
    from palaestra.sandbox.docker import DockerBackend

    return DockerBackend(egress=egress, gateway=gateway)
