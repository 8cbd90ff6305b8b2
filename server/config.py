"""Settings (DESIGN §9): a flag, then `PALAESTRA_<NAME>`, then `palaestra.toml`, then default."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

REPO_PACKS = Path(__file__).resolve().parent.parent / "packs"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(default=Path(".palaestra"), description="SQLite store, packs, tokens")
    host: str = "127.0.0.1"
    port: int = 8000
    sandbox: str = Field(default="bwrap", description="sandbox backend")
    pool_size: int = Field(
        default=4, ge=0, description="warm sandboxes kept ready per sandbox spec (0: no pool)"
    )
    pool_max_total: int = Field(default=64, ge=1, description="warm sandboxes over all specs")
    packs_dirs: list[Path] = Field(default_factory=lambda: [REPO_PACKS])
    max_episodes: int = Field(default=2048, ge=1, description="live episodes before 429")
    idle_ttl_s: float = Field(default=900.0, gt=0, description="idle episodes expire after this")
    reaper_interval_s: float = Field(default=5.0, gt=0)
    max_steps: int = Field(default=50, ge=1, description="default step limit per episode")
    max_wall_s: float = Field(default=1800.0, gt=0, description="default wall-time limit")
    allow_oracle: bool = Field(
        default=True, description="let clients drive an episode with the task's oracle"
    )
    log_level: str = "info"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "palaestra.sqlite3"


def _coerce(name: str, raw: str) -> Any:
    if name == "packs_dirs":
        return [p for p in raw.split(os.pathsep) if p]
    return raw


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the four sources; unknown keys in palaestra.toml are an error that names them."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = config_file or Path(environ.get("PALAESTRA_CONFIG", "palaestra.toml"))
    if path.exists():
        values.update(tomllib.loads(path.read_text(encoding="utf-8")))
    for name in Settings.model_fields:
        env_value = environ.get(f"PALAESTRA_{name.upper()}")
        if env_value is not None:
            values[name] = _coerce(name, env_value)
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    return Settings.model_validate(values)
