"""Where the folders that travel with palaestra as data are (packs/, images/), whatever the
install.

A wheel carries them inside the package (``site-packages/palaestra/packs``, …: pyproject's
package-dir and package-data); a checkout, editable-installed or not, has them at its top
level beside ``palaestra/``. Code finds them here, never by counting the parents of its own
file (which differ between the two layouts).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The shipped folder `name` (``packs``, ``images``): the package's own in a wheel,
    else the checkout's top-level one."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name
