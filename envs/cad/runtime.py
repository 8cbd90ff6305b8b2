"""The two toolchains an agent's script can use, and how the sandbox reaches them.

The sandbox sees the host's /usr read-only and nothing of the server's files. A script runs
under the host's /usr/bin/python3 with one toolchain's site-packages bound read-only at a
fixed path and put on PYTHONPATH:

* ``trimesh``: ``<toolchains>/trimesh`` (numpy, trimesh, manifold3d at the server's
  versions), else the server's own site-packages, bound at /opt/palaestra/trimesh;
* ``blender``: the venv ``<toolchains>/blender`` (bpy 5.0.1, numpy<2), bound at
  /opt/palaestra/blender.

``<toolchains>`` is the `toolchains_dir` setting (the family's `server.toolchains`), else
/opt/palaestra/toolchains where it exists, else ``.toolchains`` in the checkout;
scripts/bootstrap-cad.sh builds both there by the same rule. The
sandbox's uid must be able to read a bound directory's files, so every one is checked for
that (the folders above it may be closed: the bwrap backend reaches it anyway).

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

from palaestra.sandbox.readable import unreadable_by_others
from palaestra.shipped import shipped_dir

PYTHON = "/usr/bin/python3"
SANDBOX_SITE = {"trimesh": "/opt/palaestra/trimesh", "blender": "/opt/palaestra/blender"}
TOOLCHAINS = ("trimesh", "blender")
SYSTEM_TOOLCHAINS = Path("/opt/palaestra/toolchains")
# A checkout's own toolchains (scripts/bootstrap-cad.sh as a user); a wheel has none there.
CHECKOUT_TOOLCHAINS = shipped_dir(".toolchains")


def toolchains_root(configured: Path | None = None) -> Path:
    """Where scripts/bootstrap-cad.sh put the toolchains (the same rule as the script)."""
    if configured is not None:
        return configured
    return SYSTEM_TOOLCHAINS if SYSTEM_TOOLCHAINS.is_dir() else CHECKOUT_TOOLCHAINS


def unreachable_by_others(path: Path) -> str | None:
    """Why the sandbox's unprivileged uid could not read the toolchain at `path` (None if it
    can). The folders above it do not matter (a bind reaches the sandbox from under a closed
    folder: sandbox/bwrap/mounts.py); its own files' modes do."""
    why = unreadable_by_others(path.resolve())
    if why is None:
        return None
    return (
        f"the sandbox's uid cannot read {path}: {why}; run scripts/bootstrap-cad.sh as root "
        "(umask 022) or set the toolchains_dir setting to a world-readable directory"
    )


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
def trimesh_toolchain(root: Path | None = None) -> Toolchain:
    own = toolchains_root(root) / "trimesh"
    if (own / "UNAVAILABLE").is_file():
        return Toolchain("trimesh", None, (own / "UNAVAILABLE").read_text().strip())
    if (own / "trimesh").is_dir() and (own / ".palaestra-installed").is_file():
        return _reachable(Toolchain("trimesh", str(own)))
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
    return _reachable(Toolchain("trimesh", str(dirs["numpy"])))


def _reachable(chain: Toolchain) -> Toolchain:
    assert chain.site is not None
    why = unreachable_by_others(Path(chain.site))
    return chain if why is None else Toolchain(chain.name, None, why)


@functools.cache
def blender_toolchain(root: Path | None = None) -> Toolchain:
    venv = toolchains_root(root) / "blender"
    why = venv / "UNAVAILABLE"
    if why.is_file():
        return Toolchain("blender", None, why.read_text().strip())
    sites = sorted(venv.glob("lib/python3.*/site-packages"))
    site = next((s for s in sites if (s / "bpy").is_dir()), None)
    if site is None:
        return Toolchain("blender", None, f"no bpy under {venv} (run scripts/bootstrap-cad.sh)")
    if host_python_version() != (3, 11):
        return Toolchain("blender", None, f"{PYTHON} is not Python 3.11 (bpy 5.0.1 needs it)")
    return _reachable(Toolchain("blender", str(site)))


def toolchain(name: str, root: Path | None = None) -> Toolchain:
    """Toolchain `name` under `root` (default: the bootstrap script's rule)."""
    return trimesh_toolchain(root) if name == "trimesh" else blender_toolchain(root)


def ro_binds(root: Path | None = None) -> tuple[tuple[str, str], ...]:
    """The read-only binds of every available toolchain under `root`."""
    out = []
    for chain in (trimesh_toolchain(root), blender_toolchain(root)):
        if chain.site is not None:
            out.append((chain.site, SANDBOX_SITE[chain.name]))
    return tuple(out)
