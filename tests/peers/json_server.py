"""A JSON-over-HTTP server on 127.0.0.1 for the tests' scripted fakes (judges, models).

Each fake says what to answer a POST body; this module owns the sockets, the thread and
the reply framing, so the fakes differ only in what they decide.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any


@dataclass
class JsonReply:
    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


Answer = Callable[[str, dict[str, Any]], JsonReply]  # (path, JSON body) -> reply


def error_reply(status: int, message: str, headers: Mapping[str, str] | None = None) -> JsonReply:
    return JsonReply(status, {"error": {"message": message, "code": status}}, headers or {})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog: the default 5 refuses connections when a test's dozens of
    # concurrent judge calls arrive faster than the accept thread (a loaded CI machine).
    request_queue_size = 256


@contextmanager
def serve_json(
    answer: Answer, *, get: Callable[[str], JsonReply] | None = None, suffix: str = "/v1"
) -> Iterator[str]:
    """Serve `answer` on a free loopback port while the block runs; yields the base URL
    (`http://127.0.0.1:PORT` + `suffix`). A client that hangs up mid-reply is ignored."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            size = int(self.headers.get("content-length", "0"))
            self._send(answer(self.path, json.loads(self.rfile.read(size) or b"{}")))

        def do_GET(self) -> None:
            self._send(get(self.path) if get is not None else error_reply(404, "no GET here"))

        def _send(self, reply: JsonReply) -> None:
            data = json.dumps(reply.body).encode()
            try:
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a slow reply past its timeout)

    server = _Server(("127.0.0.1", 0), Handler)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{suffix}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
