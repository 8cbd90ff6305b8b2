"""A pack's task environment images: `palaestra images build --pack DIR`, `pack import --build`.

Each terminal task with a build context (`[private] build`) runs in the image built from it,
named by the context's digest (envs/terminal/envimage.py): tasks that share a context share
one image, and one already in the engine is not rebuilt. The stand-in base images the
operator's alias map names for these contexts (`Settings.image_aliases`, e.g.
palaestra/golang) are built from images/ first where they are missing. Every environment is
reported built, cached or failed with the build log's cause; a failure never stops the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from palaestra.envs.terminal.envimage import (
    DOCKERFILE,
    BuildResult,
    build_env_image,
    export_rootfs,
    image_name,
    rewrite_from,
)
from palaestra.envs.terminal.fields import TerminalPrivate, TerminalPublic
from palaestra.server.config import Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.loader import inspect_pack

STAND_IN_PREFIX = "palaestra/"


@dataclass
class Environment:
    """One build context and the tasks that run in its image."""

    files: dict[str, str]
    workdir: str
    tasks: list[str] = field(default_factory=list)
    blobs: dict[str, Path] = field(default_factory=dict)  # binary files: the pack's blobs
    blob_refs: dict[str, str] = field(default_factory=dict)  # their digests, by path


def pack_environments(root: Path) -> tuple[dict[str, Environment], list[str]]:
    """image name -> its environment, over the pack's terminal tasks; plus the pack's problems."""
    pack, problems = inspect_pack(root, FamilyRegistry.discover().all())
    envs: dict[str, Environment] = {}
    if pack is None:
        return envs, problems
    for task in sorted(pack.tasks.values(), key=lambda t: t.id):
        if task.family != "terminal":
            continue
        build = TerminalPrivate.of(task).build
        if not build:
            continue
        refs = task.blob_refs("build")
        env = envs.setdefault(
            image_name(build, refs),
            Environment(build, TerminalPublic.of(task).workdir, [], task.blobs_of("build"), refs),
        )
        env.tasks.append(task.id)
    return envs, problems


def stand_ins(settings: Settings, envs: Iterable[Environment]) -> set[str]:
    """The images/ recipes these environments' FROM lines map to (palaestra/NAME:latest ->
    NAME): only those are built, not every stand-in of the alias map; none under a mirror."""
    names = set()
    for env in envs:
        _, mapped = rewrite_from(
            env.files.get(DOCKERFILE, ""), settings.image_aliases, settings.image_registry_mirror
        )
        for line in mapped:
            target = line.rsplit(" -> ", 1)[1]
            if target.startswith(STAND_IN_PREFIX):
                names.add(target[len(STAND_IN_PREFIX) :].split(":")[0])
    return names


def build_pack(
    root: Path,
    settings: Settings,
    ensure_image: Callable[[str], None],
    *,
    force: bool = False,
    rootfs_dir: Path | None = None,
    on_start: Callable[[int], None] | None = None,
    on_built: Callable[[BuildResult], None] | None = None,
) -> list[BuildResult]:
    """Build every environment of the pack at `root` (see the module docstring); with
    `rootfs_dir`, also export each image there as a bwrap rootfs of the same name.
    `on_start(n)` once the n environments are known, `on_built(result)` after each: the
    CLI's progress."""
    envs, problems = pack_environments(root)
    if problems and not envs:
        return [BuildResult("(pack)", "failed", "; ".join(problems))]
    if on_start is not None:
        on_start(len(envs))
    wanted = stand_ins(settings, envs.values())
    base_failures: dict[str, str] = {}
    for name in sorted(wanted):
        try:
            ensure_image(name)
        except Exception as exc:  # a stand-in that cannot be built: its users will say so
            base_failures[name] = f"stand-in image {name} could not be built: {exc}"
    results = []
    for env in envs.values():
        result = build_env_image(
            env.files,
            workdir=env.workdir,
            aliases=settings.image_aliases,
            timeout_s=settings.env_build_timeout_s,
            max_bytes=settings.env_context_max_mb * 2**20,
            force=force,
            blobs=env.blobs,
            blob_refs=env.blob_refs,
            mirror=settings.image_registry_mirror,
        )
        if result.status == "failed" and base_failures:
            result.cause += "\n" + "\n".join(base_failures.values())
        result.tasks = env.tasks
        if rootfs_dir is not None and result.status != "failed":
            try:
                export_rootfs(result.image, rootfs_dir)
            except RuntimeError as exc:
                result.status, result.cause = "failed", f"bwrap rootfs export: {exc}"
        results.append(result)
        if on_built is not None:
            on_built(result)
    return results


def render(results: list[BuildResult], out: Console) -> None:
    """One line per environment (and its cause, indented), then the counts."""
    colour = {"built": "green", "cached": "cyan", "failed": "red"}
    for r in results:
        out.print(
            Text.assemble(
                f"{r.image}: ",
                (r.status, colour.get(r.status, "white")),
                f" ({r.seconds:.0f} s) tasks: {', '.join(r.tasks)}",
            )
        )
        for line in r.cause.splitlines():
            out.print(f"    {line}")
    counts = {s: sum(r.status == s for r in results) for s in ("built", "cached", "failed")}
    out.print("environments: " + ", ".join(f"{n} {s}" for s, n in counts.items()))


def write_report(path: Path, pack: Path, results: list[BuildResult]) -> None:
    """The build report as JSON: per environment its tag, status, cause and tasks."""
    body = {"pack": str(pack), "environments": [r.as_json() for r in results]}
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
