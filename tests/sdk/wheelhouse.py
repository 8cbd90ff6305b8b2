"""Wheels made offline: palaestra's own (built from this checkout) and its dependencies
repacked from what this venv has installed, so a test can make a fresh venv with
`pip install --no-index --find-links` and never reach a registry.

A dependency's installed files (its RECORD) plus its .dist-info are what its wheel held;
zipped again with a fresh RECORD they install as the same distribution. Only the
requirements a light install resolves to are repacked (markers evaluated, extras
followed), so the fresh venv holds exactly what pip would have fetched from PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


def build_palaestra(dest: Path, scratch: Path) -> Path:
    """The wheel of this checkout (its tracked and unignored files, copied first so the
    build never writes into the checkout)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    source = scratch / "source"
    for rel in filter(None, listed.split("\0")):
        path = ROOT / rel
        if path.is_file() and not path.is_symlink():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / rel)
    dest.mkdir(parents=True, exist_ok=True)
    offline = ["--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", *offline, "-w", str(dest), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dest.glob("palaestra-*.whl")
    return wheel


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(dist: metadata.Distribution, dest: Path) -> Path:
    """A wheel of the installed distribution `dist` (its console scripts left out: only
    its importable files matter here)."""
    info = next(p for p in dist.files or [] if p.parts[0].endswith(".dist-info")).parts[0]
    wheel_meta = dist.read_text("WHEEL") or ""
    tag = re.search(r"^Tag: (\S+)$", wheel_meta, re.M)
    assert tag, f"{dist.metadata['Name']}: no Tag in its WHEEL file"
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    wheel = dest / f"{name}-{dist.version}-{tag.group(1)}.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue
            if file.parts[0] == info and file.name in SKIPPED:
                continue
            path = Path(str(file.locate()))
            if not path.is_file():
                continue
            data = path.read_bytes()
            out.writestr(str(file), data)
            records.append(_record_line(str(file), data))
        records.append(f"{info}/RECORD,,")
        out.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return wheel


def closure(
    requirements: Iterable[str], missing: set[str] | None = None
) -> dict[str, metadata.Distribution]:
    """The installed distributions `requirements` resolve to, with theirs, transitively.

    A requirement this venv lacks fails, unless `missing` is given: then its name is added
    there (a trainer adapter's peer lives in a venv of its own)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        key = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            if missing is None:
                raise
            missing.add(key)
            continue
        if missing is None:
            assert req.specifier.contains(dist.version, prereleases=True), (
                f"{req} is not met by the installed {dist.version}"
            )
        first = key not in found
        found[key] = dist
        for wanted in ([""] if first else []) + sorted(req.extras):
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return found


def wheelhouse(dest: Path, scratch: Path, extras: Iterable[str] = ()) -> Path:
    """A folder holding palaestra's wheel and its dependencies' (with `extras`)."""
    wheel = build_palaestra(dest, scratch)
    with zipfile.ZipFile(wheel) as built:
        meta = next(n for n in built.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in built.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    roots = [
        r
        for r in requires
        if (req := Requirement(r)).marker is None
        or any(req.marker.evaluate({"extra": e}) for e in ["", *extras])
    ]
    for dist in closure(str(Requirement(r)).split(";")[0] for r in roots).values():
        repack(dist, dest)
    return dest
