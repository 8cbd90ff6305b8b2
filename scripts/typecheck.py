"""Run mypy over the `palaestra` package as the editable install maps it.

mypy cannot follow setuptools' editable import hook, so this lays out a tree of
symlinks (`.cache/typecheck/palaestra/sdk -> ../../../sdk`, …) and checks every module
by its dotted name. Paths in the output are rewritten to the real files.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = {"palaestra.packs", "palaestra.images"}  # folders shipped as data, not code


def cache_dir() -> Path:
    """mypy's cache, kept beside the sandbox caches (`default_cache()`): it survives a fresh
    clone, and mypy rechecks a file whose hash changed, so a stale or missing cache only
    costs time. One per checkout path (the cache records paths)."""
    base = Path.home() / ".cache" / "palaestra" / "mypy"
    return base / hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]


def main() -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    tree = ROOT / ".cache" / "typecheck"
    modules: list[str] = []
    for package, folder in mapping.items():
        if package == "palaestra" or package in DATA:
            continue
        link = tree / Path(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..", "..", "..", folder))
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if "__main__" not in parts:
                modules.append(".".join([package, *parts]))
    for own in sorted((ROOT / "palaestra").glob("*.py")):  # __init__, shipped
        link = tree / "palaestra" / own.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..", "..", "..", "palaestra", own.name))
        if own.stem != "__init__":
            modules.append(f"palaestra.{own.stem}")
    targets = [a for m in [*modules, "palaestra"] for a in ("-m", m)]
    args = [sys.executable, "-m", "mypy", "--cache-dir", str(cache_dir()), *targets]
    env = {"MYPYPATH": str(tree), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    out = run.stdout + run.stderr
    for package, folder in mapping.items():
        nested = package.replace(".", "/")
        out = out.replace(f".cache/typecheck/{nested}/", f"{folder}/")
        out = out.replace(f"{nested}/", f"{folder}/")
    print(out, end="")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
