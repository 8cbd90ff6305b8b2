"""The `families` setting: each family's slice of the server's settings, by family name.

A slice is what palaestra.toml's `[families.<name>]` table, the `PALAESTRA_FAMILIES` JSON
or one `PALAESTRA_FAMILY_<NAME>__<FIELD>` variable per field sets; the family's own
settings model (envs/base.py `FamilySettings`) checks it when the server makes the family
(server/families.py). Only server/config.py's loader reads the environment: it hands the
variables here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator

FAMILY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
FAMILY_ENV = "PALAESTRA_FAMILY_"  # PALAESTRA_FAMILY_<NAME>__<FIELD>: one field of a family
HELP = (
    "settings of one family by family name ('-' and '_' alike), each checked by the family's "
    "own model; toml [families.NAME] FIELD = …; env PALAESTRA_FAMILY_<NAME>__<FIELD> (one "
    "field, over the rest) or PALAESTRA_FAMILIES (JSON)"
)


def family_key(name: str) -> str:
    """How a family's name is matched to its slice (and to the <NAME> of a variable):
    lower case, '-' and '.' written '_'."""
    return name.lower().replace("-", "_").replace(".", "_")


def _names(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    seen: dict[str, str] = {}
    for name in value:
        if not FAMILY_NAME.fullmatch(name):
            raise ValueError(
                f"family name {name!r}: letters, digits, '_', '.', '-', starting with a "
                "letter or digit"
            )
        if family_key(name) in seen:
            raise ValueError(
                f"families {seen[family_key(name)]!r} and {name!r} name the same family "
                "('-' and '_' are alike): merge them"
            )
        seen[family_key(name)] = name
    return value


# The setting's type: {family name: {field: value}}, the names checked.
FamilySlices = Annotated[dict[str, dict[str, Any]], AfterValidator(_names)]


def from_json(raw: str) -> Any:
    """`PALAESTRA_FAMILIES`: the whole table, as JSON."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"PALAESTRA_FAMILIES is not JSON ({exc}): write "
            '{"NAME": {"FIELD": VALUE}}, or set one field with PALAESTRA_FAMILY_<NAME>__<FIELD>'
        ) from None


def with_variables(table: Any, variables: Mapping[str, str]) -> Any:
    """`table` (the `families` of palaestra.toml or PALAESTRA_FAMILIES; None: none) with
    each `PALAESTRA_FAMILY_<NAME>__<FIELD>` of `variables` set over it; a variable's family
    is the table's entry of the same key, else a new one. ValueError: a variable that does
    not name a field."""
    table = {} if table is None else table
    if not isinstance(table, dict):
        return table  # not a table: Settings names the problem
    merged: dict[str, Any] = {
        name: dict(slice_) if isinstance(slice_, dict) else slice_ for name, slice_ in table.items()
    }
    keys = {family_key(name): name for name in merged}
    for var in sorted(variables):
        name, sep, field = var.removeprefix(FAMILY_ENV).partition("__")
        if not (var.startswith(FAMILY_ENV) and sep and name and field):
            raise ValueError(
                f"{var}: write PALAESTRA_FAMILY_<NAME>__<FIELD> (two underscores between the "
                "family's name and the field), e.g. PALAESTRA_FAMILY_FINANCE__CACHE_DIR"
            )
        slice_ = merged.setdefault(keys.setdefault(family_key(name), family_key(name)), {})
        if isinstance(slice_, dict):
            slice_[field.lower()] = variables[var]
    return merged


def source(earlier: str | None, variables: Mapping[str, str]) -> str:
    """Where the `families` setting came from: the file (or PALAESTRA_FAMILIES), then the
    variables set over it."""
    return ", ".join([*([earlier] if earlier else []), *sorted(variables)])
