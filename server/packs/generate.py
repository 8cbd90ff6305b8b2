"""Running a pack's generators in sandboxes: how a publish token's generator pack is made.

Each generator split runs once, in a fresh sandbox of its own (so one split's run cannot
pass anything to another's: a sealed split's tasks never reach a public one), under the
limits of `GenerateLimits` (Settings generate_*): no network, a time limit for the whole
split, memory, processes and printed bytes. Its /work holds the pack's files alone; it sees
a read-only Python, the interpreter's site-packages and palaestra's own envs, sdk,
verifiers and sandbox packages (envs imports sandbox, served from a copy the sandbox uid
can read: server/served.py), each bound read-only, and nothing of
the server: not its data dir, the pack store, other packs, its environment or its secret.
A sealed split's seeds are drawn from the secret here and passed in as numbers.

The program that runs inside is server/packs/programs/generate.py. What it prints is the
generator's to control, so every result is checked here and again by the loader, like any
task. A failure names the generator, the split and the cause (a timeout, a limit, an
exception's type); a sealed split's causes quote nothing it printed or raised.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.sandbox import Sandbox, SandboxSpec, programs
from palaestra.sandbox.forkrun import PYTHON
from palaestra.server import served
from palaestra.server.config import Settings
from palaestra.server.packs.drawing import Draws, stored_split
from palaestra.server.packs.loader import GeneratedSet, generator_seeds
from palaestra.server.packs.lock import pack_files
from palaestra.server.packs.manifest import PackError, PackManifest

PROGRAM = programs.text("generate.py", package="palaestra.server.packs.programs")
LIB = "/opt/palaestra/lib"  # palaestra's packages, as the package LIB/palaestra
SITE = "/opt/palaestra/site"  # the interpreter's site-packages

SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]


class GenerationError(Exception):
    """A generator split failed in its sandbox; the message says which and why."""


@dataclass(frozen=True)
class GenerateLimits:
    timeout_s: float = 120.0
    memory_mb: int = 1024
    max_output_mb: int = 16
    pids: int = 64
    max_splits: int = 16  # generator splits a pack may have (each runs up to timeout_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> GenerateLimits:
        return cls(
            settings.generate_timeout_s,
            settings.generate_memory_mb,
            settings.generate_max_output_mb,
            settings.generate_pids,
            settings.generate_max_splits,
        )


def library_binds() -> tuple[tuple[str, str], ...]:
    """What a generator may import, bound read-only: palaestra's packages from the served
    copy (server/served.py: a folder the sandbox uid can read, never the checkout or venv
    they were installed in) and the interpreter's site-packages. An editable install's
    finder there maps palaestra to checkout paths the sandbox does not have; `-S` keeps its
    .pth from running anyway."""
    binds = [(str(served.library().packages), f"{LIB}/palaestra")]
    binds += [(site, f"{SITE}{i}") for i, site in enumerate(served.site_dirs())]
    return tuple(binds)


def split_calls(
    manifest: PackManifest, generator: str, split: str, secret: bytes | None, draw: int = 0
) -> list[dict[str, int]]:
    """The (seed, index, level) calls of one split, with the loader's seeds and levels
    (`draw`: a sealed split's held-out draw, server/draws.py)."""
    gen = manifest.generators[generator]
    sealed = manifest.splits[split].sealed
    seeds = generator_seeds(
        manifest.name, generator, split, gen.splits[split], secret if sealed else None, draw
    )
    levels = gen.levels
    return [
        {"seed": seed, "index": i, "level": levels[i % len(levels)]} for i, seed in enumerate(seeds)
    ]


async def generate_pack(
    create: SandboxFactory,
    root: Path,
    manifest: PackManifest,
    limits: GenerateLimits,
    secret: bytes | None = None,
    draws: Draws | None = None,
    only: set[str] | None = None,
) -> GeneratedSet:
    """Every generator split of the pack at `root`, each in its own sandbox (a sealed
    split at its held-out draw in `draws`, stored under `stored_split`; `only`: just these
    splits, a rotation); raises GenerationError on the first that fails."""
    splits = sum(len(gen.splits) for gen in manifest.generators.values())
    if splits > limits.max_splits:  # before any sandbox: a pack's publish time is bounded
        raise GenerationError(
            f"the pack has {splits} generator splits, more than the {limits.max_splits} a "
            "publish may run (generate_max_splits); generate fewer splits, or ask an admin"
        )
    files = {rel: path.read_bytes() for rel, path in pack_files(root).items()}
    out: GeneratedSet = {}
    for gen_name, gen in manifest.generators.items():
        for split in gen.splits:
            if only is not None and split not in only:
                continue
            sealed = manifest.splits[split].sealed
            draw = (draws or {}).get((manifest.name, split), 0) if sealed and secret else 0
            try:
                calls = split_calls(manifest, gen_name, split, secret, draw)
            except PackError as exc:
                raise GenerationError(f"generators.{gen_name}, split {split}: {exc}") from None
            where = f"generators.{gen_name}, split {split}"
            tasks = await run_split(create, files, gen.module, calls, limits, where, sealed)
            out.setdefault(gen_name, {})[stored_split(split, draw)] = tasks
    return out


async def run_split(
    create: SandboxFactory,
    files: dict[str, bytes],
    module: str,
    calls: list[dict[str, int]],
    limits: GenerateLimits,
    where: str,
    sealed: bool,
) -> list[dict[str, Any]]:
    """One split's calls in one fresh sandbox; each call's task dict."""
    size_mb = sum(len(data) for data in files.values()) >> 20
    spec = SandboxSpec(
        workspace_mb=64 + size_mb,
        memory_mb=limits.memory_mb,
        pids=limits.pids,
        network=False,
        default_timeout_s=limits.timeout_s,
        ro_binds=library_binds(),
    )
    path = [LIB, *(target for _, target in spec.ro_binds if target.startswith(SITE))]
    job = json.dumps({"path": path, "module": module, "calls": calls}).encode()
    max_output = limits.max_output_mb << 20
    async with await create(spec) as box:
        for rel, data in files.items():
            await box.write_file(rel, data)
        result = await box.exec(
            [PYTHON, "-I", "-S", "-c", PROGRAM],
            stdin=job,
            timeout=limits.timeout_s,
            max_output=max_output,
        )
    said = "" if sealed else f": {result.stderr.strip()[-300:]}"
    if result.timed_out:
        raise GenerationError(
            f"{where}: timed out after {limits.timeout_s:g} s (generate_timeout_s)"
        )
    if result.oom_killed:
        raise GenerationError(
            f"{where}: ran out of memory ({limits.memory_mb} MB, generate_memory_mb)"
        )
    if result.truncated:
        raise GenerationError(
            f"{where}: printed more than {limits.max_output_mb} MB (generate_max_output_mb)"
        )
    if result.exit_code != 0:
        raise GenerationError(f"{where}: the generator's process exited {result.exit_code}{said}")
    return _results(result.stdout, len(calls), where, sealed)


def _results(stdout: str, count: int, where: str, sealed: bool) -> list[dict[str, Any]]:
    try:
        results = json.loads(stdout)["results"]
    except Exception:  # anything the generator wrote there instead (deep nesting too)
        raise GenerationError(f"{where}: the generation run wrote no results") from None
    if not isinstance(results, list) or len(results) != count:
        raise GenerationError(f"{where}: the generation run wrote no results for every call")
    tasks = []
    for index, entry in enumerate(results):
        task = entry.get("task") if isinstance(entry, dict) else None
        if isinstance(task, dict):
            tasks.append(task)
            continue
        if task is not None:
            kind = type(task).__name__
            raise GenerationError(f"{where}: generate(index={index}) returned {kind}, not a dict")
        error = entry.get("error") if isinstance(entry, dict) else None
        message = entry.get("message") if isinstance(entry, dict) else None
        raised = error if isinstance(error, str) else "no task dict"
        why = "" if sealed or not isinstance(message, str) else f": {message[:300]}"
        raise GenerationError(f"{where}: generate(index={index}) raised {raised[:100]}{why}")
    return tasks
