"""Where the server finds families: the built-ins, then the `palaestra.families` entry points.

An entry point that fails to load is remembered with its error (`BrokenFamily`), so pack
check, `palaestra families`, /readyz and a reset of its packs can name it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from palaestra.envs.base import Family
from palaestra.envs.cad import CadFamily
from palaestra.envs.coding import CodingFamily
from palaestra.envs.commentary import CommentaryFamily
from palaestra.envs.echo import EchoFamily
from palaestra.envs.finance import FinanceFamily
from palaestra.envs.letters import LettersFamily
from palaestra.envs.reasoning import ReasoningFamily
from palaestra.envs.terminal import TerminalFamily
from palaestra.sdk.errors import NotFoundError, UnavailableError
from palaestra.server.config import Settings

log = logging.getLogger(__name__)

BUILTIN: tuple[type[Family], ...] = (
    CadFamily,
    CodingFamily,
    CommentaryFamily,
    EchoFamily,
    FinanceFamily,
    ReasoningFamily,
    LettersFamily,
    TerminalFamily,
)


@dataclass(frozen=True)
class BrokenFamily:
    """A `palaestra.families` entry point that could not be loaded."""

    name: str
    entry_point: str  # its value, 'module:attribute'
    error: str  # 'ImportError: message'

    def message(self) -> str:
        return (
            f"family {self.name} failed to import: {self.error} (entry point "
            f"{self.name} = {self.entry_point}); fix or reinstall the package that provides it"
        )


class FamilyRegistry:
    def __init__(self, families: list[Family] | None = None) -> None:
        self._families: dict[str, Family] = {}
        self._broken: dict[str, BrokenFamily] = {}
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
            except Exception as exc:
                broken = BrokenFamily(ep.name, ep.value, f"{type(exc).__name__}: {exc}")
                registry._broken[ep.name] = broken
                log.info("%s", broken.message())  # named by /readyz and `families`
        return registry

    def add(self, family: Family) -> None:
        self._families[family.name] = family

    def get(self, name: str) -> Family:
        try:
            return self._families[name]
        except KeyError:
            if name in self._broken:
                raise UnavailableError(
                    self._broken[name].message(), code="family_unavailable"
                ) from None
            known = ", ".join(sorted(self._families))
            raise NotFoundError(f"unknown family {name!r}; known: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._families

    def all(self) -> list[Family]:
        return [self._families[name] for name in sorted(self._families)]

    def broken(self) -> list[BrokenFamily]:
        """The entry points that failed to load, by name."""
        return [self._broken[name] for name in sorted(self._broken)]

    def unavailable(self) -> dict[str, str]:
        """What the pack loader is told of the broken families: {name: message}."""
        return {b.name: b.message() for b in self.broken()}


def unjudged_families(settings: Settings, families: FamilyRegistry) -> frozenset[str]:
    """Families whose verifier needs a judge endpoint the operator has not configured
    (Settings.judges): their episodes could only end void, so the sampler skips them."""
    missing: set[str] = set()
    for family in families.all():
        needed = family.judges() - set(settings.judges)
        if needed:
            missing.add(family.name)
            log.warning(
                "family %s is not sampled: it needs judge endpoint(s) %s (Settings.judges)",
                family.name,
                ", ".join(sorted(needed)),
            )
    return frozenset(missing)
