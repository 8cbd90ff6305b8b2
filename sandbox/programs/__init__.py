"""Programs the sandbox runs, kept as files and read as data (`text`).

Each file here is a whole program (Python, C or shell) that runs where palaestra is not
importable: inside a jail, a container, or as a host helper. ``@NAME@`` placeholders are
filled by the caller.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def _raw(package: str, name: str) -> str:
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def text(name: str, package: str = __name__, **subst: object) -> str:
    """The program `name` of `package` (this one by default), ``@KEY@`` replaced by each
    value of `subst`; a placeholder left unfilled is a bug, so it raises."""
    out = _raw(package, name)
    for key, value in subst.items():
        marker = f"@{key}@"
        if marker not in out:
            raise KeyError(f"{name}: no placeholder {marker}")
        out = out.replace(marker, str(value))
    return out
