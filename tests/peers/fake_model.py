"""FakeModel: a scripted OpenAI chat-completions server on loopback (a fake, named so).

The real model server (sdk/train/openai_server.py over a tiny model) only produces
garbage or one fixed call; a harness test that needs a *sensible* agent (run `bash`, then
`submit`) scripts the replies here. Each reply is a chat message dict (`content`,
`tool_calls`) or an int (answer that HTTP status). The server records every request body.
Token ids are made up per call (prompt: one id per message; completion: 1, 2, …) so a
proxy that asks for them gets some; they are not a tokenizer's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = dict[str, Any] | int


def bash_call(command: str, call_id: str = "call_bash") -> dict[str, Any]:
    """An assistant message calling `bash` with `command`."""
    arguments = json.dumps({"command": command})
    call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
    return {"content": None, "tool_calls": [call]}


def submit_call() -> dict[str, Any]:
    call = {
        "id": "call_submit",
        "type": "function",
        "function": {"name": "submit", "arguments": "{}"},
    }
    return {"content": None, "tool_calls": [call]}


class FakeModel:
    """Answers `replies` in order (the last one again once they run out)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def next_reply(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.append(body)
            return self.replies[min(len(self.requests), len(self.replies)) - 1]

    def completion(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        ids = list(range(1, 4))
        calls = message.get("tool_calls") or []
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": message.get("content"),
                "tool_calls": calls,
            },
            "finish_reason": "tool_calls" if calls else "stop",
            "token_ids": ids,
            "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.5} for i in ids]},
        }
        prompt = list(range(100, 100 + len(body.get("messages", []))))
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [choice],
            "prompt_token_ids": prompt,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
        }

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1 (a free port) while the block runs; yields the `/v1` base URL."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(size) or b"{}")
                reply = fake.next_reply(body)
                if isinstance(reply, int):
                    self._send(reply, {"error": {"message": "scripted failure", "code": reply}})
                else:
                    self._send(200, fake.completion(body, reply))

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
