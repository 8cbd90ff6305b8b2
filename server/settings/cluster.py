"""Cluster mode (server/cluster/, docs/operations.md): episodes on Ray workers."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class ClusterSettings(BaseModel):
    """Cluster mode: the Ray cluster episodes run on, what each worker hosts, how often a
    front polls them."""

    model_config = ConfigDict(extra="forbid")

    ray: str = Field(
        default="",
        description=(
            "run episodes on Ray workers: a cluster address (host:port), 'auto', or 'local:N' "
            "(start an N-node cluster on this machine); empty: embedded, in this process"
        ),
    )
    ray_namespace: str = Field(default="palaestra", description="Ray namespace of the workers")
    ray_token_file: Path | None = Field(
        default=None,
        description=(
            "the Ray cluster's auth token (RAY_AUTH_MODE=token): local:N writes a new one "
            "here, mode 0600 in a 0700 folder; joining a cluster reads it from here, else "
            "from Ray's own RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token "
            "(default: <data dir>/ray/auth_token)"
        ),
    )
    ray_allow_unauthenticated: bool = Field(
        default=False,
        description=(
            "join a Ray cluster that runs without token authentication, where any process "
            "that reaches it can act on every episode: only for a cluster on a network "
            "nothing else reaches"
        ),
    )
    ray_node_episodes: int = Field(
        default=0,
        ge=0,
        description=(
            "live episodes a worker hosts (a node's `palaestra_episodes` resource overrides "
            "it; 0: max_episodes)"
        ),
    )
    ray_overcommit: float = Field(
        default=4.0,
        gt=0,
        description="sandbox CPUs and memory a node may promise, as a multiple of what it has",
    )
    ray_poll_s: float = Field(
        default=1.0, gt=0, description="how often a front refreshes workers' load and health"
    )
    ray_local_cpus: int = Field(default=1, ge=1, description="local:N: CPUs each node declares")
    ray_metrics_timeout_s: float = Field(
        default=2.0, gt=0, description="how long a front's /metrics waits for each worker's"
    )
