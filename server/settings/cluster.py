"""Cluster mode (server/cluster/, docs/operations.md): episodes on Ray workers."""

from __future__ import annotations

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
