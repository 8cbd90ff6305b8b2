"""Check the import-linter contracts of pyproject.toml ([tool.importlinter]) on `palaestra`
as the editable install maps it (docs/reference/install.md, "The layering contracts").

import-linter (grimp) finds a package's modules by walking its folder, and setuptools'
package-dir puts palaestra.sdk in sdk/, palaestra.server in server/, …: this lays out the
package as one tree of symlinks (`<tree>/palaestra/sdk/gym.py -> …/sdk/gym.py`, …) and runs
`lint-imports` from there, so the graph holds every module under its dotted name. A package
of pyproject's `packages` that has no `__init__.py` (server/cluster/) gets an empty one in
the tree: grimp skips such a folder inside a regular package. Arguments go to
`lint-imports` (`--verbose`, `--contract ID`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = {"palaestra.packs", "palaestra.images"}  # folders shipped as data, not code


def lay_out_tree(tree: Path) -> None:
    """`tree/palaestra/…`: every module of the package, linked under its dotted path."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = config["package-dir"]
    for package, folder in mapping.items():
        if package in DATA:
            continue
        source = ROOT / folder
        # palaestra/ holds the package's own modules only; its subpackages are linked below
        paths = source.glob("*.py") if package == "palaestra" else source.rglob("*.py")
        for path in paths:
            rel = path.relative_to(source)
            if any(not part.isidentifier() for part in rel.parent.parts):
                continue  # not a package folder (__pycache__, .hidden)
            link = tree.joinpath(*package.split("."), rel)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    for package in config["packages"]:
        init = tree.joinpath(*package.split("."), "__init__.py")
        if package not in DATA and init.parent.is_dir() and not init.exists():
            init.touch()


def main(argv: list[str]) -> int:
    (ROOT / ".cache").mkdir(exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="importlint-", dir=ROOT / ".cache"))
    try:
        lay_out_tree(tree)
        # lint-imports puts its working directory first on sys.path: the tree's `palaestra`
        # is found there, before the checkout's palaestra/ (the package's own modules only).
        os.chdir(tree)
        from importlinter.cli import lint_imports

        contracts = tuple(argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--contract")
        return lint_imports(
            config_filename=str(ROOT / "pyproject.toml"),
            limit_to_contracts=contracts,
            no_cache=True,
            no_logo=True,
            verbose="--verbose" in argv,
        )
    finally:
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
