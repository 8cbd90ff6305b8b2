"""`palaestra pack materialize DIR OUT`: a generator pack as a static pack (tasks.jsonl).

The generators run as a server runs a publish token's (server/packs/generate.py): each
split in its own sandbox, under the generate_* settings. There is no server secret here,
so every split, sealed ones too, is drawn from the pack's public seeds: whoever runs this
knows those tasks. The static pack keeps the pack's name, version, families and splits;
`pack check` and `pack publish` take it as they take any static pack.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from palaestra.cli.console import console, err, error, styled
from palaestra.server.config import Settings, load_settings
from palaestra.server.packs.generate import GenerateLimits, GenerationError, generate_pack
from palaestra.server.packs.loader import GeneratedSet, Pack, load_pack
from palaestra.server.packs.lock import LOCK_FILE, pack_files
from palaestra.server.packs.manifest import PackError, PackManifest, read_manifest
from palaestra.server.runtime import make_backend

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # TOML's bare keys; anything else is quoted


def manifest_toml(manifest: PackManifest) -> str:
    """pack.toml of `manifest` without its generators (keys quoted, values as JSON, which
    TOML reads the same for strings, numbers, booleans and lists)."""
    data = manifest.model_dump(mode="json", exclude={"generators"}, exclude_defaults=True)
    lines: list[str] = []

    def key(name: str) -> str:
        return name if BARE_KEY.fullmatch(name) else json.dumps(name)

    def table(prefix: str, values: dict[str, Any]) -> None:
        subs = {k: v for k, v in values.items() if isinstance(v, dict)}
        if len(subs) < len(values) or not values:  # a table of tables needs no header
            lines.append(f"\n[{prefix}]")
        lines.extend(f"{key(k)} = {json.dumps(v)}" for k, v in values.items() if k not in subs)
        for name, sub in subs.items():
            table(f"{prefix}.{key(name)}", sub)

    lines.extend(f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict))
    for name, value in data.items():
        if isinstance(value, dict):
            table(key(name), value)
    return "\n".join(lines) + "\n"


def task_record(pack: Pack, task_id: str) -> dict[str, Any]:
    task = pack.tasks[task_id]
    return {
        "id": task.id,
        "family": task.family,
        "domain": task.domain,
        "split": task.split,
        "difficulty": task.difficulty,
        "expected_reward": pack.expected_reward(task_id),
        "public": task.public,
        "private": task.private,
    }


def generate_in_sandboxes(
    root: Path, manifest: PackManifest, settings: Settings, secret: bytes | None = None
) -> GeneratedSet:
    """Every generator split of the pack at `root`, each in its own sandbox of this
    machine's backend, as a server generates a publish token's pack (sealed splits from
    `secret` when given, else from the pack's public seeds)."""

    async def run() -> GeneratedSet:
        backend = make_backend(settings)
        try:
            limits = GenerateLimits.from_settings(settings)
            return await generate_pack(backend.create, root, manifest, limits, secret)
        finally:
            await backend.aclose()

    return asyncio.run(run())


def materialize(root: Path, out: Path, *, force: bool = False) -> Pack:
    """Write the static form of the generator pack at `root` to `out` (atomically; an
    existing `out` only with `force`); raises PackError or GenerationError."""
    manifest = read_manifest(root)
    if manifest.source is not None:
        raise PackError(f"{root}: a [source] pack reads its tasks in-process; not materialized")
    if not manifest.generators:
        raise PackError(f"{root}: no [generators.*]: the pack is static already")
    if out.exists() and not force:
        raise PackError(f"{out} exists; pass --force to replace it")
    generated = generate_in_sandboxes(root, manifest, load_settings())
    pack = load_pack(root, generated=generated)
    skip = {
        "pack.toml",
        LOCK_FILE,
        "tasks.jsonl",
        *(g.module for g in manifest.generators.values()),
    }
    in_dirs = {p.name for p in (root / "tasks").iterdir()} if (root / "tasks").is_dir() else set()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for rel, path in pack_files(root).items():
            if rel not in skip:
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, work / rel)
        (work / "pack.toml").write_text(manifest_toml(manifest), encoding="utf-8")
        lines = [json.dumps(task_record(pack, i)) for i in sorted(pack.tasks) if i not in in_dirs]
        (work / "tasks.jsonl").write_text("".join(line + "\n" for line in lines), "utf-8")
        static = load_pack(work)
        if {i: t.digest for i, t in static.tasks.items()} != {
            i: t.digest for i, t in pack.tasks.items()
        }:
            raise PackError(f"{out}: the static pack's tasks differ from the generated ones")
        os.chmod(work, 0o755)
        old = out.with_name(f".{out.name}.old")
        if out.exists():
            os.rename(out, old)
        os.rename(work, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    static.root = out
    return static


def register(pack_app: typer.Typer) -> None:
    """Add `materialize` to the `pack` command group."""

    @pack_app.command("materialize")
    def materialize_cmd(
        directory: Annotated[Path, typer.Argument(help="a generator pack directory")],
        out: Annotated[Path, typer.Argument(help="the static pack directory to write")],
        force: Annotated[bool, typer.Option(help="replace OUT if it exists")] = False,
    ) -> None:
        """Run a generator pack's generators in sandboxes; write it as a static pack."""
        try:
            pack = materialize(directory, out, force=force)
        except PackError as exc:
            for problem in exc.problems:
                error(problem)
            raise typer.Exit(2) from None
        except GenerationError as exc:
            error(str(exc), "generator_failed")
            raise typer.Exit(1) from None
        sealed = sorted(s for s, is_sealed in pack.sealed.items() if is_sealed)
        console.print(f"{pack.name}@{pack.version}: wrote {len(pack.tasks)} tasks to {out}")
        if sealed:
            err.print(
                styled(
                    "note",
                    "yellow",
                    f": sealed split(s) {', '.join(sealed)} drawn from the "
                    "pack's public seeds are known to whoever runs this; publish the generator "
                    "pack itself for held-out tasks a server draws from its secret",
                )
            )
