"""What a model session (server/harness/proxy.py) records of each call, and how many bytes
(issue 34, invariant 2: bounded bytes, stored and held).

One rule. A call the upstream answered with ids is recorded whole (the trainer needs all
of it); before it is sent, its request is weighed against what the episode has recorded
(`llm_max_recorded_mb`) and what its token's live harness episodes have
(`token_max_llm_recorded_mb`): one that would pass either is refused (`Records.over`; the
proxy answers 400 `limit_reached` in the harness's dialect and the episode stops, a limit
the policy caused: truncated and verified, never void). So an episode stores at most its
cap and one call. Every other request whose body was read, refused by the upstream (its
4xx) or by the proxy (malformed, out of range, too large), is recorded too, as refused
(`error`, no ids): its request and reply are each kept to REFUSED_KEEP bytes, their head
and a marker `[truncated: N bytes over …]` in place of the rest, none of the head once the
episode is at its cap. A limit's own refusal is no record: the final record says the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from palaestra.sdk.harness import LlmApi, LlmCall
from palaestra.server.config import Settings

REFUSED_KEEP = 4096  # bytes of a refused call's request, and of its reply, in its record
UPSTREAM_ERROR_CHARS = 1000  # of a refusal's message kept in the call's record
Ids = tuple[list[int], list[int], list[float]]  # prompt ids, completion ids, logprobs


def kept(encoded: bytes, value: dict[str, Any] | None, keep: int) -> dict[str, Any]:
    """A refused call's request or reply as recorded: `value` whole when its JSON
    (`encoded`) is at most `keep` bytes, else its first `keep` bytes as text and a marker
    saying how many are not kept; no refusal is stored whole past REFUSED_KEEP."""
    if value is not None and len(encoded) <= keep:
        return value
    head: dict[str, Any] = {"head": encoded[:keep].decode("utf-8", "replace")}
    if len(encoded) > keep:
        over = len(encoded) - keep
        head["truncated"] = f"[truncated: {over} bytes over the {keep} a refused call keeps]"
    return head


def upstream_error(status: int, reply: dict[str, Any] | None, raw: bytes) -> str:
    """`HTTP <status>: <message>` of a model server's 4xx: OpenAI's `{"error": {"message"}}`,
    vLLM's older top-level `message`, else the body's first characters."""
    error = (reply or {}).get("error")
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        top = (reply or {}).get("message")
        message = top if isinstance(top, str) else raw[:500].decode(errors="replace")
    return f"HTTP {status}: {message}"[:UPSTREAM_ERROR_CHARS]


@dataclass
class Records:
    """One session's call records: the next index, and the bytes they hold (the JSON of
    each `LlmCall`, as the trajectory stores and serves it)."""

    settings: Settings
    count: int = 0
    held: int = 0  # bytes of the records so far

    @property
    def cap(self) -> int:
        return self.settings.llm_max_recorded_mb << 20

    def over(self, size: int, token: int) -> str | None:
        """Which cap a `size`-byte request would take the records past (`token`: what the
        token's live sessions hold), if any: the limit's reason."""
        s = self.settings
        if self.held + size > self.cap:
            return (
                f"llm_max_recorded_mb: the episode's model calls recorded {self.held} bytes; "
                f"a request of {size} more would pass its {s.llm_max_recorded_mb} MiB"
            )
        if token + size > s.token_max_llm_recorded_mb << 20:
            return (
                f"token_max_llm_recorded_mb: this token's live harness episodes recorded "
                f"{token} bytes; a request of {size} more would pass its "
                f"{s.token_max_llm_recorded_mb} MiB"
            )
        return None

    def replayed(self, call: LlmCall) -> int:
        """A captured call answered again at a resume (server/harness/replay.py): counted as
        when it was made, its bytes (as `call` weighed them) returned."""
        size = len(to_json(call.request)) + len(call.model_dump_json(exclude={"request"}))
        self.count = call.index + 1
        self.held += size
        return size

    def call(
        self,
        api: LlmApi,
        request: dict[str, Any] | None,
        sent: int | bytes | None,
        response: dict[str, Any] | None,
        received: bytes | None,
        upstream: tuple[dict[str, Any], Ids] | None,
        *,
        stream: bool,
        started_at: float,
        upstream_s: float,
        t0: float,
        error: str | None = None,
    ) -> tuple[LlmCall, int]:
        """The next record and its bytes, counted. `sent` is the request's JSON size when it
        is kept whole (a call with ids), else what to keep the head of for a refused call
        (the body as received; None: `request`'s JSON); `received` is a refused call's reply
        as received (None: no reply)."""
        if isinstance(sent, int):
            kept_request, request_bytes = request or {}, sent
        else:
            keep = REFUSED_KEEP if self.held < self.cap else 0
            kept_request = kept(to_json(request) if sent is None else sent, request, keep)
            if received is not None:
                response = kept(received, response, keep)
            request_bytes = len(to_json(kept_request))
        reply, (prompt, completion, logprobs) = upstream or ({}, ([], [], []))
        usage = reply.get("usage") or {}
        choices = reply.get("choices") or [{}]
        call = LlmCall(
            index=self.count,
            api=api,
            request=kept_request,
            response=response or {},
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=logprobs,
            finish_reason=choices[0].get("finish_reason"),
            usage={k: v for k, v in usage.items() if type(v) is int},
            started_at=started_at,
            upstream_s=upstream_s,
            proxy_s=time.perf_counter() - t0,
            stream=stream,
            error=error,
        )
        size = request_bytes + len(call.model_dump_json(exclude={"request"}))
        self.count += 1
        self.held += size
        return call, size
