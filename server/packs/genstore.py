"""Generated tasks of installed packs, content-addressed beside the pack store.

A publish token's generator pack is generated once, in sandboxes, at publish
(server/packs/generate.py); its tasks are kept under
``<data_dir>/packs/generated/<pack hex>/``: one file per generator split, named by the
sha256 of its canonical JSON, and ``index.json`` mapping ``generator/split`` to that digest.
The registry's row keeps the index's own digest, so a missing, changed or truncated file is
found at load, before any task is served. The files hold private fields and sealed tasks
drawn with the server's secret: 0600 in a 0700 folder that no sandbox sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from palaestra.server.packs.loader import GeneratedSet
from palaestra.server.packs.manifest import PackError

INDEX = "index.json"


def canonical(value: Any) -> bytes:
    """The canonical JSON of `value`: sorted keys, no spaces, UTF-8."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class GeneratedStore:
    """`<packs>/generated/<pack hex>/`: each split's tasks and the index of them."""

    def __init__(self, packs_root: Path) -> None:
        self.root = packs_root / "generated"
        self.tmp = packs_root / "tmp"

    def folder(self, pack_digest: str) -> Path:
        return self.root / pack_digest.removeprefix("sha256:")

    def place(self, pack_digest: str, generated: GeneratedSet) -> str:
        """Write every split's tasks and the index (a folder made whole, then renamed into
        place); returns the index's digest, which the registry's row keeps."""
        objects = {
            f"{gen}/{split}": canonical(tasks)
            for gen, splits in sorted(generated.items())
            for split, tasks in sorted(splits.items())
        }
        index = canonical({"splits": {key: digest_of(data) for key, data in objects.items()}})
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.tmp.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="generated-", dir=self.tmp))  # 0700
        try:
            for data in [*objects.values(), index]:
                name = INDEX if data is index else f"{digest_of(data).removeprefix('sha256:')}.json"
                fd = os.open(work / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            final = self.folder(pack_digest)
            if final.exists():  # left by an install that stopped before its row: redo it
                shutil.rmtree(final)
            os.rename(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return digest_of(index)

    def load(self, pack_digest: str, index_digest: str) -> GeneratedSet:
        """The stored tasks, each file checked against its digest; PackError (what is wrong,
        how to fix it) when a file is missing or not what was stored."""
        folder = self.folder(pack_digest)
        fix = "republish the pack (a new version) or restore the data dir's packs/generated/"
        index = self._read(folder / INDEX, index_digest, fix)
        out: GeneratedSet = {}
        for key, digest in index.get("splits", {}).items():
            gen, _, split = key.partition("/")
            path = folder / f"{str(digest).removeprefix('sha256:')}.json"
            tasks = self._read(path, str(digest), fix)
            if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
                raise PackError(f"{path}: stored generated tasks are not a list of tasks; {fix}")
            out.setdefault(gen, {})[split] = tasks
        return out

    @staticmethod
    def _read(path: Path, digest: str, fix: str) -> Any:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PackError(f"{path}: stored generated tasks unreadable ({exc}); {fix}") from None
        if digest_of(data) != digest:
            raise PackError(f"{path}: stored generated tasks changed (not {digest}); {fix}")
        try:
            return json.loads(data)
        except ValueError:
            raise PackError(f"{path}: stored generated tasks are not JSON; {fix}") from None
