"""The nemo-gym package's venv for the tests that drive it (scripts/nemo-gym-venv.sh)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.peers import ROOT

VERSION = "0.7.0"  # the nemo-gym release the door is tested with (docs/integrations.md)


def nemo_gym_python() -> Path:
    """Its python (the venv made on first use); skips only where it cannot be installed at
    all: no Python >= 3.13 (exit 3), or PyPI out of reach."""
    made = subprocess.run(
        ["bash", str(ROOT / "scripts" / "nemo-gym-venv.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "NEMO_GYM_VERSION": VERSION},
    )
    offline = re.search(r"(?i)connection|resolve|network|temporary failure", made.stderr)
    if made.returncode == 3 or (made.returncode != 0 and offline):
        pytest.skip(f"the nemo-gym package cannot be installed here: {made.stderr[-300:]}")
    assert made.returncode == 0, f"scripts/nemo-gym-venv.sh failed:\n{made.stderr[-2000:]}"
    return Path(made.stdout.strip().splitlines()[-1])
