"""palaestra.envs: the families, and everything a family author needs in one import.

    from palaestra.envs import Family, State, tool, ToolArgs, PublicFields, Observation, ...

The names are `palaestra.envs.base`'s (the family contract, with the wire models, errors,
sandbox types and judge endpoints a family names; docs/writing-a-family.md), plus the
judge verifier's helpers, loaded on first use (they cost more to import than a family that
never asks a judge should pay). Nothing here loads a sandbox backend or a server module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from palaestra.envs import base
from palaestra.envs.base import *  # noqa: F403 (the contract is base.__all__: one list)

if TYPE_CHECKING:
    from palaestra.verifiers.judge import JudgeConfig as JudgeConfig
    from palaestra.verifiers.judge import JudgedSubject as JudgedSubject
    from palaestra.verifiers.judge import Rubric as Rubric
    from palaestra.verifiers.judge import RubricVerdict as RubricVerdict
    from palaestra.verifiers.judge import Subject as Subject
    from palaestra.verifiers.judge import score_rubric as score_rubric

# name: the module that holds it, imported when the name is first read
_LAZY = {
    name: "palaestra.verifiers.judge"
    for name in (
        "JudgeConfig",
        "JudgedSubject",
        "Rubric",
        "RubricVerdict",
        "Subject",
        "score_rubric",
    )
}

__all__ = [*base.__all__, *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
