"""Settings (DESIGN §9): a flag, then `PALAESTRA_<NAME>`, then `palaestra.toml`, then default.

The fields are declared by concern in server/settings/ (one model per group, each with its
prefix); `Settings` composes them, so every field is still read flat (`settings.pool_size`)
and named alike as a flag, a `PALAESTRA_<NAME>` variable and a toml key."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, model_validator

from palaestra.server import family_slices
from palaestra.server.settings.cluster import ClusterSettings
from palaestra.server.settings.episodes import (
    CeilingSettings,
    EpisodeSettings,
    QuotaSettings,
    SamplerSettings,
)
from palaestra.server.settings.families import (
    FamiliesSettings,
    JudgeEndpointSettings,
    JudgeSettings,
)
from palaestra.server.settings.harness import HarnessSettings
from palaestra.server.settings.packs import REPO_PACKS, GenerateSettings, PackSettings
from palaestra.server.settings.sandboxes import (
    REPO_IMAGES,
    EgressSettings,
    ImageSettings,
    SandboxSettings,
)
from palaestra.server.settings.serving import (
    ClientSettings,
    HttpSettings,
    ServerSettings,
    StoreSettings,
)

__all__ = [
    "GROUPS",
    "REPO_IMAGES",
    "REPO_PACKS",
    "JudgeEndpointSettings",
    "Settings",
    "env_names",
    "load_settings",
    "load_settings_with_sources",
]

# The settings by concern, in the order `palaestra config` shows them.
GROUPS: dict[str, type[BaseModel]] = {
    "server": ServerSettings,
    "client": ClientSettings,
    "store": StoreSettings,
    "http": HttpSettings,
    "sandbox": SandboxSettings,
    "images": ImageSettings,
    "egress": EgressSettings,
    "episodes": EpisodeSettings,
    "ceilings": CeilingSettings,
    "quotas": QuotaSettings,
    "sampler": SamplerSettings,
    "packs": PackSettings,
    "generate": GenerateSettings,
    "harness": HarnessSettings,
    "judges": JudgeSettings,
    "families": FamiliesSettings,
    "cluster": ClusterSettings,
}


class Settings(
    ServerSettings,
    ClientSettings,
    StoreSettings,
    HttpSettings,
    SandboxSettings,
    ImageSettings,
    EgressSettings,
    EpisodeSettings,
    CeilingSettings,
    QuotaSettings,
    SamplerSettings,
    PackSettings,
    GenerateSettings,
    HarnessSettings,
    JudgeSettings,
    FamiliesSettings,
    ClusterSettings,
):
    """Every setting, flat: the groups of GROUPS composed (a group's own validators come
    with it; those that span groups are here)."""

    @classmethod
    def groups(cls) -> dict[str, list[str]]:
        """The fields by concern: group name -> its field names, in declaration order."""
        return {name: list(group.model_fields) for name, group in GROUPS.items()}

    @property
    def spool_folder(self) -> Path:
        """Where large transfers (workspaces, pack archives) wait on disk, never whole in
        server memory: the `spool_dir` setting, else <data_dir>/tmp."""
        return self.spool_dir or self.data_dir / "tmp"

    @model_validator(mode="after")
    def _harness_budgets_fit(self) -> Settings:
        if (
            self.harness_max_calls > self.ceiling_harness_calls
            or self.harness_max_tokens > self.ceiling_harness_tokens
        ):
            raise ValueError(
                "harness_max_calls and harness_max_tokens must be within their ceilings"
            )
        return self


def _coerce(name: str, raw: str) -> Any:
    """An environment variable's text as setting `name` takes it: a list as JSON or comma
    separated (packs_dirs: os.pathsep), a mapping as JSON or `key=value,…`."""
    if name == "packs_dirs":
        return [p for p in raw.split(os.pathsep) if p]
    if name == "families":
        return family_slices.from_json(raw)
    if name == "judges":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"PALAESTRA_JUDGES is not JSON ({exc}): write "
                '{"NAME": {"url": "http://HOST:PORT/v1", "model": "MODEL"}}'
            ) from None
    shape = _container(Settings.model_fields[name].annotation)
    if shape is list:
        if raw.lstrip().startswith("["):
            return _json(name, raw)
        return [p.strip() for p in raw.split(",") if p.strip()]
    if shape is dict:
        if raw.lstrip().startswith("{"):
            return _json(name, raw)
        pairs = (item.rsplit("=", 1) for item in raw.split(",") if item.strip())
        return {key.strip(): value.strip() for key, value in pairs}
    return raw


def _container(annotation: Any) -> type | None:
    """list or dict where a setting's type is one (also inside `X | None`), else None."""
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return list
    if origin is dict:
        return dict
    if origin in (Union, UnionType):
        shapes = {_container(arg) for arg in get_args(annotation)} - {None}
        return shapes.pop() if len(shapes) == 1 else None
    return None


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"PALAESTRA_{name.upper()} is not JSON ({exc})") from None


# Environment variables read beside PALAESTRA_<NAME> (the name a third party documents).
ALSO_FROM_ENV = {"e2b_api_key": "E2B_API_KEY"}


def env_names(name: str) -> list[str]:
    """The environment variables a setting is read from, first first."""
    return [f"PALAESTRA_{name.upper()}", *([ALSO_FROM_ENV[name]] if name in ALSO_FROM_ENV else [])]


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the four sources; unknown keys in palaestra.toml are an error that names them."""
    return load_settings_with_sources(flags, environ=environ, config_file=config_file)[0]


def load_settings_with_sources(
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> tuple[Settings, dict[str, str]]:
    """The settings and where each came from: `flag`, the environment variable's name,
    the config file's path, or `default`."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config_file or Path(environ.get("PALAESTRA_CONFIG", "palaestra.toml"))
    if path.exists():
        values.update(tomllib.loads(path.read_text(encoding="utf-8")))
        sources.update(dict.fromkeys(values, str(path)))
    for name in Settings.model_fields:
        for var in env_names(name):
            env_value = environ.get(var)
            if env_value is not None:
                values[name] = _coerce(name, env_value)
                sources[name] = var
                break
    family_vars = {k: v for k, v in environ.items() if k.startswith(family_slices.FAMILY_ENV)}
    if family_vars:  # PALAESTRA_FAMILY_<NAME>__<FIELD>: one field of a family, over the rest
        values["families"] = family_slices.with_variables(values.get("families"), family_vars)
        sources["families"] = family_slices.source(sources.get("families"), family_vars)
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    values.update(given)
    sources.update(dict.fromkeys(given, "flag"))
    settings = Settings.model_validate(values)
    return settings, {name: sources.get(name, "default") for name in Settings.model_fields}
