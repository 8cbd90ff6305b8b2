"""Session model proxy overhead (issue 20): what a model call through the proxy adds over
calling the model server directly, measured beside the direct call in the same run.

The upstream is a FAST SCRIPTED FAKE, not a model: a raw asyncio HTTP/1.1 server that
answers every POST with one canned chat completion carrying vLLM's `prompt_token_ids`,
`token_ids` and logprobs (64 prompt, 16 completion tokens), so nearly all the time measured
is transport and proxy work. Three paths to it, one keep-alive connection a client:

- direct: the generator posts to the upstream itself (with the token-id fields the proxy
  adds, so the upstream's work is the same);
- gateway: a session's gateway listener (server/harness/gateway.py), one per session, as a
  sandbox reaches it at 127.0.0.1:4000; in process to `session.handle`;
- route: `POST /v1/episodes/{id}/llm/v1/chat/completions` on the server's app (uvicorn,
  httptools, StepFastPath in front).

The proxy (SessionProxy + gateways + the app) and the upstream run as two subprocesses;
this process is the load generator (bench/apiservers.py's raw keep-alive client). Recording
a call is the runner's `on_call` (a store write), not measured here: `on_call` is a no-op.
Figures: p50/p99 per call at 1 client (added = path - direct), and calls/s with 64
concurrent sessions (64 connections, one session each).

    .venv/bin/python bench/harness_proxy.py            # 3 rounds, 5 s a phase
    .venv/bin/python bench/harness_proxy.py --quick    # 1 round, 2 s a phase
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apiservers import CLK_TCK, Conn, checked, connect, free_port, post  # bench/apiservers.py

CONCURRENT = 64
BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
ASKED = {**BODY, "return_token_ids": True, "logprobs": True, "stream": False}
OWNER = "embedded-admin"  # the principal of a server with auth = "off"


# -- the fake upstream (its own process) ------------------------------------------------------
def canned_reply() -> bytes:
    ids = list(range(100, 116))
    reply = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "policy",
        "prompt_token_ids": list(range(1, 65)),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * 64, "tool_calls": []},
                "finish_reason": "length",
                "token_ids": ids,
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{i}", "logprob": -0.25, "bytes": [120]} for i in ids
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 64, "completion_tokens": 16, "total_tokens": 80},
    }
    body = json.dumps(reply).encode()
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


class _Upstream(asyncio.Protocol):
    """Keep-alive HTTP/1.1: every request (Content-Length bodies) gets the canned reply."""

    reply = canned_reply()

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buf[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            assert self.transport is not None
            self.transport.write(self.reply)


async def serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Upstream, "127.0.0.1", port)
    await server.serve_forever()


# -- the proxy (its own process) --------------------------------------------------------------
async def serve_proxy(upstream: int, port: int, sessions: int, data_dir: Path) -> None:
    import uvicorn

    from palaestra.sdk.harness import HarnessOptions
    from palaestra.server.app import create_app
    from palaestra.server.config import Settings
    from palaestra.server.harness.proxy import SessionProxy
    from palaestra.server.runtime import build_manager

    settings = Settings(data_dir=data_dir, auth="off", pool_size=0, log_level="warning")
    manager = build_manager(settings)
    proxy = SessionProxy(settings)
    manager.services.sessions = proxy
    options = HarnessOptions(
        name="bench", model_endpoint=f"http://127.0.0.1:{upstream}/v1", model="policy"
    )
    gateways = []
    for i in range(sessions):
        key = f"bench-{i}"
        proxy.open(key, options, owner=OWNER, max_calls=10**12, max_tokens=10**15,
                   on_call=lambda call: None)  # fmt: skip
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        gateways.append(sock.getsockname()[1])
        await proxy.gateway.serve(sock, key)
    (data_dir / "gateways.json").write_text(json.dumps(gateways))
    app = create_app(settings, manager=manager)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools"
    )
    await uvicorn.Server(config).serve()


# -- the generator ----------------------------------------------------------------------------
@dataclass
class Path_:
    name: str
    ports: list[int]  # one a session (direct: the upstream's, repeated)
    requests: list[bytes]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def one_client(path: Path_, calls: int) -> list[float]:
    conn = await connect(path.ports[0])
    try:
        for _ in range(50):
            await checked(conn, path.requests[0])
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await checked(conn, path.requests[0])
            out.append(time.perf_counter() - t0)
        return out
    finally:
        conn.close()


async def concurrent(path: Path_, seconds: float) -> tuple[float, list[float]]:
    conns: list[Conn] = [await connect(p) for p in path.ports[:CONCURRENT]]
    stop = time.perf_counter() + seconds
    latencies: list[float] = []

    async def loop(conn: Conn, request: bytes) -> int:
        n = 0
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await checked(conn, request)
            latencies.append(time.perf_counter() - t0)
            n += 1
        return n

    try:
        t0 = time.perf_counter()
        pairs = zip(conns, path.requests, strict=False)
        done = await asyncio.gather(*(loop(c, r) for c, r in pairs))
        return sum(done) / (time.perf_counter() - t0), latencies
    finally:
        for c in conns:
            c.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@contextlib.contextmanager
def processes(workdir: Path) -> Iterator[tuple[int, int, list[int], int]]:
    """(upstream port, proxy port, gateway ports, proxy pid) of the two subprocesses."""
    up, app = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    me = [sys.executable, str(Path(__file__).resolve())]
    log = (workdir / "procs.log").open("wb")
    procs = [
        subprocess.Popen([*me, "--role", "upstream", "--port", str(up)], env=env,
                         stdout=log, stderr=log),
        subprocess.Popen([*me, "--role", "proxy", "--port", str(app), "--upstream", str(up),
                          "--data-dir", str(workdir / "data")], env=env, stdout=log, stderr=log),
    ]  # fmt: skip
    try:
        ready = workdir / "data" / "gateways.json"
        deadline = time.monotonic() + 120
        while True:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise SystemExit(f"a bench process failed:\n{(workdir / 'procs.log').read_text()}")
            if ready.exists():
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", app), 1):
                    break
            time.sleep(0.1)
        yield up, app, json.loads(ready.read_text()), procs[1].pid
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-harness-", dir=args.workdir) as tmp:
        workdir = Path(tmp)
        (workdir / "data").mkdir()
        with processes(workdir) as (up, app, gateways, proxy_pid):
            paths = [
                Path_("direct", [up] * CONCURRENT, [post("/v1/chat/completions", ASKED, up)]
                      * CONCURRENT),
                Path_("gateway", gateways, [post("/v1/chat/completions", BODY, g)
                                            for g in gateways]),
                Path_("route", [app] * CONCURRENT,
                      [post(f"/v1/episodes/bench-{i}/llm/v1/chat/completions", BODY, app)
                       for i in range(CONCURRENT)]),
            ]  # fmt: skip
            rounds: list[dict[str, dict[str, float]]] = []
            for r in range(args.rounds):
                row: dict[str, dict[str, float]] = {}
                for path in paths:
                    lat = await one_client(path, args.calls)
                    cpu0 = cpu_s(proxy_pid)
                    rate, lat64 = await concurrent(path, args.seconds)
                    cpu = (cpu_s(proxy_pid) - cpu0) / max(1, len(lat64)) * 1e6
                    row[path.name] = {
                        "p50_ms": pct(lat, 0.5),
                        "p99_ms": pct(lat, 0.99),
                        "calls_per_s_64": rate,
                        "p50_ms_64": pct(lat64, 0.5),
                        "p99_ms_64": pct(lat64, 0.99),
                        "proxy_cpu_us_per_call_64": 0.0 if path.name == "direct" else cpu,
                    }
                    print(f"round {r + 1} {path.name:8s} p50 {row[path.name]['p50_ms']:.3f} ms"
                          f"  64 sessions: {rate:,.0f} calls/s", file=sys.stderr)  # fmt: skip
                rounds.append(row)
    return report(rounds)


def report(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    med = {
        name: {k: statistics.median(r[name][k] for r in rounds) for k in rounds[0][name]}
        for name in rounds[0]
    }
    direct = med["direct"]
    print()
    print("Fast scripted upstream (a fake: canned reply with token ids), "
          f"median of {len(rounds)} round(s):")  # fmt: skip
    print()
    print("| path    | p50 ms | p99 ms | added p50 ms | added p99 ms | calls/s @64 | "
          "p50 ms @64 | proxy µs/call @64 |")  # fmt: skip
    print("| ------- | ------ | ------ | ------------ | ------------ | ----------- | "
          "---------- | ----------------- |")  # fmt: skip
    for name, m in med.items():
        added50 = m["p50_ms"] - direct["p50_ms"] if name != "direct" else 0.0
        added99 = m["p99_ms"] - direct["p99_ms"] if name != "direct" else 0.0
        cpu = f"{m['proxy_cpu_us_per_call_64']:.0f}" if name != "direct" else "-"
        print(f"| {name:7s} | {m['p50_ms']:6.3f} | {m['p99_ms']:6.3f} | {added50:12.3f} | "
              f"{added99:12.3f} | {m['calls_per_s_64']:11,.0f} | {m['p50_ms_64']:10.3f} | "
              f"{cpu:>17s} |")  # fmt: skip
    print()
    for name in ("gateway", "route"):
        ratio = med[name]["calls_per_s_64"] / direct["calls_per_s_64"]
        print(f"{name}: calls/s at 64 sessions = {ratio:.2f}x direct; added p50 "
              f"{med[name]['p50_ms'] - direct['p50_ms']:.3f} ms a call")  # fmt: skip
    return {"rounds": rounds, "median": med}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s a phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="each 64-session phase")
    parser.add_argument("--calls", type=int, default=1000, help="1-client calls a path")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--role", choices=["bench", "upstream", "proxy"], default="bench")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    if args.role == "upstream":
        asyncio.run(serve_upstream(args.port))
        return 0
    if args.role == "proxy":
        assert args.data_dir is not None
        asyncio.run(serve_proxy(args.upstream, args.port, CONCURRENT, args.data_dir))
        return 0
    if args.quick:
        args.rounds, args.seconds, args.calls = 1, 2.0, 300
    figures = asyncio.run(run(args))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
