"""Where the server keeps its state, how it is reached, and what one request may cost."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    SecretStr,
    field_serializer,
)

from palaestra.server.db import Database, redact
from palaestra.server.settings.shown import reveals


def default_data_dir() -> Path:
    """Where a server keeps its store, packs and tokens when no `data_dir` is set: the XDG
    data home's default, ~/.local/share/palaestra (never the current directory)."""
    return Path.home() / ".local" / "share" / "palaestra"


class StoreSettings(BaseModel):
    """The server's state: its data folder, the database and the held-out secret."""

    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(
        default_factory=lambda: default_data_dir(),
        description="SQLite store, packs, tokens (default ~/.local/share/palaestra)",
    )
    store: str = Field(
        default="",
        description=(
            "the database: '' for SQLite in the data dir, sqlite://PATH, or "
            "postgresql://USER:PASSWORD@HOST:PORT/DB (shared by several servers)"
        ),
    )
    store_max_backlog_mb: int = Field(
        default=64,
        ge=1,
        description="step records queued in memory for the store's writer, at most; a step "
        "past it waits until the writer has caught up (backpressure, not a refusal)",
    )
    store_token_backlog_mb: int = Field(
        default=4,
        ge=1,
        description="step records one token may have queued ahead of the disk; its step past "
        "it waits for the writer. It bounds how long another token's episode end (which is "
        "told only what is on disk) waits behind this token's records",
    )
    final_state_max_mb: int = Field(
        default=64,
        ge=0,
        le=65_536,
        description="the final state a verifier saw (workspace tar and family state) is kept "
        "for `eval regrade` up to this size an episode; over it, nothing is kept and the "
        "episode says why (0: keep none)",
    )
    final_state_max_total_mb: int = Field(
        default=20_480,
        ge=1,
        le=16_777_216,
        description="the most all kept final states may take on disk together; once there, "
        "nothing more is kept (the episode says why) until the retention prune frees room",
    )
    final_state_retention_days: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="kept final states are pruned this long after their last use",
    )
    heldout_secret_file: Path | None = Field(
        default=None,
        description=(
            "the secret sealed generated tasks derive their seeds from (made 0600 at first "
            "start; default <data_dir>/heldout.secret); share it to share a held-out set"
        ),
    )

    @field_serializer("store", when_used="json")
    def _store_shown(self, value: str, info: FieldSerializationInfo) -> str:
        return value if reveals(info) else redact(value)  # `palaestra config` shows none

    def database(self) -> Database:
        """Open (and migrate) the `store`; the caller closes it (a Store closes its own).
        StoreUnavailableError names the URL and what to fix."""
        return Database.open(self.store or self.data_dir / "palaestra.sqlite3")


class ClientSettings(BaseModel):
    """The CLI's side: the server its commands talk to (cli/options.py)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        default=None, description="CLI: the server URL; without it an embedded server runs"
    )
    token: SecretStr | None = Field(default=None, description="CLI: the bearer token it sends")


class ServerSettings(BaseModel):
    """How the server is reached and who may use it: address, authentication, logging."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8000
    auth: Literal["token", "off"] = Field(
        default="token",
        description=(
            "token: every /v1 request needs a bearer token with the right scope; "
            "off: everyone is admin (local experiments only, never on a shared network)"
        ),
    )
    log_level: str = "info"


class HttpSettings(BaseModel):
    """What one request or connection may cost the server (docs/security.md, tests/redteam/;
    uvicorn's bounds and the routes' body checks)."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="largest JSON request body (413 over)"
    )
    max_json_depth: int = Field(
        default=64, ge=2, le=200, description="deepest nesting of a JSON request body (422)"
    )
    max_json_values: int = Field(
        default=200_000,
        ge=1000,
        description="values (containers and their elements) in one JSON request body: a "
        "body of many tiny values costs its parser far more than its bytes say (413 over)",
    )
    max_batch_items: int = Field(
        default=1024, ge=1, le=1024, description="items in one batch call (413 over)"
    )
    max_connections: int = Field(
        default=4096,
        ge=16,
        description=(
            "open connections: past it the oldest idle unauthenticated one is closed, else "
            "429 (uvicorn's own 503 for tasks at twice it)"
        ),
    )
    max_unauthenticated_per_client: int = Field(
        default=1024,
        ge=1,
        description=(
            "connections one client address may hold before they authenticate; past it its "
            "oldest idle one is closed (at max_connections, anyone's oldest idle one is)"
        ),
    )
    max_header_bytes: int = Field(
        default=64 * 1024, ge=4096, description="request line and headers of one request"
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, allow_inf_nan=False, description="to send a request's headers"
    )
    keep_alive_s: float = Field(
        default=5.0, gt=0, allow_inf_nan=False, description="idle keep-alive connection life"
    )
    shutdown_grace_s: float = Field(
        default=20.0,
        ge=0,
        allow_inf_nan=False,
        description="on SIGTERM, how long running requests may finish before the rest are void",
    )
