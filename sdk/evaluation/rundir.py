"""The run directory: `manifest.json` and `attempts.jsonl`, appended and fsynced line by
line, so a run survives a crash; `pending` says what a resume still has to run."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.models import TaskInfo

RUN_FORMAT = "palaestra-run/1"
MANIFEST = "manifest.json"
ATTEMPTS = "attempts.jsonl"


class RunError(Exception):
    """A run directory that cannot be used as asked; the message says why."""


class RunDir:
    """`manifest.json` + `attempts.jsonl` (append-only, fsynced line by line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def attempts_path(self) -> Path:
        return self.path / ATTEMPTS

    @classmethod
    def create(cls, path: Path, manifest: dict[str, Any]) -> RunDir:
        if (path / MANIFEST).exists():
            raise RunError(
                f"{path} already holds a run; continue it with `palaestra eval resume {path}` "
                "or choose another --run-dir"
            )
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run.write_manifest({"format": RUN_FORMAT, **manifest})
        run.attempts_path.touch()
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        if not (path / MANIFEST).is_file():
            raise RunError(f"{path} is not a run directory (no {MANIFEST})")
        run = cls(path)
        fmt = run.manifest().get("format")
        if fmt != RUN_FORMAT:
            raise RunError(
                f"{path}: unknown run format {fmt!r} (this palaestra reads {RUN_FORMAT})"
            )
        return run

    def manifest(self) -> dict[str, Any]:
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RunError(f"{self.manifest_path} is unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise RunError(f"{self.manifest_path} is not a JSON object")
        return data

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Atomically: a crash leaves the old manifest or the new one, never half of one."""
        tmp = self.manifest_path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.manifest_path)
        _fsync_dir(self.path)

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        manifest = self.manifest()
        manifest.update(changes)
        self.write_manifest(manifest)
        return manifest

    def repair(self) -> int:
        """Cut a torn last line (a crash mid-write); returns the bytes cut."""
        if not self.attempts_path.exists():
            self.attempts_path.touch()
            return 0
        data = self.attempts_path.read_bytes()
        if not data or data.endswith(b"\n"):
            return 0
        keep = data.rfind(b"\n") + 1
        with open(self.attempts_path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        return len(data) - keep

    def append(self, attempt: Attempt) -> None:
        """One line, written and fsynced before it returns."""
        line = (json.dumps(attempt.to_json(), separators=(",", ":")) + "\n").encode()
        with self._lock, open(self.attempts_path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[Attempt]:
        """Every stored line, in order (a torn or unreadable line is skipped)."""
        out: list[Attempt] = []
        if not self.attempts_path.exists():
            return out
        for raw in self.attempts_path.read_text().splitlines():
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                out.append(Attempt.from_json(data))
        return out

    def latest(self) -> dict[tuple[str, int], Attempt]:
        """The last line per (task, attempt): what the report counts."""
        return {a.key: a for a in self.records()}


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def pending(
    tasks: Iterable[TaskInfo],
    k: int,
    done: dict[tuple[str, int], Attempt],
    *,
    retry_void: bool,
    retry_errors: bool = False,
) -> list[tuple[TaskInfo, int]]:
    """The (task, attempt) pairs still to run, in a fixed order."""
    rerun = {"void"} if retry_void else set()
    if retry_errors:
        rerun.add("error")
    todo = []
    for task in tasks:
        for i in range(k):
            prior = done.get((task.id, i))
            if prior is None or prior.status in rerun:
                todo.append((task, i))
    return todo
