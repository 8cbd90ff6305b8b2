"""Where the server finds families: the built-ins, then the `palaestra.families` entry points."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from palaestra.envs.base import Family
from palaestra.envs.cad import CadFamily
from palaestra.envs.coding import CodingFamily
from palaestra.envs.echo import EchoFamily
from palaestra.envs.finance import FinanceFamily
from palaestra.envs.letters import LettersFamily
from palaestra.envs.reasoning import ReasoningFamily
from palaestra.envs.terminal import TerminalFamily
from palaestra.sdk.errors import NotFoundError

log = logging.getLogger(__name__)

BUILTIN: tuple[type[Family], ...] = (
    CadFamily,
    CodingFamily,
    EchoFamily,
    FinanceFamily,
    ReasoningFamily,
    LettersFamily,
    TerminalFamily,
)


class FamilyRegistry:
    def __init__(self, families: list[Family] | None = None) -> None:
        self._families: dict[str, Family] = {}
        for family in families or []:
            self.add(family)

    @classmethod
    def discover(cls, options: Mapping[str, Mapping[str, Any]] | None = None) -> FamilyRegistry:
        """The built-ins, each made with its `options` (constructor arguments by family
        name, from the settings), then the entry points."""
        options = options or {}
        registry = cls([family(**options.get(family.name, {})) for family in BUILTIN])
        for ep in entry_points(group="palaestra.families"):
            if ep.name in registry._families:
                continue
            try:
                loaded = ep.load()
                registry.add(loaded() if isinstance(loaded, type) else loaded)
            except Exception:
                log.exception("family entry point %s could not be loaded; skipped", ep.name)
        return registry

    def add(self, family: Family) -> None:
        self._families[family.name] = family

    def get(self, name: str) -> Family:
        try:
            return self._families[name]
        except KeyError:
            known = ", ".join(sorted(self._families))
            raise NotFoundError(f"unknown family {name!r}; known: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._families

    def all(self) -> list[Family]:
        return [self._families[name] for name in sorted(self._families)]
