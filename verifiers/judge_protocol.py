"""What a judge verifier needs from the server: a chat endpoint and a verdict cache.

A family's verifier never builds an HTTP client of its own for a judge. It asks
`ctx.judges.get(name)` for the operator's endpoint of that name (Settings.judges), whose
concurrency cap, deadline and retry budget are shared by every episode on the server, and
hands it to the judge logic in `palaestra.verifiers.judge`. Everything here is a Protocol or
a plain value, so the judge logic can be tested against any endpoint and the server can
swap the transport without touching a family.

Faults split as DESIGN §3 says: `JudgeUnavailable` is the judge's fault (endpoint down, 5xx,
timeout, budget or deadline spent, output still malformed after its retries) and makes the
episode void with its reason; nothing the candidate wrote may raise it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class JudgeUnavailable(Exception):
    """The judge gave no verdict, for a reason the policy cannot cause: the episode is void."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"judge {endpoint!r} unavailable: {reason}")
        self.endpoint = endpoint
        self.reason = reason


@dataclass(frozen=True)
class JudgeSampling:
    """The sampling a judge call asks for; recorded in every verdict it gives."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = 0


class JudgeChat(Protocol):
    """One OpenAI-compatible judge endpoint, shared by every episode on the server."""

    @property
    def name(self) -> str:
        """The operator's name for the endpoint (the metrics label, the void reason)."""
        ...

    @property
    def model(self) -> str:
        """The model the endpoint is asked for (recorded in verdicts)."""
        ...

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        sampling: JudgeSampling,
        *,
        schema: Mapping[str, Any] | None = None,
    ) -> str:
        """The text of one chat completion. Transport faults (429 with Retry-After, 5xx,
        a refused connection) are retried within the endpoint's shared retry budget and
        deadline; raises JudgeUnavailable when no answer can come. `schema` asks for
        structured output (`response_format` json_schema) where the endpoint honours it;
        the text is never parsed here."""
        ...


class JudgeCache(Protocol):
    """Judgements by key: (task digest, final-state digest, judge config digest)."""

    def get(self, key: str) -> Mapping[str, Any] | None: ...

    def put(self, key: str, value: Mapping[str, Any]) -> None: ...


class Judges(Protocol):
    """The server's judge endpoints, as a family's verifier sees them (`ctx.judges`)."""

    def get(self, name: str) -> JudgeChat:
        """The endpoint `name`; raises JudgeUnavailable where the operator has none."""
        ...

    @property
    def cache(self) -> JudgeCache | None: ...


class NoJudges:
    """The judges of a server (or a test) that has none configured."""

    def get(self, name: str) -> JudgeChat:
        raise JudgeUnavailable(name, "no judge endpoint of that name is configured")

    @property
    def cache(self) -> JudgeCache | None:
        return None
