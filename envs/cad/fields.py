"""The fields of a cad task (envs/cad/tasks.py makes them; the pack loader checks them)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from palaestra.envs import PrivateFields, PublicFields


class CadPublic(PublicFields):
    instruction: str
    params: dict[str, Any]
    parametric: bool = False  # the script must read params.json: hidden parameters rerun it


class CadPrivate(PrivateFields):
    domain: str  # the part (envs/cad/builders.py)
    params: dict[str, Any]
    level: int = 1
    hidden_params: dict[str, Any] = Field(default_factory=dict)  # on parametric tasks
