"""Episodes: how many live at once, their limits and the operator's ceilings, what one token
may hold, and which task the sampler hands out next."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EpisodeSettings(BaseModel):
    """Live episodes: how many at once, how long an idle one lives, what a client may ask of
    one (the oracle, group verification)."""

    model_config = ConfigDict(extra="forbid")

    max_episodes: int = Field(default=2048, ge=1, description="live episodes before 429")
    checkpoint_dir: Path | None = Field(
        default=None,
        description="where episode checkpoints keep their workspace snapshots (default "
        "<data_dir>/snapshots); in cluster mode a folder every node mounts, so that a lost "
        "node's checkpointed episodes resume on another",
    )
    checkpoint_harness: bool = Field(
        default=True,
        description="keep a harness episode's workspace as its harness starts (one archive, "
        "content-addressed) so that it can be checkpointed and resumed by replay; off: a "
        "harness episode's checkpoint is 409 harness_episode",
    )
    checkpoint_every_steps: int = Field(
        default=0,
        ge=0,
        description="checkpoint every live episode automatically each this many steps (a "
        "harness episode: model calls), in the background, so that a crash loses at most "
        "that many; 0: off, a client checkpoints when it wants",
    )
    checkpoint_retention_hours: float = Field(
        default=168.0,
        gt=0,
        allow_inf_nan=False,
        description="how long a resumable episode (its server stopped) waits for its resume; "
        "past it its checkpoint is deleted and the episode expires",
    )
    idle_ttl_s: float = Field(default=900.0, gt=0, description="idle episodes expire after this")
    reaper_interval_s: float = Field(default=5.0, gt=0)
    allow_oracle: bool = Field(
        default=True, description="let clients drive an episode with the task's oracle"
    )
    # Group rewards (server/groups.py): POST /v1/groups/verify.
    max_group_size: int = Field(
        default=16,
        ge=2,
        le=1024,
        description="episodes one group verify may judge together (422 over; a tournament's "
        "judge calls grow with its square; the judge's own MAX_GROUP caps it too)",
    )
    # The JSON-RPC doors (server/doors/mcp.py): what one request may ask of the server.
    jsonrpc_max_batch: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="messages in one JSON-RPC batch (MCP over HTTP, OpenEnv's /mcp); a longer "
        "batch is -32600 Invalid Request (HTTP 413), none of it run",
    )


class CeilingSettings(BaseModel):
    """An episode's default limits and the operator's ceilings (server/ceilings.py): the most
    any client option or task field may ask for; over one is a 422 naming the limit and the
    ceiling."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=50, ge=1, description="default step limit per episode")
    max_wall_s: float = Field(default=1800.0, gt=0, description="default wall-time limit")
    ceiling_steps: int = Field(default=10_000, ge=1, description="options.max_steps at most")
    ceiling_wall_s: float = Field(
        default=4 * 3600.0, gt=0, allow_inf_nan=False, description="options.max_wall_s at most"
    )
    ceiling_step_timeout_s: float = Field(
        default=600.0, gt=0, allow_inf_nan=False, description="options.step_timeout_s at most"
    )
    ceiling_output_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1, description="options.max_output_bytes (one step) at most"
    )
    ceiling_episode_output_bytes: int = Field(
        default=1 << 30, ge=1, description="options.max_episode_output_bytes at most"
    )
    ceiling_memory_mb: int = Field(default=16_384, ge=1, description="a sandbox's memory_mb")
    ceiling_cpus: float = Field(
        default=4.0, gt=0, allow_inf_nan=False, description="a sandbox's cpus"
    )
    ceiling_pids: int = Field(default=4096, ge=1, description="a sandbox's pids")
    ceiling_workspace_mb: int = Field(default=8192, ge=1, description="a sandbox's workspace_mb")
    ceiling_task_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        allow_inf_nan=False,
        description="a task's timeout_s, setup_timeout_s, verifier_timeout_s and exec timeouts",
    )
    ceiling_harness_calls: int = Field(
        default=1024, ge=1, description="options.harness.max_calls at most"
    )
    ceiling_harness_tokens: int = Field(
        default=4_000_000, ge=1, description="options.harness.max_tokens at most"
    )

    @model_validator(mode="after")
    def _defaults_fit(self) -> CeilingSettings:
        if self.max_steps > self.ceiling_steps or self.max_wall_s > self.ceiling_wall_s:
            raise ValueError("max_steps and max_wall_s must be within ceiling_steps/ceiling_wall_s")
        return self


class QuotaSettings(BaseModel):
    """Per-token quotas (server/tenancy.py): the defaults for tokens made without their own;
    admin tokens are bound only by a quota set on them. None: no cap."""

    model_config = ConfigDict(extra="forbid")

    token_max_live: int | None = Field(
        default=1024, ge=0, description="live episodes per token (default quota)"
    )
    token_max_episodes_per_hour: int | None = Field(
        default=None, ge=0, description="episode starts per token per hour (default quota)"
    )
    token_max_cpu_s_per_hour: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="sandbox CPU-seconds per token per hour (default quota)",
    )
    token_max_pending: int = Field(
        default=256,
        ge=1,
        description="detached batch steps (answered still_running) per token before 429",
    )
    token_max_pending_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="request bytes the detached batch steps of one token may hold while they "
        "run; a batch step past it (with some already pending) is 429",
    )
    token_max_checkpoints_per_hour: int = Field(
        default=600,
        ge=0,
        description="episode checkpoints (POST /v1/episodes/{id}/checkpoint) per token per "
        "hour before 429 (each stores a workspace archive; an episode keeps only its last)",
    )
    mcp_sessions_per_token: int = Field(
        default=64,
        ge=1,
        description="open MCP sessions per token (/v1/episodes/{id}/mcp); a new one past it "
        "ends the token's least recently used",
    )
    mcp_sessions_max: int = Field(
        default=16_384,
        ge=1,
        description="open MCP sessions on this server, all tokens together; an initialize past "
        "it is 429 (never the end of another token's session)",
    )
    ors_sessions_per_token: int = Field(
        default=1024,
        ge=1,
        description="open ORS sessions per token (POST /create); a new one past it ends the "
        "token's least recently used (its episode lives on until closed or idle)",
    )
    ors_sessions_max: int = Field(
        default=8192,
        ge=1,
        description="open ORS sessions on this server, all tokens together; a POST /create "
        "past it is 429 (never the end of another token's session)",
    )


class SamplerSettings(BaseModel):
    """The sampler (docs/sampler.md): mixture, curriculum, quarantine."""

    model_config = ConfigDict(extra="forbid")

    sampler_weights: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description=(
            "mixture weights by pack name ('openai/humaneval') or domain prefix "
            "('reasoning/arc_1d'); default 1; env: JSON or 'key=w,key=w'"
        ),
    )
    sampler_curriculum: bool = Field(
        default=True, description="weight tasks by their running success rate (frontier first)"
    )
    sampler_alpha: float = Field(
        default=2.0, ge=0, description="curriculum sharpness: w = floor + (1-floor)(4p(1-p))^alpha"
    )
    sampler_floor: float = Field(
        default=0.05, gt=0, le=1, description="curriculum weight of a solved/unsolvable task"
    )
    sampler_window: int = Field(
        default=32, ge=1, description="verified episodes per task in its running success rate"
    )
    sampler_void_window: int = Field(default=5, ge=1, description="episodes watched for voids")
    sampler_void_limit: int = Field(
        default=3, ge=1, description="voids among the last sampler_void_window that quarantine"
    )
    sampler_quarantine_s: float = Field(
        default=3600.0, ge=0, description="quarantine cool-down (0: until an admin releases it)"
    )
    sampler_history: int = Field(
        default=100_000, ge=0, description="recent episodes read at start to rebuild the stats"
    )

    @model_validator(mode="after")
    def _void_limit_fits(self) -> SamplerSettings:
        if self.sampler_void_limit > self.sampler_void_window:
            raise ValueError("sampler_void_limit must be at most sampler_void_window")
        return self
