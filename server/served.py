"""palaestra's own code that sandboxes run, served from a folder the sandbox uid can read.

A sandbox runs as an unprivileged uid (bwrap as root: uid 1000 on the host; docker: the
image's user) and binds palaestra's packages (a generator's library) and the built-in
harness programs. Where palaestra is installed is the user's choice: a checkout in a 0700
home, a wheel in a venv under one, files written under umask 077. So those files are
copied, once per content, into ``<base>/lib-<digest>``: folders 0555, files 0444, renamed
into place whole (a half-written copy is never bound), where `base` is a folder every uid
can traverse (/run/palaestra/lib as root, ``<tmp>/palaestra-<uid>/lib`` otherwise). The copy
is a snapshot of the code this process imported: editing a checkout later changes nothing
a running server binds. `serve` makes it at start (`preflight`), so a location the
sandboxes cannot use is refused there, naming the path and the fix.

Third-party code a generator imports (the interpreter's site-packages) is too large to
copy: it is bound where it is (the bwrap backend reaches a folder under a closed one
through a read-only bind mount, sandbox/bwrap/mounts.py), and `preflight` refuses a
site-packages whose entries the sandbox uid could not read.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import palaestra
from palaestra import envs, sandbox, sdk, verifiers
from palaestra.sandbox.bwrap.host import default_runtime_base, is_root
from palaestra.sandbox.bwrap.mounts import closed_to
from palaestra.sandbox.preamble import SANDBOX_UID
from palaestra.sandbox.readable import unreadable_by_others
from palaestra.server.harness import programs as harness_programs

# What a sandbox may run of palaestra: the packages a generator imports (envs imports
# sandbox) as LIB/palaestra/<name> beside the package's own modules, and the built-in
# harness programs as harness/.
LIBRARY: tuple[ModuleType, ...] = (envs, sdk, verifiers, sandbox)
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")


class ServeError(Exception):
    """palaestra cannot serve its programs to sandboxes from here; the message says the
    path and the fix."""


@dataclass(frozen=True)
class ServedLibrary:
    """The served copy: `root` holds palaestra/<package>/ and harness/."""

    root: Path

    @property
    def packages(self) -> Path:
        """The folder bound as the namespace package ``palaestra`` inside a sandbox."""
        return self.root / "palaestra"

    @property
    def harness(self) -> Path:
        return self.root / "harness"


def default_base() -> Path:
    """Beside the bwrap backend's runtime folders: /run/palaestra/lib as root."""
    return default_runtime_base().parent / "lib"


def _sources() -> dict[str, Path]:
    """Every file to serve, by its path in the copy."""
    roots = {f"palaestra/{m.__name__.rsplit('.', 1)[-1]}": _folder(m) for m in LIBRARY}
    roots["harness"] = _folder(harness_programs)
    # The package's own modules (__init__, shipped): a regular package first on the path,
    # so a wheel's copy in a bound site-packages never stands in for the served one.
    top = _folder(palaestra)
    files = {f"palaestra/{p.name}": p for p in sorted(top.glob("*.py"))}
    for prefix, root in roots.items():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in filenames:
                if name.endswith(SKIP_SUFFIXES):
                    continue
                path = Path(dirpath) / name
                files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path
    return dict(sorted(files.items()))


def _folder(module: ModuleType) -> Path:
    return Path(str(module.__file__)).resolve().parent


def _digest(contents: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel, data in contents.items():
        for part in (rel.encode(), data):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()[:24]


def _ours(path: Path) -> bool:
    """Whether only we (or root) can change `path`: no one else may have planted a copy."""
    st = os.stat(path, follow_symlinks=False)
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def _make_base(base: Path) -> None:
    """`base` and any folder made above it: traversable by every uid, ours alone to change."""
    missing = [p for p in (base, *base.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o711)
        os.chmod(p, 0o711)
    if not _ours(base):
        raise ServeError(
            f"{base} belongs to another user or is writable by others; palaestra serves its "
            "sandbox programs only from a folder it owns: remove it, or start as its owner"
        )
    # A folder above it that someone else may change lets them rename `base` away and plant
    # another copy at the same path (/tmp/palaestra-<uid> made first by another user).
    for parent in base.parents:
        if not _safe_parent(parent):
            raise ServeError(
                f"{parent}, a folder above {base}, belongs to another user or is writable by "
                "others: they could replace palaestra's sandbox programs; remove it, or start with "
                "TMPDIR set to a folder of your own"
            )


def _safe_parent(path: Path) -> bool:
    """Ours or root's, and writable by no one else but as a sticky folder of root's (/tmp:
    others there cannot rename or remove what is ours)."""
    st = os.stat(path)
    if st.st_uid not in (0, os.geteuid()):
        return False
    return not st.st_mode & 0o022 or (st.st_uid == 0 and bool(st.st_mode & stat.S_ISVTX))


def _write(base: Path, name: str, contents: dict[str, bytes]) -> Path:
    dest = base / name
    if dest.is_dir():
        if not _ours(dest):
            raise ServeError(f"{dest} is not ours (or is writable by others): remove it")
        return dest
    tmp = base / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        for rel, data in contents.items():
            path = tmp / rel
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, 0o444)
        for dirpath, _, _ in os.walk(tmp, topdown=False):
            os.chmod(dirpath, 0o555)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():  # not "another server was first"
                raise
    finally:
        if tmp.exists():
            for dirpath, _, _ in os.walk(tmp):
                os.chmod(dirpath, 0o755)
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


@functools.cache
def library(base: Path | None = None) -> ServedLibrary:
    """The served copy under `base` (default `default_base`), made on first use; raises
    ServeError naming the folder and the fix."""
    base = default_base() if base is None else base
    try:
        contents = {rel: path.read_bytes() for rel, path in _sources().items()}
        _make_base(base)
        root = _write(base, f"lib-{_digest(contents)}", contents)
    except OSError as e:
        raise ServeError(
            f"cannot serve palaestra's sandbox programs from {base}: {e}; make it writable "
            "by this user (or remove it)"
        ) from e
    if is_root() and (closed := closed_to(root, SANDBOX_UID)) is not None:
        raise ServeError(
            f"the sandbox uid {SANDBOX_UID} cannot reach {root} ({closed} lacks o+x): "
            f"chmod o+x {closed}"
        )
    return ServedLibrary(root)


def site_dirs() -> tuple[str, ...]:
    """The interpreter's site-packages folders a generator imports third-party code from:
    every `site-packages` / `dist-packages` on sys.path (a venv's own, one a .pth or
    --system-site-packages adds), never a checkout or the current folder."""
    found = [
        p
        for p in sys.path
        if p and Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()
    ]
    return tuple(dict.fromkeys(str(Path(p).resolve()) for p in found))


def preflight(sandbox_backend: str, base: Path | None = None) -> ServedLibrary:
    """What `serve` checks before it answers: the served copy exists and is reachable, and
    (where the sandbox runs as another uid) each site-packages folder it binds is readable
    by others. Raises ServeError naming the path and the fix."""
    served = library(base)
    if is_root() or sandbox_backend == "docker":
        for site in site_dirs():
            why = unreadable_by_others(Path(site))
            if why is not None:
                raise ServeError(
                    f"the sandboxes cannot import from {site}: {why}; reinstall it with "
                    f"umask 022 or run: chmod -R o+rX {site}"
                )
    return served
