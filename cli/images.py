"""`palaestra images build [NAME]` and `palaestra images list`: sandbox images from images/.

No registry is reachable, so every image is built locally: `base` by images/base/build.sh
(debootstrap bookworm -> a rootfs kept in the cache for bwrap -> `docker import` as
palaestra/base:bookworm), every other folder of images/ holding a Dockerfile by
`docker build` as palaestra/<name>:latest (FROM the base); the toolchain stand-ins (golang,
rust, node, java, gcc) and python3.13 only by name or when a pack's environment needs one.
A recipe FROM palaestra/base:<suite> other than bookworm (python3.13: trixie) has that
suite's base made first by the same script (PALAESTRA_BASE_SUITE). Builds are
cached: the base's rootfs tarball under $PALAESTRA_CACHE (default ~/.cache/palaestra), the
images in the engine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from palaestra.cli import envimages
from palaestra.cli.console import console, err, error
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import Stop
from palaestra.envs.terminal.envimage import BuildResult
from palaestra.envs.terminal.verifierimage import (
    DEFAULT_TAG,
    TOOLS_IMAGE,
    build_declared,
    build_tools_image,
    export_rootfs,
    has_image,
)
from palaestra.sandbox.docker.engine import image_ref
from palaestra.sandbox.docker.standins import ON_DEMAND
from palaestra.server.config import REPO_IMAGES, load_settings
from palaestra.server.packs.loader import inspect_pack

BASE_SUITE = "bookworm"
BASE_TAG = f"palaestra/base:{BASE_SUITE}"
_FROM_BASE = re.compile(r"^FROM\s+palaestra/base:([a-z]+)\s*$", re.M)
_FROM_IMAGE = re.compile(r"^FROM\s+palaestra/([a-z0-9._-]+):latest", re.M)
SITE_CA = "site-ca.crt"

images_app = typer.Typer(help="Build and list the sandbox images (images/).", no_args_is_help=True)


def images_dir() -> Path:
    """images/ of the source tree: the recipes."""
    return REPO_IMAGES


def cache_dir() -> Path:
    """Settings' cache folder (PALAESTRA_CACHE): built rootfs folders live under it."""
    return load_settings().cache


def base_rootfs() -> Path:
    """The base image's rootfs directory (for bwrap), once `images build base` ran."""
    return cache_dir() / "images" / "base" / "rootfs"


def recipes() -> dict[str, Path]:
    """name -> recipe (base's build.sh, or a family's Dockerfile), base first."""
    root = images_dir()
    found: dict[str, Path] = {}
    if (root / "base" / "build.sh").is_file():
        found["base"] = root / "base" / "build.sh"
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if d.name != "base" and (d / "Dockerfile").is_file():
            found[d.name] = d / "Dockerfile"
    return found


def tag_of(name: str) -> str:
    return BASE_TAG if name == "base" else f"palaestra/{name}:latest"


def docker_client() -> Any:
    """The docker engine (the SDK client), or exit 2 saying why it cannot be reached."""
    try:
        import docker
    except ImportError:
        error("the docker SDK is missing: pip install 'palaestra[docker]'")
        raise typer.Exit(2) from None
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as e:
        error(f"docker engine unavailable: {e} (scripts/docker-up.sh)")
        raise typer.Exit(2) from None
    return client


def build_base(*, force: bool = False, suite: str = BASE_SUITE) -> None:
    """images/base/build.sh for `suite` (palaestra/base:<suite>; bookworm's also for bwrap)."""
    script = recipes().get("base")
    if script is None:
        raise RuntimeError(f"no images/base/build.sh under {images_dir()}")
    env = dict(os.environ, PALAESTRA_CACHE=str(cache_dir()), FORCE="1" if force else "0")
    env["PALAESTRA_BASE_SUITE"] = suite
    env.pop("PALAESTRA_BASE_TAG", None)  # the suite names the tag
    subprocess.run(["bash", str(script)], check=True, env=env)


def base_suite(name: str) -> str | None:
    """The Debian suite of the base image recipe NAME is FROM (None: FROM another recipe)."""
    found = _FROM_BASE.search(recipes()[name].read_text())
    return found.group(1) if found else None


def ensure_base(client: Any, suite: str = BASE_SUITE) -> None:
    """palaestra/base:<suite> in the engine (built by images/base/build.sh unless it is)."""
    if not has_image(client, f"palaestra/base:{suite}"):
        build_base(suite=suite)


def build_family(client: Any, name: str, *, force: bool = False) -> None:
    """`docker build` images/NAME as palaestra/NAME:latest (the legacy builder: no pulls),
    from a copy of the folder with the site's trust store as site-ca.crt
    (Settings.build_ca_file; empty without one) for the recipes that add it."""
    folder = recipes()[name].parent
    tag = tag_of(name)
    ca = load_settings().build_ca_file
    with tempfile.TemporaryDirectory(prefix="palaestra-image-") as tmp:
        context = Path(tmp) / name
        shutil.copytree(folder, context)
        ca_text = ca.read_bytes() if ca is not None and ca.is_file() else b""
        (context / SITE_CA).write_bytes(ca_text)
        # The build's RUN steps use the host's network (apt-get); dockerd runs without a bridge.
        for chunk in client.api.build(
            path=str(context),
            tag=tag,
            rm=True,
            forcerm=True,
            nocache=force,
            decode=True,
            network_mode="host",
        ):
            if "error" in chunk:
                raise RuntimeError(f"docker build {name}: {chunk['error'].strip()}")
            line = str(chunk.get("stream", "")).rstrip()
            if line.startswith("Step ") or line.startswith("Successfully tagged"):
                err.print(f"images/{name}: {line}")


def ensure_image(client: Any, name: str) -> None:
    """images/NAME built (with the images/ recipe it is FROM, or the base of its suite) unless
    the engine has it."""
    if name == "base":
        ensure_base(client)
        return
    if has_image(client, tag_of(name)):
        return
    parent = _FROM_IMAGE.search(recipes()[name].read_text())
    if parent and parent.group(1) in recipes():
        ensure_image(client, parent.group(1))
    else:
        ensure_base(client, base_suite(name) or BASE_SUITE)
    build_family(client, name)


def build_pack_environments(
    pack: Path,
    *,
    force: bool = False,
    report: Path | None = None,
    rootfs: bool = False,
    command: str = "images build --pack",
) -> list[BuildResult]:
    """Build (or find cached) the environment image of every task of `pack` that has one,
    print a line per environment; each one's result (status "failed" with its cause)."""
    client = docker_client()
    settings = load_settings()
    with Stop(command), LiveProgress(f"environments of {pack}", unit="images") as progress:
        results = envimages.build_pack(
            pack,
            settings,
            lambda image: ensure_image(client, image),
            force=force,
            rootfs_dir=(settings.images_dir or settings.cache / "images") if rootfs else None,
            on_start=progress.start,
            on_built=lambda r: progress.advance(note=f"{r.image} {r.status}"),
        )
    envimages.render(results, err)
    if report is not None:
        envimages.write_report(report, pack, results)
    return results


@images_app.command("build")
def build(
    name: Annotated[str | None, typer.Argument(help="one image (default: all)")] = None,
    force: Annotated[bool, typer.Option(help="rebuild even when cached")] = False,
    pack: Annotated[
        Path | None,
        typer.Option(help="build this pack's task environments (docker) instead of images/"),
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="with --pack: also write the build report (JSON) here")
    ] = None,
    rootfs: Annotated[
        bool, typer.Option(help="with --pack: also export each as a bwrap rootfs (images_dir)")
    ] = False,
) -> None:
    """Build the base image, then each family's (or only NAME, with the base it needs); with
    --pack, the environment image of every task of the pack that has one."""
    if pack is not None:
        results = build_pack_environments(pack, force=force, report=report, rootfs=rootfs)
        raise typer.Exit(1 if any(r.status == "failed" for r in results) else 0)
    known = recipes()
    if name is not None and name not in known:
        error(f"no recipe {name!r}; images/ has: {', '.join(known)}")
        raise typer.Exit(2)
    client = docker_client()
    # The toolchain stand-ins are built when a pack's environment needs one (or by name).
    wanted = [n for n in known if n not in ON_DEMAND] if name is None else [name]
    with Stop("images build"), LiveProgress("images build", len(wanted), unit="images") as bar:
        for image in wanted:
            _build_one(client, image, force)
            bar.advance(note=f"{image} ready")


def _build_one(client: Any, image: str, force: bool) -> None:
    """Build images/IMAGE (with what it needs), or exit 1 saying why it failed."""
    started = time.perf_counter()
    try:
        if image == "base":
            build_base(force=force)
        elif image == "verifier":  # wheels come from the host's pip first
            if not has_image(client, tag_of("terminal")):
                build_family(client, "terminal")
            build_tools_image(client, cache_dir(), force=force)
            settings = load_settings()  # bwrap runs it as the rootfs image "verifier"
            images = settings.images_dir or settings.cache / "images"
            export_rootfs(client, DEFAULT_TAG, images, TOOLS_IMAGE)
        else:
            ensure_base(client, base_suite(image) or BASE_SUITE)
            if not force and has_image(client, tag_of(image)):
                err.print(f"images/{image}: {tag_of(image)} already built")
                return
            build_family(client, image, force=force)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        error(f"building {image}: {e}")
        raise typer.Exit(1) from None
    err.print(f"images/{image}: {tag_of(image)} ready ({time.perf_counter() - started:.1f} s)")


@images_app.command("verifiers")
def verifiers(
    pack: Annotated[Path, typer.Argument(help="a pack folder")],
) -> None:
    """Build the verifier images PACK's terminal tasks declare ([private] verifier_image)."""
    loaded, problems = inspect_pack(pack)
    if loaded is None:
        error(f"{pack}: {'; '.join(problems)}")
        raise typer.Exit(2)
    declared = {
        tid: (
            str(task.private["verifier_image"]),
            dict(task.private.get("verifier") or {}),
            image_ref(task.public.get("image") or "terminal"),
        )
        for tid, task in loaded.tasks.items()
        if task.family == "terminal" and task.private.get("verifier_image")
    }
    built = build_declared(docker_client(), cache_dir(), declared)
    for tid, result in built.items():
        err.print(f"{tid}: {result}")
    failed = [tid for tid, result in built.items() if result.startswith("error:")]
    err.print(f"{len(built) - len(failed)} of {len(built)} verifier images ready")
    if failed:
        raise typer.Exit(1)


@images_app.command("list")
def list_() -> None:
    """The recipes under images/ and whether their image is built."""
    try:
        import docker

        client: Any = docker.from_env(timeout=10)
        client.ping()
    except Exception:
        client = None
    table = Table("image", "tag", "recipe", "built", "size")
    for name, recipe in recipes().items():
        built, size = "engine unavailable", ""
        if client is not None:
            try:
                img = client.images.get(tag_of(name))
                built = str(img.attrs.get("Created", "yes"))[:19]
                size = f"{img.attrs.get('Size', 0) / 1e6:.0f} MB"
            except Exception:
                built = "no"
        if name == "base" and (base_rootfs() / "usr" / "bin").is_dir():
            size += f" (rootfs: {base_rootfs()})"
        table.add_row(name, tag_of(name), str(recipe.relative_to(images_dir().parent)), built, size)
    console.print(table)
