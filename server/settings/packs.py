"""Packs: where the built-in ones come from, what a published archive may be, who may
publish what, and the publish-time checks and generators."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from palaestra.shipped import shipped_dir

REPO_PACKS = shipped_dir("packs")  # the built-in packs: in the wheel, or the checkout's


class PackSettings(BaseModel):
    """Packs: the folders served, a published archive's limits (413 over), the trust
    boundaries of publishing (docs/security.md: who owns an org, how much one publisher may
    store) and the cheat audit a new version passes."""

    model_config = ConfigDict(extra="forbid")

    packs_dirs: list[Path] = Field(default_factory=lambda: [REPO_PACKS])
    background_warm: bool = Field(
        default=True,
        description="serve and run: packs whose generated tasks are not cached yet are "
        "generated in a background process while the others are served (/readyz lists them "
        "as warming); false: generated before the server answers",
    )
    max_pack_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1, description="largest pack archive POST /v1/packs takes"
    )
    max_pack_unpacked_bytes: int = Field(
        default=2 * 1024**3, ge=1, description="a pack archive's uncompressed total (413 over)"
    )
    max_pack_files: int = Field(default=200_000, ge=1, description="entries in a pack archive")
    max_pack_ratio: float = Field(
        default=200.0, gt=1, allow_inf_nan=False, description="uncompressed/compressed bytes"
    )
    max_pack_blob_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="one binary file (blob) of a pack's tasks, at import, check and publish",
    )
    max_pack_blobs_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1,
        description="a pack's binary files together, each counted at least a 4 KiB disk block "
        "(many small blobs cost their blocks)",
    )
    builtin_orgs: list[str] = Field(
        default_factory=lambda: ["palaestra", "openai", "reasoning"],
        description="pack orgs only an admin token may publish into",
    )
    publisher_max_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=0, description="installed bytes one publisher may store"
    )
    publisher_max_versions: int = Field(
        default=200, ge=0, description="pack versions one publisher may publish"
    )
    publish_queue_per_publisher: int = Field(
        default=4,
        ge=1,
        description="publishes of one publisher in progress at once (they install one at a "
        "time, so one publisher never holds more than one install thread); more: 429",
    )
    heldout_rotate_every_days: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="draw a new held-out set of every sealed generated split whose current "
        "draw is older than this (server/draws.py); earlier draws are retired, never served "
        "again; none: only `palaestra pack heldout rotate` draws one",
    )
    heldout_sync_s: float = Field(
        default=10.0,
        gt=0,
        allow_inf_nan=False,
        description="how often a server loads the held-out draws another process on its store "
        "rotated (server/draws.py): a front or server that did not rotate serves the new draw, "
        "and no longer the retired one, within this",
    )
    publish_check_tasks: int = Field(
        default=4,
        ge=0,
        description="tasks of a new pack version the family's cheats and the generic cheat "
        "library are played on before it is published; any cheat above the pack's "
        "cheat_max_reward refuses it (0: no audit)",
    )


class GenerateSettings(BaseModel):
    """A publish token's generator pack runs its generators in a sandbox at publish time,
    one fresh sandbox per generator and split (server/packs/generate.py)."""

    model_config = ConfigDict(extra="forbid")

    generate_timeout_s: float = Field(
        default=120.0, gt=0, allow_inf_nan=False, description="one generator split's run"
    )
    generate_memory_mb: int = Field(
        default=1024, ge=64, description="memory of one generator split's sandbox"
    )
    generate_max_output_mb: int = Field(
        default=16, ge=1, description="the tasks one generator split may print, at most"
    )
    generate_pids: int = Field(
        default=64, ge=4, description="processes one generator split's sandbox may hold"
    )
    generate_max_splits: int = Field(
        default=16,
        ge=1,
        description="generator splits one published pack may run (each up to "
        "generate_timeout_s); more is refused before any runs",
    )
