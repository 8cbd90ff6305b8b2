"""The session proxy's three dialects (server/harness/proxy.py), in one place: what a
harness's request is as the chat request the upstream takes, and how a recorded answer
goes back to the harness, whole or as that dialect's stream. The live proxy and a resumed
session's replay (server/harness/replay.py) answer through the same `answer_reply`, so a
replayed call is byte for byte what the harness got the first time.
"""

from __future__ import annotations

import json
from typing import Any

from palaestra.sdk.harness import LlmApi
from palaestra.server.harness import anthropic, responses
from palaestra.server.harness.wire import JSON, SSE, Reply, openai_sse

OPENAI: LlmApi = "openai-chat"
ANTHROPIC: LlmApi = "anthropic-messages"
RESPONSES: LlmApi = "openresponses"


def to_chat(api: LlmApi, request: dict[str, Any]) -> dict[str, Any]:
    """The chat request of `request` in dialect `api` (MessagesError or ResponsesError when
    the translation refuses it; a chat request is itself)."""
    if api == ANTHROPIC:
        return anthropic.to_openai(request)
    if api == RESPONSES:
        return responses.to_chat(request)
    return request


def answer_reply(api: LlmApi, answer: dict[str, Any], stream: bool) -> Reply:
    """A 200 of `answer` (the harness's dialect), as that dialect streams it if asked."""
    if not stream:
        return Reply(200, json.dumps(answer).encode(), JSON)
    if api == ANTHROPIC:
        return Reply(200, anthropic.message_sse(answer), SSE)
    if api == RESPONSES:
        return Reply(200, responses.response_sse(answer), SSE)
    return Reply(200, openai_sse(answer), SSE)
