"""Run inside a gateway sandbox: try every way out but the gateway, and to take its port.

argv[1] is JSON: {"host_port": a listener on the host's 127.0.0.1, "ext_ip", "ext_port": a
listener on the host's external address, "abstract": the name of an abstract unix socket
the host listens on}. Prints JSON {probe: "ok: …" | "blocked: …"}.
"""

import json
import socket
import sys
import urllib.request

GATEWAY = 4000
args = json.loads(sys.argv[1])
seen = {}


def attempt(name, fn):
    try:
        seen[name] = "ok: " + str(fn())
    except Exception as e:
        seen[name] = f"blocked: {type(e).__name__}: {e}"


def connect(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect((host, port))
        return f"connected to {host}:{port}"


def gateway(url="http://127.0.0.1:4000/v1/models"):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read().decode()


def bind(host, port, family=socket.AF_INET, reuseport=False):
    s = socket.socket(family, socket.SOCK_STREAM)
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(1)
    held.append(s)  # kept open: the gateway must still answer below
    return f"listening on {host}:{port}"


def udp_dns():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        header = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        query = header + b"\x07example\x03com\x00\x00\x01\x00\x01"
        s.sendto(query, ("8.8.8.8", 53))
        return s.recvfrom(512)


def abstract(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect("\0" + name)
        return s.recv(64)


held = []
attempt("gateway", gateway)
attempt("gateway_localhost", lambda: gateway("http://localhost:4000/v1/models"))
for port in (22, 80, 443, 3128, 5432, 6379, 8000, 8080, GATEWAY + 1, args["host_port"]):
    attempt(f"loopback_{port}", lambda port=port: connect("127.0.0.1", port))
attempt("loopback6_host_port", lambda: connect("::1", args["host_port"], socket.AF_INET6))
attempt("host_external", lambda: connect(args["ext_ip"], args["ext_port"]))
attempt("metadata", lambda: connect("169.254.169.254", 80))
attempt("public", lambda: connect("1.1.1.1", 443))
attempt("dns_resolve", lambda: socket.getaddrinfo("example.com", 443))
attempt("dns_udp", udp_dns)
attempt("abstract_unix", lambda: abstract(args["abstract"]))
attempt("docker_socket", lambda: socket.socket(socket.AF_UNIX).connect("/var/run/docker.sock"))
attempt("bind_4000", lambda: bind("127.0.0.1", GATEWAY))
attempt("bind_4000_any", lambda: bind("0.0.0.0", GATEWAY))
attempt("bind_4000_v6", lambda: bind("::1", GATEWAY, socket.AF_INET6))
attempt("bind_4000_reuseport", lambda: bind("127.0.0.1", GATEWAY, reuseport=True))
attempt("bind_4000_other_loopback", lambda: bind("127.0.0.2", GATEWAY))
attempt("gateway_after", gateway)
attempt("gateway_localhost_after", lambda: gateway("http://localhost:4000/v1/models"))
print(json.dumps(seen))
