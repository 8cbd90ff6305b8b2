"""Our side of a trainer adapter's test: a site folder holding only `palaestra.sdk` (this
checkout's) for the peer's venv, and a train-scoped token on the test's server.

A trainer adapter under sdk/integrations/ runs inside the peer's own venv; putting this
folder on PYTHONPATH (rather than installing palaestra there, with its server deps) also
proves the sdk needs nothing from server/, envs/ or the project's dependencies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx

from tests.conftest import ServerProcess
from tests.peers import ROOT


def sdk_env(tmp: Path) -> dict[str, str]:
    """The environment for `run_peer`: os.environ plus PYTHONPATH = a site with the sdk."""
    site = tmp / "sdk-site"
    package = site / "palaestra"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "palaestra" / "__init__.py", package / "__init__.py")
    (package / "sdk").symlink_to(ROOT / "sdk", target_is_directory=True)
    return {**os.environ, "PYTHONPATH": str(site)}


def train_token(server: ServerProcess, name: str) -> str:
    """A new token with the `train` scope (what a trainer's rollouts run under)."""
    body = {"scopes": ["train"], "name": name}
    made = httpx.post(f"{server.url}/v1/tokens", json=body, headers=server.headers)
    assert made.status_code == 201, made.text
    token: str = made.json()["token"]
    return token
