"""The `palaestra` command's entry point. The light install (`pip install palaestra`, the
SDK a trainer's venv needs) has no server and no command: say what to install instead of
a traceback about a missing module."""

from __future__ import annotations

import importlib.metadata
import re
import sys

SERVER_EXTRA = re.compile(r"""extra\s*==\s*["']server["']""")


def missing_server_requirements() -> list[str]:
    """The distributions of `palaestra[server]` this environment lacks (none when palaestra
    runs from a checkout that is not installed: nothing to compare against)."""
    try:
        requires = importlib.metadata.requires("palaestra") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for line in requires:
        name = re.match(r"[A-Za-z0-9._-]+", line)
        if name and SERVER_EXTRA.search(line):
            try:
                importlib.metadata.distribution(name.group(0))
            except importlib.metadata.PackageNotFoundError:
                missing.append(name.group(0))
    return missing


def main() -> None:
    try:
        from palaestra.cli.main import main as run
    except ModuleNotFoundError:
        missing = missing_server_requirements()  # looked up only on failure: no cost at start
        if not missing:
            raise
        sys.exit(
            "palaestra: the command and the server are not installed here, only the SDK "
            f"(missing: {', '.join(missing)}). Install them with: pip install 'palaestra[server]'"
        )
    run()
