"""The process that warms packs: it generates what a server start found uncached.

server/packs/warming.py runs it as `python -m palaestra.server.packs.warmjob CACHE LOG
ROOT...` with the server's held-out secret (hex) on stdin, so sealed splits draw the seeds
the server will. Generators and the libraries they call print dots, warnings and errors
(reasoning-gym's `Failed to generate a capture problem`, HiGHS' `log_file_0.txt` I/O error)
to stdout and stderr, from Python and from C: before any generator runs, this process points
its fds 1 and 2 at LOG, so none of it reaches the server's console. Its progress goes to the
server as JSON lines on the pipe that was its stdout. It runs niced, below the server.

It only fills the caches (server/packs/gencache.py, a source's own); the server then loads
each pack from them and checks it as at any start, so what this process found wrong is
never trusted, only regenerated.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from palaestra.server.packs.gencache import GeneratedTaskCache
from palaestra.server.packs.loader import inspect_pack

NICE = 10  # below the server's episodes: warming takes what CPU they leave
REPORT_EVERY_S = 0.5  # progress lines at most this often (and at the end of each unit)


class Reporter:
    """Progress as JSON lines to the server, a pack at a time: {"pack", "started"}, then
    {"pack", "done", "total", "unit"}, then {"pack", "finished", "tasks", "seconds",
    "noise"} or {"pack", "error"}."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.last = 0.0

    def send(self, **message: Any) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def progress(self, pack: str, done: int, total: int, unit: str) -> None:
        now = time.monotonic()
        if done < total and now - self.last < REPORT_EVERY_S:
            return
        self.last = now
        self.send(pack=pack, done=done, total=total, unit=unit)


def capture_output(log_path: Path) -> IO[str]:
    """Point fds 1 and 2 at `log_path` (appended, 0600); the returned stream is the
    original stdout, for progress."""
    report = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    return report


def lines_since(log_path: Path, offset: int) -> int:
    """Lines written to the log after byte `offset` (what one pack's generation printed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: log.read(1 << 16), b""))
    except OSError:
        return 0


def warm(roots: dict[str, Path], cache: GeneratedTaskCache, secret: bytes | None, log: Path,
         reporter: Reporter) -> None:  # fmt: skip
    """Generate each pack (`roots`: as the server named it -> its resolved folder)."""
    for given, root in roots.items():

        def progress(done: int, total: int, unit: str, given: str = given) -> None:
            reporter.progress(given, done, total, unit)

        started = time.monotonic()
        offset = log.stat().st_size if log.exists() else 0
        print(f"== warming {root}", flush=True)
        reporter.send(pack=given, started=True)
        try:
            pack, _ = inspect_pack(
                root,
                secret=secret,
                cache=cache,
                progress=progress,
            )
        except Exception as exc:  # the server loads it itself and reports the problem
            logging.exception("warming %s failed", root)
            reporter.send(pack=given, error=f"{type(exc).__name__}: {exc}")
            continue
        reporter.send(
            pack=given,
            finished=True,
            tasks=len(pack.tasks) if pack is not None else 0,
            seconds=round(time.monotonic() - started, 1),
            noise=max(0, lines_since(log, offset) - 1),  # less the "== warming" line
        )


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m palaestra.server.packs.warmjob CACHE LOG ROOT...", file=sys.stderr)
        return 2
    cache, log = GeneratedTaskCache(Path(argv[0]).resolve()), Path(argv[1]).resolve()
    roots = {given: Path(given).resolve() for given in argv[2:]}
    secret_hex = sys.stdin.readline().strip()
    secret = bytes.fromhex(secret_hex) if secret_hex else None
    reporter = Reporter(capture_output(log))
    with contextlib.suppress(OSError):
        os.nice(NICE)
    # Some datasets write files to the working directory (reasoning-gym's predator-prey
    # `simulation_data.txt`): a scratch folder keeps them out of the server's.
    with tempfile.TemporaryDirectory(prefix="palaestra-warm-") as scratch:
        os.chdir(scratch)
        warm(roots, cache, secret, log, reporter)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
