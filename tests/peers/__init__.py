"""Peers' own clients and trainers, each in a venv of its own (scripts/peer-venv.sh).

A door's test starts a real `palaestra serve` and runs a client program from this folder
with the peer's python: `peer_python("openenv", "openenv==0.10.0")`, then
`run_peer(python, "openenv_client.py", url, token)`. A venv that cannot be made fails the
test with pip's output (the bootstrap can reach PyPI; a missing peer is a broken build).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def peer_python(name: str, *requirements: str) -> Path:
    """The python of the venv `name` with `requirements` installed (made on first use)."""
    made = subprocess.run(
        ["bash", str(ROOT / "scripts" / "peer-venv.sh"), name, *requirements],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert made.returncode == 0, f"scripts/peer-venv.sh {name} failed:\n{made.stderr[-3000:]}"
    return Path(made.stdout.strip().splitlines()[-1])


def run_peer(
    python: Path, program: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run tests/peers/`program` with the peer's python; its last stdout line is JSON."""
    done = subprocess.run(
        [str(python), str(HERE / program), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=HERE,
    )
    assert done.returncode == 0, (
        f"{program} exited {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
        f"stderr:\n{done.stderr[-5000:]}"
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"{program} printed nothing\nstderr:\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result
