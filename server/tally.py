"""Per-episode process metrics, counted step by step (DESIGN §3: `EpisodeState.metrics`).

Counting happens on every step of every episode, so it is a plain slotted dataclass; the
wire model `EpisodeMetrics` is built from it when the state is read or stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from palaestra.sdk.models import EpisodeMetrics


@dataclass(slots=True)
class StepTally:
    steps: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    invalid_actions: int = 0
    timed_out: int = 0
    output_bytes: int = 0

    def add_step(self, *, tool_ok: bool, timed_out: bool, output_bytes: int) -> None:
        """Count one stepped action (what the family's StepOutcome said, envs/base.py)."""
        self.steps += 1
        self.tool_calls += 1
        if not tool_ok:
            self.tool_failures += 1
        if timed_out:
            self.timed_out += 1
        self.output_bytes += output_bytes

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
