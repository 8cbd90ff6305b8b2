"""A site folder holding only `palaestra.sdk` (this checkout's), for a peer's venv.

A trainer adapter under sdk/integrations/ runs inside the peer's own venv; putting this
folder on PYTHONPATH (rather than installing palaestra there, with its server deps) also
proves the sdk needs nothing from server/, envs/ or the project's dependencies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.peers import ROOT


def sdk_env(tmp: Path) -> dict[str, str]:
    """The environment for `run_peer`: os.environ plus PYTHONPATH = a site with the sdk."""
    site = tmp / "sdk-site"
    package = site / "palaestra"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "palaestra" / "__init__.py", package / "__init__.py")
    (package / "sdk").symlink_to(ROOT / "sdk", target_is_directory=True)
    return {**os.environ, "PYTHONPATH": str(site)}
