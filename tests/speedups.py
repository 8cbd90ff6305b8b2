"""Work the suite's processes repeat that changes nothing they test, done once a process.

Measured on a 2-core machine whose suite ran past its 25 minutes (a fast-tier run of the
suite, per-worker counters and py-spy on its workers):

- **Built-in pack loads.** Every embedded manager (`build_manager`, most fixtures) reads
  and validates the eight repository packs: ~4,000 tasks, 0.6-0.9 s of CPU a manager.
  The fast tier built 469 managers, 267 s of CPU, a fifth of all it spent. A worker now
  loads each built-in pack once per set of inputs (families, policy, secret, draws,
  cached_only) and hands every later manager a copy of the result (the Pack object and its
  dicts copied, the frozen Tasks shared). Only packs under the checkout's packs/ are kept:
  no test writes there (a test that changes a pack copies it first), so the same inputs
  give the same pack. A load that raises is never kept: it runs again next time (a
  pack still warming, NotCached, is warmed and loaded for real).
- **TLS contexts of plain-HTTP clients.** httpx builds a TLS context for every client,
  loading certifi's CA bundle: 35 ms of CPU each here, so `httpx.get` in a readiness poll
  (every 50 ms) kept most of a core busy while a server started. The default context
  (`verify=True`, no client cert) is built once a process and shared (an SSLContext is
  made to be shared by connections and threads); every other form is built as before.

Installed by tests/conftest.py at import (each xdist worker imports it); subprocesses
(`palaestra serve`, the CLI) are untouched: what they do is what users get.
"""

from __future__ import annotations

import copy
import functools
import ssl
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from palaestra.server.config import REPO_PACKS
from palaestra.server.packs import catalog, loader, registry
from palaestra.server.packs.taskfields import HostPolicy

LoadPack = Callable[..., loader.Pack]


class BuiltInPacks:
    """Loaded built-in packs of this process, by everything a load depends on."""

    def __init__(self, load: LoadPack, packs_root: Path) -> None:
        self.load = load
        self.packs_root = packs_root.resolve()
        self.kept: dict[tuple[Any, ...], loader.Pack] = {}
        self.hits = 0

    def __call__(
        self,
        root: Path,
        known_families: Iterable[Any] | None = None,
        policy: HostPolicy | None = None,
        **options: Any,
    ) -> loader.Pack:
        families = list(known_families) if known_families is not None else None
        key = self.key(Path(root), families, policy, options)
        if key is None:
            return self.load(root, families, policy, **options)
        kept = self.kept.get(key)
        if kept is None:
            kept = self.kept[key] = self.load(root, families, policy, **options)
        else:
            self.hits += 1
        return fresh_copy(kept)

    def key(
        self,
        root: Path,
        families: list[Any] | None,
        policy: HostPolicy | None,
        options: Mapping[str, Any],
    ) -> tuple[Any, ...] | None:
        """What the load of `root` depends on, or None for a load not kept (a pack outside
        the checkout's packs/, a published pack's stored tasks)."""
        resolved = root.resolve()
        if resolved.parent != self.packs_root or options.get("generated") is not None:
            return None
        named = tuple(
            f if isinstance(f, str) else (f.name, type(f).__module__, type(f).__qualname__)
            for f in families or ()
        )
        cache = options.get("cache")
        return (
            str(resolved),
            families is None,
            named,
            policy,
            options.get("secret"),
            str(cache.folder) if cache is not None else None,
            tuple(sorted((options.get("broken") or {}).items())),
            options.get("cached_only", False),
            tuple(sorted((options.get("draws") or {}).items())),
        )


def fresh_copy(pack: loader.Pack) -> loader.Pack:
    """A Pack a catalog may change (its dicts) without changing the kept one; its Tasks are
    frozen and shared, as is where its blobs are (a built-in pack never moves)."""
    made = copy.copy(pack)
    for name in ("tasks", "expected", "sealed", "files", "unavailable", "draws"):
        setattr(made, name, dict(getattr(pack, name)))
    made.families = list(pack.families)
    return made


def shared_default_tls(create: Callable[..., ssl.SSLContext]) -> Callable[..., ssl.SSLContext]:
    """httpx's `create_ssl_context`, building the default context once."""
    default = functools.cache(lambda: create())

    @functools.wraps(create)
    def create_ssl_context(
        verify: Any = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is True and cert is None and trust_env:
            return default()
        return create(verify=verify, cert=cert, trust_env=trust_env)

    return create_ssl_context


def install() -> BuiltInPacks:
    """Put both in place for this process (idempotent); returns the pack memo."""
    current = catalog.load_pack
    if isinstance(current, BuiltInPacks):
        return current
    memo = BuiltInPacks(current, REPO_PACKS)
    catalog.load_pack = memo  # type: ignore[assignment]
    registry.load_pack = memo  # type: ignore[assignment]
    from httpx._transports import default as transports

    if not hasattr(transports.create_ssl_context, "__wrapped__"):
        transports.create_ssl_context = shared_default_tls(transports.create_ssl_context)
    return memo
