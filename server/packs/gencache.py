"""Generated tasks kept on disk, so a server start does not rerun every generator.

A generator split's tasks are a pure function of the pack's files, the code they import
(palaestra's own packages), the split's seeds and levels. The cache keys one split's results
by a digest of all of these, so a change to any of them is a miss; a miss (or an unreadable
entry) only costs the generation. Entries hold private fields (and sealed tasks drawn with
the server's secret), so files are 0600 under the server's cache folder, which no sandbox
sees (tests/adversarial/test_server_files.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The packages a generator may import; their sources are part of every key. They are read
# as files, never imported here: the pack machinery sits below the families (pyproject's
# import-linter contract "packs").
CODE_PACKAGES = ("palaestra.envs", "palaestra.sdk", "palaestra.verifiers")


@functools.cache
def code_digest() -> str:
    """A digest of palaestra's source files that generators import."""
    h = hashlib.sha256()
    for package in CODE_PACKAGES:
        spec = importlib.util.find_spec(package)  # imports `palaestra` only, not the package
        assert spec is not None and spec.origin is not None, package
        base = Path(spec.origin).parent
        for path in sorted(base.rglob("*.py")):
            h.update(str(path.relative_to(base)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


class NotCached(Exception):
    """Raised by a load with `cached_only` (server/packs/loader.py) where a generator split's
    or a source's tasks are not cached yet: the pack is warmed in the background
    (server/packs/warming.py). A pack source (`load_tasks(cached_only=True)`) raises it too."""


class GeneratedTaskCache:
    """One file per generator split: `<folder>/<key>.json`, the list of task dicts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @staticmethod
    def key(
        pack_files: dict[str, str],
        generator: str,
        split: str,
        seeds: Sequence[int],
        levels: Sequence[int],
    ) -> str:
        """The digest of everything one split's generated tasks depend on."""
        h = hashlib.sha256(code_digest().encode())
        h.update(json.dumps([sorted(pack_files.items()), generator, split]).encode())
        h.update(json.dumps([list(seeds), list(levels)]).encode())
        return h.hexdigest()

    def get(self, key: str, count: int) -> list[dict[str, Any]] | None:
        """The cached tasks, or None on a miss or an entry that is not `count` task dicts."""
        try:
            found = json.loads((self.folder / f"{key}.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(found, list) or len(found) != count:
            return None
        if not all(isinstance(task, dict) for task in found):
            return None
        return found

    def put(self, key: str, tasks: Sequence[str | None]) -> None:
        """Store one split's tasks (each as `as_json` gave it) atomically; a failed call, a
        task that is not JSON or a full disk stores nothing."""
        if any(task is None for task in tasks):
            return
        tmp = self.folder / f"{key}.{os.getpid()}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write("[" + ",".join(t for t in tasks if t is not None) + "]")
            os.replace(tmp, self.folder / f"{key}.json")
        except OSError:
            tmp.unlink(missing_ok=True)


def as_json(task: Any) -> str | None:
    """A generator's task dict as JSON text; None for anything else (never cached)."""
    if not isinstance(task, dict):
        return None
    try:
        return json.dumps(task)
    except (TypeError, ValueError):
        return None
