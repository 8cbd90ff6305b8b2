"""The exact reference of a task: its builder's manifold3d solid, measured once and memoised."""

from __future__ import annotations

import functools
import json
from typing import Any

from palaestra.envs.cad import builders
from palaestra.verifiers.mesh import Reference, make_reference

# Parts whose wall thickness is specified and checked.
WALL_DOMAINS = frozenset({"mug", "enclosure", "tube", "tray"})


def reference(domain: str, params: dict[str, Any]) -> Reference:
    """The reference of `domain` built from `params` (memoised: pure and deterministic)."""
    return _cached(domain, json.dumps(params, sort_keys=True))


@functools.lru_cache(maxsize=128)
def _cached(domain: str, params_json: str) -> Reference:
    solid, probes = builders.build(domain, json.loads(params_json))
    return make_reference(solid, probes, walls=domain in WALL_DOMAINS)
