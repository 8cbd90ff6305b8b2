"""Held-out draws in the loader's terms (server/draws.py rotates them): which splits a
rotation redraws, a draw's seeds and task ids, and where a sandbox-generated draw is stored.

Draw 0 is the set a server always drew (its seeds and ids unchanged); draw N > 0 draws its
seeds from the server's secret and N, never one an earlier draw of the split used."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from palaestra.server import heldout
from palaestra.server.packs.manifest import GeneratorSplit, PackError, PackManifest

# The held-out draw of each rotated sealed split: (pack name, split) -> draw.
Draws = Mapping[tuple[str, str], int]


def rotatable_splits(manifest: PackManifest) -> list[str]:
    """The sealed splits a generator draws: those a held-out rotation redraws."""
    found = {s for gen in manifest.generators.values() for s in gen.splits}
    return sorted(s for s in found if s in manifest.splits and manifest.splits[s].sealed)


def stored_split(split: str, draw: int) -> str:
    """The key a sandbox-generated draw of `split` is stored under (server/packs/
    genstore.py): draw 0 keeps the split's own name, so stores made before draws still load."""
    return split if draw <= 0 else f"{split}#draw-{draw}"


def sealed_id(generator: str, split: str, index: int, draw: int) -> str:
    """A sealed generated task's id: it names no seed, and draws never share one."""
    return f"{generator}-{split}-{index}" if draw <= 0 else f"{generator}-{split}-d{draw}-{index}"


def later_draw_seeds(
    earlier: Callable[[int], list[int]],
    label: str,
    spec: GeneratorSplit,
    secret: bytes,
    draw: int,
) -> list[int]:
    """Draw `draw`'s seeds (> 0): `spec.count` of its range drawn from the secret and the
    draw number, none of those `earlier(d)` gave for d < draw."""
    first, end = spec.seeds
    used: set[int] = set()
    for before in range(draw):
        used.update(earlier(before))
    if end - first - len(used) < spec.count:
        raise PackError(
            f"{label}: draw {draw} needs {spec.count} seeds no earlier draw used, and the "
            f"range [{first}, {end}) has {end - first - len(used)} left; widen the split's seeds"
        )
    return heldout.fresh_seeds(secret, f"{label}/draw-{draw}", first, end, spec.count, used)
