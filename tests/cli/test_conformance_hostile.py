"""`palaestra conformance` against a hostile server (red team): a server answering 500s,
redirects to another host, an endless body, a drip-fed one, one that never answers, JSON
nested past the parser's depth, JSON of the wrong shape. Every check fails with a reason
(none passes: a 200 naming no session opened none), within its deadline and MAX_REPLY_BYTES
of memory; the command exits 1, no traceback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import cli_env

from palaestra.cli.conformance import FAIL, MAX_REPLY_BYTES, NA, conform
from palaestra.cli.conformance_drivers import PROTOCOLS

CLI = str(Path(sys.executable).parent / "palaestra")
MODES = ["500", "redirect", "endless", "drip", "silent", "deep", "list", "garbage"]


class Hostile(BaseHTTPRequestHandler):
    mode = "500"

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        mode = type(self).mode
        try:
            if mode == "silent":
                time.sleep(30)
                return
            if mode == "redirect":
                self.send_response(307)
                self.send_header("Location", "http://elsewhere.invalid/steal")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if mode in ("endless", "drip"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"episode_id": "')
                chunk = b"a" * (1 << 20) if mode == "endless" else b"a"
                for _ in range(100_000):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    if mode == "drip":
                        time.sleep(0.05)
                return
            status, body = {
                "500": (500, b'{"detail": "boom"}'),
                "deep": (200, b"[" * 100_000 + b"]" * 100_000),
                "list": (200, b"[1, 2, 3]"),
                "garbage": (200, b"\xff\xfe not json"),
            }[mode]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_POST = do_DELETE = _answer


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", MODES)
async def test_every_check_fails_in_bounded_time(hostile: str, mode: str, protocol: str) -> None:
    Hostile.mode = mode
    started = time.monotonic()
    results = await conform(hostile, protocol, token="secret", deadline_s=0.5)
    took = time.monotonic() - started
    assert results and all(r.result in (FAIL, NA) for r in results), results  # no false pass
    assert any(r.result == FAIL for r in results)
    assert took < 1.5 * len(results) + 5, took
    if mode == "endless":
        assert any(str(MAX_REPLY_BYTES) in r.reason or "within" in r.reason for r in results)


def test_the_command_exits_1_without_a_traceback(hostile: str) -> None:
    Hostile.mode = "deep"
    for protocol in PROTOCOLS:
        ran = subprocess.run(
            [CLI, "conformance", hostile, "--protocol", protocol, "--json"],
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 1, ran.stderr[-2000:]
        assert "Traceback" not in ran.stderr and '"fail"' in ran.stdout, protocol
