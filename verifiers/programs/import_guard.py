"""The head of every verifier-side Python boot of the terminal runner (pytest_boot.py,
script_boot.py): run before anything of the task loads, it makes the process non-dumpable
and installs an import guard, so that no file of the agent's workspace ($WORKDIR) stands
in for the standard library or the test tooling.

Why a guard and not only the order of sys.path: a test may put the workspace first itself
(``sys.path.insert(0, "/app")``), and modules the standard library or pytest import lazily
(``difflib`` when an assertion fails, ``pygments``, ``tomli``…) would then come from there.
The guard sits before the path finder: a top-level name of the standard library or the test
tooling is looked up on sys.path without any workspace folder, and is refused when only the
workspace has it."""

import ctypes
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

try:  # noqa: SIM105
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
except Exception:
    pass

GUARD_TOOLING = frozenset(
    {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments",
     "exceptiongroup", "tomli", "colorama", "xdist", "execnet", "hypothesis", "typing_extensions",
     "pytest_timeout", "pytest_jsonctrf", "pytest_json_ctrf", "ctrf", "_palaestra"}
)  # fmt: skip


def _workspace_roots() -> list[str]:
    """$WORKDIR, and the cwd unless it is the verifier's own folder (or under it)."""
    vdir = os.path.realpath(os.environ.get("VERIFIER_DIR") or "/nonexistent")
    cwd = os.path.realpath(os.getcwd())
    roots = [os.path.realpath(os.environ.get("WORKDIR") or "/")]
    if not (cwd == vdir or cwd.startswith(vdir + "/")):
        roots.append(cwd)
    return [r for r in roots if r != "/"]


GUARD_ROOTS = _workspace_roots()


def in_workspace(path: str) -> bool:
    """Whether `path` ('' and '.' are the cwd) lies in the agent's workspace."""
    real = os.path.realpath(path or ".")
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in GUARD_ROOTS)


def guarded_name(name: str) -> bool:
    top = name.partition(".")[0]
    return top in sys.stdlib_module_names or top in GUARD_TOOLING or top.startswith("pytest_")


class WorkspaceGuard:
    """A meta-path finder: standard-library and test-tooling names never from the workspace."""

    @classmethod
    def find_spec(
        cls, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is not None or not guarded_name(name):
            return None  # submodules follow their (guarded) package's own __path__
        trusted = [p for p in sys.path if isinstance(p, str) and not in_workspace(p)]
        spec = importlib.machinery.PathFinder.find_spec(name, trusted)
        if spec is None:
            raise ModuleNotFoundError(
                f"palaestra: {name!r} is a standard-library or test-tooling name; the "
                "verifier does not load it from the agent's workspace",
                name=name,
            )
        return spec

    @classmethod
    def invalidate_caches(cls) -> None:
        return None


def install_guard() -> None:
    """Put the guard before the path finder and the workspace after everything else."""
    at = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
        len(sys.meta_path),
    )
    sys.meta_path.insert(at, WorkspaceGuard)
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None) or ""
        if origin and in_workspace(origin) and guarded_name(name):
            del sys.modules[name]  # nothing of the workspace may already stand in


def append_workspace(folder: str) -> None:
    """The workspace at the end of sys.path (never ahead of the verifier's own modules)."""
    sys.path[:] = [p for p in sys.path if p not in ("", ".", folder)]
    sys.path.append(folder)


def add_site() -> None:
    """The verifier's test-time installs (PALAESTRA_SITE: a folder of its own that no agent
    process could write) ahead of the interpreter's own packages, as PYTHONPATH would be."""
    site = os.environ.get("PALAESTRA_SITE")
    if site and os.path.isdir(site) and not in_workspace(site):
        packages = ("site-packages", "dist-packages")
        at = next((i for i, p in enumerate(sys.path) if p.endswith(packages)), len(sys.path))
        sys.path.insert(at, site)


add_site()
install_guard()
