"""DESIGN §2, checked on the source: the import contracts (pyproject's [tool.importlinter])
and what they do not say (the mapping, private names, module size, the sdk's extras)."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# pyproject's package-dir entries that are not a folder of code: the package's own modules
# (palaestra/) and the data shipped as packages (packs/, images/)
NOT_CODE = {"palaestra", "palaestra.packs", "palaestra.images"}


def code_folders() -> list[str]:
    """The folders of palaestra's subpackages (pyproject's package-dir), data ones aside."""
    import tomllib

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return sorted(f for package, f in mapping["package-dir"].items() if package not in NOT_CODE)


FOLDERS = code_folders()  # cli, envs, sandbox, sdk, server, verifiers


def test_the_import_contracts_hold() -> None:
    """The layering is one declaration: pyproject's [tool.importlinter] contracts (DESIGN §2's
    direction, and the nested parts: server/packs, doors, harness, cluster, sdk/integrations),
    checked by import-linter as `make lint` runs it (docs/reference/install.md)."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lint_imports.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 broken" in run.stdout, run.stdout


def test_every_subpackage_is_mapped() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join(["palaestra", folder, *rel.parts])
            assert name in packages, f"{name} is missing from pyproject's packages"


def private_imports(path: Path) -> set[str]:
    """`from palaestra.X import _name` of another module in `path` (a module's underscore
    names are its own: what is shared is public in one place)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "palaestra":
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(f"{node.module}.{alias.name}")
    return found


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_private_imports_across_modules(folder: str) -> None:
    bad = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in (ROOT / folder).rglob("*.py")
        for name in private_imports(path)
    }
    assert not bad, sorted(bad)


def test_importers_live_beside_their_family() -> None:
    """An importer produces one family's tasks: it lives in that family's folder."""
    assert not list((ROOT / "cli").glob("import*.py"))
    for family in ("terminal", "finance"):
        assert (ROOT / "envs" / family / "importer.py").is_file()


def test_programs_are_files() -> None:
    """The programs the sandbox and the verifiers run are files of their packages, shipped
    as package data, not string literals."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = config["package-data"]
    for package, folder in (
        ("palaestra.sandbox.programs", ROOT / "sandbox" / "programs"),
        ("palaestra.verifiers.programs", ROOT / "verifiers" / "programs"),
    ):
        suffixes = {p.suffix for p in folder.iterdir() if p.is_file() and p.suffix != ".pyc"}
        patterns = data.get(package, [])
        for suffix in suffixes - {".py"}:
            assert f"*{suffix}" in patterns, f"{package}: *{suffix} is missing from package-data"


# the contract pieces every family may use (the generic cheat library among them)
SHARED_ENVS = {"base", "paths", "cheats", "cheatlib", "answer_forms", "repo_cheats"}
# Families declared to build on another's code (composed, not copied): finance-commentary
# reads the finance family's generated reports (docs/reference/judges.md, "The finance
# commentary pack").
BUILDS_ON = {"commentary": {"finance"}}


FAMILIES = sorted(p.name for p in (ROOT / "envs").iterdir() if (p / "__init__.py").exists())


def family_imports(family: str) -> list[tuple[Path, ast.ImportFrom]]:
    """Every absolute `from palaestra… import …` of a family's folder (lazy ones too)."""
    return [
        (path, node)
        for path in sorted((ROOT / "envs" / family).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.level == 0
        and (node.module or "").split(".")[0] == "palaestra"
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_touches_one_folder_under_envs(family: str) -> None:
    """A family imports from its own folder, the shared contract and the author's surface
    (`from palaestra.envs import <a name of its __all__>`) only, never another's folder."""
    import palaestra.envs

    surface = set(palaestra.envs.__all__)
    bad = set()
    for path, node in family_imports(family):
        assert node.module is not None
        parts = node.module.split(".")
        if parts[:2] == ["palaestra", "envs"] and len(parts) > 2:
            if parts[2] not in SHARED_ENVS | {family} | BUILDS_ON.get(family, set()):
                bad.add(f"{path.relative_to(ROOT)} imports {node.module}")
        elif parts == ["palaestra", "envs"]:
            names = {a.name for a in node.names} - surface
            bad |= {
                f"{path.relative_to(ROOT)} imports palaestra.envs.{n}"
                for n in names - SHARED_ENVS - {family} - BUILDS_ON.get(family, set())
            }
    assert not bad, sorted(bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_takes_the_contract_from_the_one_import(family: str) -> None:
    """What `palaestra.envs` re-exports (the contract, wire models, errors, sandbox types,
    judge helpers) a built-in family imports from there, never from the module behind it
    (`palaestra.envs.base`, `palaestra.sdk.models`, `palaestra.sandbox`, …): it is
    written as an outside family would be (docs/writing-a-family.md)."""
    import importlib

    import palaestra.envs

    surface = set(palaestra.envs.__all__)
    bad = set()
    for path, node in family_imports(family):
        assert node.module is not None
        if node.module == "palaestra.envs":
            continue
        module = importlib.import_module(node.module)
        bad |= {
            f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
            for a in node.names
            if a.name in surface
            and getattr(module, a.name, None) is getattr(palaestra.envs, a.name)
        }
    assert not bad, sorted(bad)


MAX_MODULE_LINES = 650  # "about 600": one concept a module


def test_no_source_module_is_over_about_600_lines() -> None:
    """A module past this holds more than one concept: split it (tests are exempt)."""
    folders = [*FOLDERS, "scripts", "bench"]
    long = {
        f"{path.relative_to(ROOT)}: {n} lines"
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
        and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, sorted(long)


# The light install (docs/reference/install.md, "A light SDK install"): `pip install palaestra` is
# the sdk with pydantic and httpx; a module that needs more names the extra that brings it.
SDK_EXTRAS = {
    "sdk/gym.py": {"gym"},
    "sdk/integrations/gym_vector.py": {"gym"},
    "sdk/integrations/trl.py": {"trl"},
    "sdk/integrations/verl.py": {"verl"},
    "sdk/integrations/skyrl.py": {"skyrl"},
    "sdk/integrations/tinker.py": {"tinker"},
    "sdk/policies/hf.py": {"train"},
    "sdk/train/": {"train"},
}
# Peers an sdk module drives in their own venv, never an extra: vLLM pins its own torch.
SDK_PEERS = {"sdk/train/vllm_engine.py": {"vllm"}}


def third_party_imports(path: Path) -> set[str]:
    """The top-level names of what `path` imports from outside the standard library and
    palaestra, at module level or inside a function alike (a lazy import still needs its
    package installed once it runs)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"palaestra", "__future__"}


def importable_names(requirements: list[str], owners: dict[str, list[str]]) -> set[str]:
    """The top-level import names the distributions `requirements` install (with theirs),
    by `owners` (import name: distributions); an adapter's peer, not installed here, by its
    own name."""
    from tests.sdk.wheelhouse import closure

    missing: set[str] = set()
    dists = set(closure(requirements, missing))
    provided = {
        name for name, by in owners.items() if any(canonicalize_name(d) in dists for d in by)
    }
    return provided | {name.replace("-", "_") for name in missing}


def test_sdk_imports_only_its_own_dependencies() -> None:
    """An sdk module imports the core's dependencies and its extra's, never the server's
    (fastapi, uvicorn, psycopg, prometheus, reasoning-gym, …): a trainer's venv has only
    `pip install palaestra[<extra>]`, and tests/sdk/test_light_install.py runs it there."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    owners = importlib.metadata.packages_distributions()
    allowed_by: dict[frozenset[str], set[str]] = {}
    bad = set()
    for path in sorted((ROOT / "sdk").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        wanted = frozenset().union(*(e for key, e in SDK_EXTRAS.items() if rel.startswith(key)))
        if wanted not in allowed_by:
            requirements = [*project["dependencies"], *(r for e in wanted for r in extras[e])]
            allowed_by[wanted] = importable_names(requirements, owners)
        allowed = allowed_by[wanted] | SDK_PEERS.get(rel, set())
        bad |= {f"{rel} imports {name}" for name in third_party_imports(path) - allowed}
    assert not bad, sorted(bad)


def test_the_family_contract_loads_no_sandbox_backend() -> None:
    """`palaestra.envs.base` (what every family imports) loads the sandbox interface and the
    run contract only, never a backend (bwrap, docker, the fork server): issue 33, item 4."""
    probe = "import sys, palaestra.envs.base; print(*sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = {m for m in out.stdout.split() if m.startswith("palaestra.sandbox")}
    assert loaded <= {"palaestra.sandbox", "palaestra.sandbox.base", "palaestra.sandbox.forkrun"}
