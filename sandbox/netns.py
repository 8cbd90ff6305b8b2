"""Network namespaces for sandboxes with egress or a model gateway: a fresh one with only
loopback (bwrap), or a container's (docker), each given the server's own listening socket on
127.0.0.1:PROXY_PORT (the egress proxy) or 127.0.0.1:GATEWAY_PORT (the session model proxy).

The socket is made by the server in a short-lived thread that joined the namespace
(``unshare``/``setns`` affect only the calling thread); a socket stays in the namespace it
was made in, so the server accepts on it from its event loop and serves it with a
`SocketService` (`palaestra.sandbox.egress.EgressProxy`, the harness gateway). Nothing runs
inside the sandbox for this.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from palaestra.sandbox.base import (
    GATEWAY_PORT,
    PROXY_PORT,
    SandboxCreateError,
    SandboxSpec,
    SocketService,
)
from palaestra.sandbox.egress import EgressProxy

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

T = TypeVar("T")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _in_fresh_thread(fn: Callable[[], T]) -> T:
    """Run `fn` in a new OS thread that ends with it: a namespace it joins dies with it."""
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # handed to the caller
            err.append(e)

    t = threading.Thread(target=run, name="palaestra-netns", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def _listener(port: int) -> socket.socket:
    """A listening socket on `port` of every address of the calling thread's namespace,
    which has loopback only: 127.0.0.1 and ::1 (one dual-stack socket), so code in the
    sandbox can bind `port` on no address and catch what a client sends to
    ``localhost:port``. IPv4 127.0.0.1 alone where the host has no IPv6."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        s, addr = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("127.0.0.1", port)
    else:
        addr = ("::", port)
    try:
        if s.family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(64)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def new_netns(port: int = PROXY_PORT) -> tuple[int, socket.socket]:
    """A fresh network namespace (loopback only, no route out) and its one listener on
    127.0.0.1:`port` (the egress proxy's by default): the namespace's fd (it lives while
    the fd, the socket or a process in it does) and the socket. Blocking (a thread); needs
    root. SandboxCreateError if the host refuses."""

    def make() -> tuple[int, socket.socket]:
        if _libc().unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        _loopback_up()
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return fd, _listener(port)
        except BaseException:
            os.close(fd)
            raise

    try:
        return _in_fresh_thread(make)
    except OSError as e:
        raise SandboxCreateError(f"cannot make the sandbox's network namespace: {e}") from e


def listen_in(pid: int, port: int = PROXY_PORT) -> socket.socket:
    """A listener on 127.0.0.1:`port` (the egress proxy's by default) inside the network
    namespace of process `pid` (a container's init). Blocking (a thread); needs root.
    SandboxCreateError if it cannot be made."""

    def make() -> socket.socket:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc().setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into process {pid}'s network")
        finally:
            os.close(fd)
        return _listener(port)

    try:
        return _in_fresh_thread(make)
    except OSError as e:
        raise SandboxCreateError(f"cannot reach the sandbox's network namespace: {e}") from e


@dataclass(frozen=True)
class Listener:
    """The one listener a sandbox's own network namespace holds: who serves it, on which
    loopback port, for which key (the sandbox's id for egress, the session's for a
    gateway)."""

    service: SocketService
    port: int
    key: str


def listener_for(
    spec: SandboxSpec,
    sandbox_id: str,
    egress: SocketService | None,
    gateway: SocketService | None,
) -> Listener | None:
    """The listener a sandbox of `spec` gets (None: no network namespace of its own, no
    listener). The backend's checks (`check_network`, `check_gateway`) ran before."""
    if spec.gateway is not None:
        assert gateway is not None  # check_gateway refused a spec without one
        return Listener(gateway, GATEWAY_PORT, spec.gateway)
    if spec.network:
        assert egress is not None  # check_network refused a spec without one
        if spec.egress_hosts:  # a task's own allow-list: only the server's proxy narrows
            assert isinstance(egress, EgressProxy)
            egress = egress.narrowed(spec.egress_hosts)
        return Listener(egress, PROXY_PORT, sandbox_id)
    return None
