"""Run inside a sandbox with internet access: every way out it tries, as one line of JSON.

argv: the allowed mirror's port, the "server" port (never to be reached), the real package
mirror's address as the host resolved it ("-": none reachable here). Each check is
"ok: ..." (the way worked) or "blocked: ..." (it did not), with what was seen.
"""

import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request

MIRROR, SERVER, REAL = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
PROXY = ("127.0.0.1", int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1]))


def proxied(url: str) -> str:
    """A plain-http fetch through $HTTP_PROXY, as a client sends it (no_proxy aside)."""
    try:
        s = socket.create_connection(PROXY, timeout=20)
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while len(reply) < 4096 and (chunk := s.recv(4096)):
            reply += chunk
    except OSError as e:
        return f"blocked: {e}"
    text = reply.decode(errors="replace")
    head, _, body = text.partition("\r\n\r\n")
    status = head.split(" ", 2)[1] if " " in head else "?"
    return f"{'ok' if status == '200' else 'blocked'}: {status} {body[:300]}"


def fetch(url: str) -> str:
    """A fetch by urllib, which finds the proxy in the environment."""
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return f"ok: {r.status} {r.read(200).decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return f"blocked: {e.code} {e.read(300).decode(errors='replace')}"
    except OSError as e:
        return f"blocked: {e}"


def tunnel(host: str, port: int, tls: bool = False, path: str = "/tunnel") -> str:
    """CONNECT host:port through the proxy, then one GET inside the tunnel."""
    try:
        s = socket.create_connection(PROXY, timeout=20)
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        status = head.split(b"\r\n", 1)[0].decode(errors="replace")
        if " 200 " not in status:
            return f"blocked: {head.decode(errors='replace')[:400]}"
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the farm's own CA
            s = ctx.wrap_socket(s, server_hostname=host)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        body = b""
        while len(body) < 4096 and (chunk := s.recv(4096)):
            body += chunk
        return f"ok: {body.decode(errors='replace')[:200]}"
    except OSError as e:
        return f"blocked: {e}"


def direct(host: str, port: int) -> str:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return f"ok: connected to {host}:{port}"
    except OSError as e:
        return f"blocked: {e}"


def udp_dns() -> str:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        query = b"\x12\x34\x01\x00\x00\x01" + b"\x00" * 6 + b"\x00\x00\x01\x00\x01"
        s.sendto(query, ("8.8.8.8", 53))
        return f"ok: {s.recv(512)!r}"
    except OSError as e:
        return f"blocked: {e}"


def resolve(name: str) -> str:
    try:
        return f"ok: {socket.getaddrinfo(name, 443)}"
    except OSError as e:
        return f"blocked: {e}"


def raw() -> str:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
        return "ok: raw socket"
    except OSError as e:
        return f"blocked: {e}"


out = {
    "mirror_plain": proxied(f"http://localhost:{MIRROR}/plain"),
    "mirror_connect": tunnel("localhost", MIRROR),
    "disallowed_host": proxied("http://example.com/"),
    "disallowed_connect": tunnel("example.com", 443),
    "metadata_literal": proxied("http://169.254.169.254/latest/meta-data/"),
    "metadata_connect": tunnel("169.254.169.254", 80),
    "loopback_literal": tunnel("127.0.0.1", SERVER),
    "loopback_name": tunnel("localhost", SERVER),
    "server_plain": proxied(f"http://localhost:{SERVER}/"),
    "direct_mirror": direct("127.0.0.1", MIRROR),
    "direct_server": direct("127.0.0.1", SERVER),
    "direct_public": direct("1.1.1.1", 443),
    "udp_dns": udp_dns(),
    "resolve": resolve("pypi.org"),
    "raw_socket": raw(),
}
if REAL != "-":
    out["real_plain"] = fetch("http://deb.debian.org/debian/")
    out["real_pypi"] = tunnel("pypi.org", 443, tls=True, path="/simple/six/")
    out["direct_real"] = direct(REAL, 443)
print(json.dumps(out))
