"""Verifier images for terminal tasks: where a task's tests run (docs/terminal.md).

Two kinds, both built into the local docker engine and cached by content digest:

* the **tools image** (`build_tools_image`): images/verifier/ on top of a base image (by
  default ``palaestra/terminal:latest``, also tagged ``palaestra/verifier:latest``): uv/uvx
  and the pinned wheels of images/verifier/wheels.txt, so the standard Terminal-Bench 2 /
  Harbor line ``uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest ...`` runs
  offline. The wheels are downloaded with pip on the host (its registry configuration) into
  ``<cache>/verifier-wheels/<digest>`` once; the image build itself needs no network.
* a **task's own verifier image** (`build_task_verifier_image`): a Harbor task's
  ``tests/Dockerfile`` (its separate verifier environment), built with tests/ as context,
  then the tools layer on top; tagged ``palaestra/task-verifier:<digest of tests/>``, which
  the importer writes into the task as ``[private] verifier_image``.

`export_rootfs` unpacks an image as a bwrap rootfs (``<images_dir>/verifier/rootfs`` for the
tools image), once per image id.
"""

from __future__ import annotations

import hashlib
import io
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from palaestra.shipped import shipped_dir

RECIPE = shipped_dir("images") / "verifier"
RECIPE_FILES = ("Dockerfile", "check.sh", "wheels.txt")
DEFAULT_BASE = "palaestra/terminal:latest"
DEFAULT_TAG = "palaestra/verifier:latest"
TOOLS_IMAGE = "verifier"  # a task's verifier_image naming the tools image (DEFAULT_TAG)
TOOLS_REPO = "palaestra/verifier"
TASK_REPO = "palaestra/task-verifier"
TASK_DOCKERFILE = "tests/Dockerfile"
# Interpreter versions whose dependency markers the wheel set covers (pure wheels otherwise).
WHEEL_PYTHONS = ("3.10", "3.11")
MAX_LOG = 3000


class VerifierImageError(RuntimeError):
    """A verifier image could not be built; the message names the step and the log's tail."""


def _digest(parts: Iterator[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def recipe_digest() -> str:
    """The digest of images/verifier/ (what the tools layer is made of)."""
    return _digest((RECIPE / name).read_bytes() for name in RECIPE_FILES)


def tools_tag(base: str = DEFAULT_BASE) -> str:
    """The tools image's tag for `base` (a docker image reference)."""
    return f"{TOOLS_REPO}:{_digest(iter((recipe_digest().encode(), base.encode())))}"


def task_dockerfile_digest(verifier: Mapping[str, str]) -> str | None:
    """The digest of a task's tests/ folder when it holds a Dockerfile, else None."""
    if TASK_DOCKERFILE not in verifier:
        return None
    files = sorted((rel, text) for rel, text in verifier.items() if rel.startswith("tests/"))
    return _digest(part for rel, text in files for part in (rel.encode(), text.encode()))


def task_verifier_tag(verifier: Mapping[str, str]) -> str | None:
    """``palaestra/task-verifier:<digest>`` for a task with tests/Dockerfile, else None."""
    digest = task_dockerfile_digest(verifier)
    if digest is None:
        return None
    return f"{TASK_REPO}:{_digest(iter((digest.encode(), recipe_digest().encode())))}"


# -- wheels ---------------------------------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_pins() -> dict[str, str]:
    """images/verifier/wheels.txt as {normalized name: pinned version}."""
    pins: dict[str, str] = {}
    for line in (RECIPE / "wheels.txt").read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if name:
            pins[_norm(name)] = version.strip()
    return pins


def missing_wheels(script: str) -> list[str]:
    """The `uvx -w/--with` requirements of `script` the verifier image cannot install
    offline (not in wheels.txt, or pinned to another version)."""
    pins = wheel_pins()
    text = script.replace("\\\n", " ")
    missing = []
    for req in re.findall(r"(?:^|\s)(?:-w|--with)(?:\s+|=)([^\s;&|]+)", text):
        req = req.strip("'\"")
        found = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(==\s*([^,\s]+))?", req)
        if found is None:
            continue
        name, version = _norm(found.group(1)), found.group(3)
        if name not in pins or (version is not None and version != pins[name]):
            missing.append(req)
    return sorted(set(missing))


def wheels_dir(cache: Path) -> Path:
    """The pinned wheels (uv's included), downloaded once per recipe into the cache."""
    target = cache / "verifier-wheels" / recipe_digest()
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix="wheels.", dir=cache))
    machine = platform.machine() or "x86_64"
    try:
        for version in WHEEL_PYTHONS:
            cmd = [
                sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(part),
                "--only-binary=:all:", "--platform", f"manylinux_2_17_{machine}",
                "--python-version", version, "-r", str(RECIPE / "wheels.txt"),
            ]  # fmt: skip
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise VerifierImageError(
                    f"pip download of images/verifier/wheels.txt: {exc}"
                ) from exc
            if done.returncode != 0:
                raise VerifierImageError(
                    f"pip download of images/verifier/wheels.txt (python {version}) failed: "
                    f"{(done.stderr or done.stdout)[-MAX_LOG:]}"
                )
        (part / ".complete").write_text("ok\n")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        part.rename(target)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return target


# -- building -------------------------------------------------------------------------------


def has_image(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except Exception:
        return False
    return True


def _build(client: Any, context: bytes, tag: str, *, buildargs: dict[str, str], what: str) -> None:
    log: list[str] = []
    try:
        for chunk in client.api.build(
            fileobj=io.BytesIO(context),
            custom_context=True,
            tag=tag,
            buildargs=buildargs,
            rm=True,
            forcerm=True,
            decode=True,
            network_mode="host",  # a task's own RUN steps may use a package mirror
        ):
            if "error" in chunk:
                tail = "".join(log)[-MAX_LOG:]
                raise VerifierImageError(f"{what}: {chunk['error'].strip()}\n{tail}")
            log.append(str(chunk.get("stream", "")))
    except VerifierImageError:
        raise
    except Exception as exc:
        raise VerifierImageError(f"{what}: docker build failed: {exc}") from exc


def _context(files: Mapping[str, bytes], dirs: Mapping[str, Path] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for rel, raw in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(raw)
            info.mode = 0o755 if rel.endswith(".sh") else 0o644
            tf.addfile(info, io.BytesIO(raw))
        for rel, folder in (dirs or {}).items():
            for path in sorted(folder.iterdir()):
                if path.suffix == ".whl":
                    tf.add(str(path), arcname=f"{rel}/{path.name}")
    return out.getvalue()


def build_tools_image(
    client: Any, cache: Path, base: str = DEFAULT_BASE, *, force: bool = False
) -> str:
    """The tools image on `base` (built when missing); returns its digest tag. On the
    default base it is also tagged ``palaestra/verifier:latest``."""
    tag = tools_tag(base)
    if force or not has_image(client, tag):
        if not has_image(client, base):
            raise VerifierImageError(f"the verifier image's base {base} is not in the engine")
        wheels = wheels_dir(cache)
        recipe = {name: (RECIPE / name).read_bytes() for name in RECIPE_FILES}
        context = _context(recipe, {"wheels": wheels})
        _build(client, context, tag, buildargs={"BASE": base}, what=f"verifier image on {base}")
    if base == DEFAULT_BASE:
        repo, _, label = DEFAULT_TAG.partition(":")
        client.images.get(tag).tag(repo, label)
    return tag


def build_task_verifier_image(
    client: Any, cache: Path, verifier: Mapping[str, str], *, force: bool = False
) -> str:
    """A task's tests/Dockerfile image (context: its tests/ files) with the tools layer on
    top; returns `task_verifier_tag(verifier)`. Raises VerifierImageError with the cause."""
    tag = task_verifier_tag(verifier)
    if tag is None:
        raise ValueError("the task has no tests/Dockerfile")
    if not force and has_image(client, tag):
        return tag
    own = f"{tag}-own"
    files = {
        rel.removeprefix("tests/"): text.encode()
        for rel, text in verifier.items()
        if rel.startswith("tests/")
    }
    _build(client, _context(files), own, buildargs={}, what="the task's tests/Dockerfile")
    built = build_tools_image(client, cache, own, force=force)
    client.images.get(built).tag(*tag.split(":", 1))
    return tag


def export_rootfs(client: Any, tag: str, images_dir: Path, name: str) -> Path:
    """`tag` unpacked as the bwrap image `name` (``<images_dir>/<name>/rootfs``), once per
    image id (``.image-id`` beside it); returns the rootfs folder."""
    image_id = str(client.images.get(tag).id)
    folder = images_dir / name
    root = folder / "rootfs"
    stamp = folder / ".image-id"
    if root.is_dir() and stamp.is_file() and stamp.read_text().strip() == image_id:
        return root
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / "rootfs.part"
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir()
    container = client.containers.create(tag, command=["/bin/true"])
    try:
        tar = subprocess.Popen(
            ["tar", "-x", "--numeric-owner", "--exclude=dev/*", "-C", str(part), "-f", "-"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert tar.stdin is not None
        for chunk in container.export():
            tar.stdin.write(chunk)
        tar.stdin.close()
        if tar.wait() != 0:
            err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
            raise VerifierImageError(f"unpacking {tag} as a rootfs failed: {err[-MAX_LOG:]}")
    finally:
        container.remove(force=True)
    shutil.rmtree(root, ignore_errors=True)
    part.rename(root)
    stamp.write_text(image_id + "\n")
    return root


def build_declared(
    client: Any, cache: Path, declared: Mapping[str, tuple[str, Mapping[str, str], str]]
) -> dict[str, str]:
    """Build what each task declares ({task id: (verifier_image, its verifier files, its
    agent image reference)}): the tools image for ``"verifier"``, the tools layer on the
    task's own image for ``tools_tag(<that image>)`` (a task with its own environment
    image), its own image for a tests/Dockerfile tag. Returns {task id: the tag built, or
    "error: <cause>"}; one task's failure never stops the others."""
    out: dict[str, str] = {}
    for task_id, (image, files, base) in sorted(declared.items()):
        try:
            if image == TOOLS_IMAGE:
                out[task_id] = build_tools_image(client, cache)
            elif image == tools_tag(base):
                out[task_id] = build_tools_image(client, cache, base)
            elif image == task_verifier_tag(files):
                out[task_id] = build_task_verifier_image(client, cache, files)
            else:
                out[task_id] = (
                    f"error: {image} is none of {TOOLS_IMAGE!r}, the tools layer on {base} "
                    f"({tools_tag(base)}) or this task's tests/Dockerfile image"
                )
        except VerifierImageError as exc:
            out[task_id] = f"error: {exc}"
    return out
