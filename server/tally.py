"""Per-episode process metrics, counted step by step (DESIGN §3: `EpisodeState.metrics`).

Counting happens on every step of every episode, so it is a plain slotted dataclass; the
wire model `EpisodeMetrics` is built from it when the state is read or stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from palaestra.sdk.models import EpisodeMetrics, StepResponse


@dataclass(slots=True)
class StepTally:
    steps: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    invalid_actions: int = 0
    timed_out: int = 0
    output_bytes: int = 0

    def add_step(self, reply: StepResponse) -> None:
        """Count one stepped action: what the family reported in `info` (`tool_ok`,
        `timed_out`, `output_bytes`), else a call that ran (a void step failed) and the
        size of its observation."""
        info = reply.info
        self.steps += 1
        self.tool_calls += 1
        if not info.get("tool_ok", info.get("status") != "void"):
            self.tool_failures += 1
        if info.get("timed_out"):
            self.timed_out += 1
        size = info.get("output_bytes")
        if not isinstance(size, int):
            size = len(reply.observation.text.encode("utf-8", errors="replace"))
        self.output_bytes += size

    def add_refused(self) -> None:
        """A refused (422) action: a failed tool call, not a step."""
        self.tool_calls += 1
        self.tool_failures += 1
        self.invalid_actions += 1

    def model(self) -> EpisodeMetrics:
        rate = round(1 - self.tool_failures / self.tool_calls, 6) if self.tool_calls else None
        return EpisodeMetrics(
            steps=self.steps,
            tool_calls=self.tool_calls,
            tool_failures=self.tool_failures,
            invalid_actions=self.invalid_actions,
            tool_success_rate=rate,
            timed_out=self.timed_out,
            output_bytes=self.output_bytes,
        )
