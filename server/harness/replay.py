"""Deterministic replay of a harness episode's model calls: how a checkpointed harness
episode resumes (server/checkpoint.py; docs/harness.md, "Checkpoint and resume").

A harness process cannot be frozen, so its checkpoint is its capture: the calls its model
session recorded (each `LlmCall`, in the trajectory, with its token ids and logprobs), the
digest of each kept in the checkpoint, and the workspace as the harness found it at its
start. A resume restores that workspace, starts the harness again on the same
instruction, and its session answers the harness's calls from the capture, in order, each
only if the request is the recorded one (the same JSON, keys in any order); after the last
captured call it goes live, on the policy's model. A harness that asks something else, in
another dialect, or stops before the capture is used up has diverged: its episode ends
void, `resume_failed`, naming the call and why. Replayed calls are not recorded again
(they are the trajectory already), so the resumed trajectory is the one checkpointed plus
the new calls. A checkpoint whose trajectory no longer matches its digests is refused the
same way before anything starts.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from typing import Any

from pydantic import BaseModel

from palaestra.sdk.harness import LlmApi, LlmCall
from palaestra.server.harness import anthropic
from palaestra.server.harness.dialects import ANTHROPIC, answer_reply
from palaestra.server.harness.records import REFUSED_KEEP, kept
from palaestra.server.harness.wire import Reply, openai_error


class HarnessCapture(BaseModel):
    """What a harness episode's checkpoint keeps besides its start workspace."""

    instruction: str  # the task's first observation, the harness's instruction
    calls: list[str] = []  # call_digest of each recorded call, in order
    # Seconds into the episode its harness started: a resume's clock restarts there, as the
    # harness does (its replay spends again what its commands took; None: an older capture).
    started_s: float | None = None

    @staticmethod
    def spent(capture: HarnessCapture | None, elapsed_s: float) -> float:
        """The seconds a resumed episode has spent: a harness episode's, those before its
        harness started (the harness starts again and replays what it did, at its cost)."""
        if capture is None or capture.started_s is None:
            return elapsed_s
        return min(capture.started_s, elapsed_s)


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def call_digest(call: dict[str, Any]) -> str:
    """The digest of one recorded call (its `LlmCall` as JSON, as the trajectory keeps it)."""
    return "sha256:" + hashlib.sha256(canonical(call)).hexdigest()


def _short(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class Replay:
    """A resumed session's captured calls still to answer."""

    def __init__(self, calls: list[LlmCall]) -> None:
        self.pending: deque[LlmCall] = deque(calls)
        self.total = len(calls)

    @property
    def done(self) -> int:
        return self.total - len(self.pending)

    def diverges(self, api: LlmApi, raw: bytes) -> str | None:
        """Why the harness's request `raw` is not the next captured call's (None: it is)."""
        call = self.pending[0]
        if api != call.api:
            return f"the harness called {api}, the recorded call was {call.api}"
        try:
            parsed: Any = json.loads(raw)
        except (ValueError, RecursionError):
            parsed = None
        recorded = canonical(call.request)
        forms = [parsed] if isinstance(parsed, dict) else []
        forms += [kept(raw, parsed if isinstance(parsed, dict) else None, k)
                  for k in (REFUSED_KEEP, 0)]  # fmt: skip
        if any(canonical(form) == recorded for form in forms):
            return None
        sent = canonical(parsed) if isinstance(parsed, dict) else raw
        where = _first_difference(call.request, parsed)
        return (
            f"its request differs from the recorded one{where} (sha256 {_short(recorded)}… "
            f"recorded, {_short(sent)}… sent)"
        )

    def answer(self) -> tuple[LlmCall, Reply]:
        """The next captured call, taken, and the reply the harness got for it."""
        call = self.pending.popleft()
        return call, reply_of(call)


def _first_difference(recorded: dict[str, Any], sent: Any) -> str:
    """`: messages[3] differs` where both are chat requests, else a field name."""
    if not isinstance(sent, dict):
        return ": the request sent is not a JSON object"
    for name in ("messages", "input"):  # chat and Messages; Responses
        old, new = recorded.get(name), sent.get(name)
        if isinstance(old, list) and isinstance(new, list):
            for k, (a, b) in enumerate(zip(old, new, strict=False)):
                if canonical(a) != canonical(b):
                    return f": {name}[{k}] differs"
            if len(old) != len(new):
                return f": {len(new)} {name} sent, {len(old)} recorded"
    for key in sorted(set(recorded) | set(sent)):
        if (
            key not in recorded
            or key not in sent
            or canonical(recorded[key]) != canonical(sent[key])
        ):
            return f": field {key!r} differs"
    return ""


def reply_of(call: LlmCall) -> Reply:
    """What the harness got for a recorded call: the answer (streamed again if it asked for
    a stream), or the refusal's status and message."""
    if call.error is None:
        return answer_reply(call.api, call.response, call.stream)
    status = 400
    head = call.error.split(":", 1)[0]
    if head.startswith("HTTP ") and head[5:].isdigit():
        status = int(head[5:])
    if call.api == ANTHROPIC:
        return anthropic.anthropic_error(status, call.error)
    if isinstance(call.response.get("error"), dict):
        return Reply.json(status, call.response)
    return openai_error(status, call.error, "replayed")
