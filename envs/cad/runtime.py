"""The two toolchains an agent's script can use, and how the sandbox reaches them.

The sandbox sees the host's /usr read-only and nothing of the server's files. A script runs
under the host's /usr/bin/python3 with one toolchain's site-packages bound read-only at a
fixed path and put on PYTHONPATH:

* ``trimesh``: the site-packages that hold numpy, trimesh and manifold3d in the server's own
  environment (the `cad` extra), bound at /opt/palaestra/trimesh;
* ``blender``: ``.venv-blender`` (built by scripts/bootstrap-blender.sh: bpy 5.0.1, numpy<2),
  or the venv named by ``PALAESTRA_BLENDER_VENV``, bound at /opt/palaestra/blender.

PYTHONPATH does not run ``.pth`` files, so nothing of the server (its editable install) is
importable inside. Compiled modules need the same Python minor version on both sides, which
`Toolchain.reason` reports when it is not so.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PYTHON = "/usr/bin/python3"
SANDBOX_SITE = {"trimesh": "/opt/palaestra/trimesh", "blender": "/opt/palaestra/blender"}
TOOLCHAINS = ("trimesh", "blender")
BLENDER_VENV_ENV = "PALAESTRA_BLENDER_VENV"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Toolchain:
    name: str
    site: str | None  # host directory bound into the sandbox; None when unavailable
    reason: str = ""  # why it is unavailable

    @property
    def available(self) -> bool:
        return self.site is not None

    def env(self) -> dict[str, str]:
        env = {"PYTHONPATH": SANDBOX_SITE[self.name], "PYTHONNOUSERSITE": "1"}
        if self.name == "blender":
            env["HOME"] = "/tmp"  # Blender writes its user config under $HOME
        return env


@functools.cache
def host_python_version() -> tuple[int, int] | None:
    """The minor version of the sandbox's /usr/bin/python3 (from its resolved file name)."""
    try:
        name = os.path.basename(os.path.realpath(PYTHON))
    except OSError:
        return None
    m = re.fullmatch(r"python(\d+)\.(\d+)", name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _module_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    return origin.parent.parent if origin.name == "__init__.py" else origin.parent


@functools.cache
def trimesh_toolchain() -> Toolchain:
    dirs = {n: _module_dir(n) for n in ("numpy", "trimesh", "manifold3d")}
    missing = [n for n, d in dirs.items() if d is None]
    if missing:
        return Toolchain("trimesh", None, f"not installed: {', '.join(missing)} (the cad extra)")
    if len(set(dirs.values())) != 1:
        return Toolchain("trimesh", None, f"numpy, trimesh, manifold3d in different dirs: {dirs}")
    if host_python_version() != sys.version_info[:2]:
        return Toolchain(
            "trimesh",
            None,
            f"{PYTHON} is {host_python_version()}, the server's Python is "
            f"{sys.version_info[:2]}: compiled modules would not load",
        )
    return Toolchain("trimesh", str(dirs["numpy"]))


@functools.cache
def blender_toolchain() -> Toolchain:
    venv = Path(os.environ.get(BLENDER_VENV_ENV) or REPO_ROOT / ".venv-blender")
    why = venv / "UNAVAILABLE"
    if why.is_file():
        return Toolchain("blender", None, why.read_text().strip())
    sites = sorted(venv.glob("lib/python3.*/site-packages"))
    site = next((s for s in sites if (s / "bpy").is_dir()), None)
    if site is None:
        return Toolchain("blender", None, f"no bpy under {venv} (run scripts/bootstrap-blender.sh)")
    if host_python_version() != (3, 11):
        return Toolchain("blender", None, f"{PYTHON} is not Python 3.11 (bpy 5.0.1 needs it)")
    return Toolchain("blender", str(site))


def toolchain(name: str) -> Toolchain:
    return trimesh_toolchain() if name == "trimesh" else blender_toolchain()


def ro_binds() -> tuple[tuple[str, str], ...]:
    """The read-only binds of every available toolchain."""
    out = []
    for chain in (trimesh_toolchain(), blender_toolchain()):
        if chain.site is not None:
            out.append((chain.site, SANDBOX_SITE[chain.name]))
    return tuple(out)
