"""Where the server finds families: the built-ins, then the `palaestra.families` entry points.

Each is made once, with its own settings (an instance of its `settings_model`, from its
slice of `Settings.families`) and the server's folders (`ServerPaths`); a value that does
not fit its model stops the server with `FamilySettingsError`, naming the family and the
field. An entry point that fails to load is remembered with its error (`BrokenFamily`), so
pack check, `palaestra families`, /readyz and a reset of its packs can name it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from palaestra.envs import Family, FamilySettings, ServerPaths
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
from palaestra.server.family_slices import family_key

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


class FamilySettingsError(ValueError):
    """A family's slice of `Settings.families` that its settings model refuses."""


def _field_env(family: str, field: str) -> str:
    return f"PALAESTRA_FAMILY_{family_key(family).upper()}__{field.upper()}"


def family_settings(family: type[Family], slices: Mapping[str, Any]) -> FamilySettings:
    """`family`'s settings: its `settings_model` validated on its slice of `slices` (the
    `families` setting; the slice's key is the family's name, '-' and '_' alike).
    FamilySettingsError names the family, each field and where it is set."""
    key = family_key(family.name)
    raw = next((v for k, v in slices.items() if family_key(k) == key), None) or {}
    model = family.settings_model
    if not isinstance(raw, Mapping):
        raise FamilySettingsError(
            f"family {family.name}: [families.{family.name}] must be a table of its settings "
            f"(field = value), not {type(raw).__name__}"
        )
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        known = ", ".join(model.model_fields) or "none"
        problems = []
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"]) or "(all)"
            message = "no such setting" if error["type"] == "extra_forbidden" else error["msg"]
            where = f"[families.{family.name}] {field}"
            if error["loc"]:
                where += f" or {_field_env(family.name, str(error['loc'][0]))}"
            problems.append(f"setting {field}: {message} ({where})")  # no value: a secret?
        raise FamilySettingsError(
            f"family {family.name}: {'; '.join(problems)}; its settings: {known}"
        ) from None


def server_paths(settings: Settings) -> ServerPaths:
    """The server-wide folders every family is handed (from the server's own settings)."""
    return ServerPaths(cache=settings.cache, toolchains=settings.toolchains_dir)


def make_family(family: type[Family], settings: FamilySettings, server: ServerPaths) -> Family:
    """`family` made with its settings and the server's folders, passed by name. A family
    whose `__init__` takes neither (written before family settings) is made with no
    arguments, as it was then, and handed both after."""
    params = inspect.signature(family).parameters.values()
    if any(p.name == "settings" or p.kind is p.VAR_KEYWORD for p in params):
        return family(settings=settings, server=server)
    made = family()
    made.settings, made.server = settings, server
    return made


class FamilyRegistry:
    def __init__(self, families: list[Family] | None = None) -> None:
        self._families: dict[str, Family] = {}
        self._broken: dict[str, BrokenFamily] = {}
        for family in families or []:
            self.add(family)

    @classmethod
    def discover(cls, settings: Settings | None = None) -> FamilyRegistry:
        """The built-ins, then the entry points, each made with its slice of
        `settings.families` and the server's folders (None: every family's defaults).
        FamilySettingsError: a family's slice does not fit its settings model, or names
        a family that is not installed."""
        slices: Mapping[str, Any] = settings.families if settings is not None else {}
        server = server_paths(settings) if settings is not None else ServerPaths()
        registry = cls(
            [make_family(family, family_settings(family, slices), server) for family in BUILTIN]
        )
        for ep in entry_points(group="palaestra.families"):
            if ep.name in registry._families:
                continue
            try:
                loaded = ep.load()
            except Exception as exc:
                registry._break(ep.name, ep.value, exc)
                continue
            if not (isinstance(loaded, type) and issubclass(loaded, Family)):
                try:  # an instance, made by its package (or a class that is no Family)
                    registry.add(loaded() if isinstance(loaded, type) else loaded)
                except Exception as exc:
                    registry._break(ep.name, ep.value, exc)
                continue
            # the operator's settings: a mistake there stops the server (not the package's)
            own = family_settings(loaded, slices)
            try:
                registry.add(make_family(loaded, own, server))
            except Exception as exc:
                registry._break(ep.name, ep.value, exc)
        known = {family_key(n) for n in [*registry._families, *registry._broken]}
        stray = sorted(name for name in slices if family_key(name) not in known)
        if stray:
            raise FamilySettingsError(
                f"settings for family {', '.join(stray)}, which is not installed "
                f"(installed: {', '.join(sorted(registry._families))}): [families.<name>]"
            )
        return registry

    def _break(self, name: str, entry_point: str, exc: Exception) -> None:
        broken = BrokenFamily(name, entry_point, f"{type(exc).__name__}: {exc}")
        self._broken[name] = broken
        log.info("%s", broken.message())  # named by /readyz and `families`

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
