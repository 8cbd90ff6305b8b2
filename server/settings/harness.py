"""Harness mode (server/harness/, docs/harness.md): what a reset's options["harness"] may
name and ask for, and the session model proxy's bounds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HarnessSettings(BaseModel):
    """Harness mode: the model endpoints an episode may name, its default call and token
    budgets (their ceilings are CeilingSettings'), and the session proxy's limits."""

    model_config = ConfigDict(extra="forbid")

    harness_endpoints: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "localhost", "::1"],
        description=(
            "hosts (host or host:port) a harness episode's model_endpoint may name; "
            "default loopback only"
        ),
    )
    harness_max_calls: int = Field(
        default=64, ge=1, description="model calls of a harness episode without max_calls"
    )
    harness_max_tokens: int = Field(
        default=65_536, ge=1, description="completion tokens of a harness episode by default"
    )
    harness_probe_timeout_s: float = Field(
        default=5.0,
        gt=0,
        allow_inf_nan=False,
        description="how long reset waits for a harness model endpoint's GET /models",
    )
    # The session model proxy.
    llm_call_timeout_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="one model call through the session proxy, upstream included (void past it)",
    )
    llm_max_request_kb: int = Field(
        default=8192, ge=1, description="a harness's model call body at most, KiB (413 over)"
    )
    llm_max_response_kb: int = Field(
        default=32768, ge=1, description="an upstream model reply at most, KiB (void over)"
    )
    llm_max_recorded_mb: int = Field(
        default=64,
        ge=1,
        description=(
            "model-call bytes (requests, replies, ids; refused calls too) one harness "
            "episode records at most, MiB: a call whose request would pass it is refused "
            "(400 limit_reached) and the episode ends truncated, verified"
        ),
    )
    token_max_llm_recorded_mb: int = Field(
        default=1024,
        ge=1,
        description=(
            "model-call bytes the live harness episodes of one token record at most, MiB "
            "(a node's own sessions): the call that would pass it is refused as "
            "llm_max_recorded_mb's and its episode ends truncated"
        ),
    )
