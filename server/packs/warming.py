"""Warming packs in the background: a server answers at once and serves what is ready.

A server start loads every pack whose tasks are cached (`cached_only`,
server/packs/loader.py). A pack whose generated tasks are not cached yet (a fresh data dir:
sealed splits are drawn with that server's own secret; new code: new cache keys) is
*warming*: a process of its own (server/packs/warmjob.py) generates it, niced, while the
server serves the other packs; its progress goes to the log and to `/readyz`, and the server
loads it from the cache when it is done. Until then a reset naming it is a 503 `warming`
with Retry-After, and the sampler draws from the packs that are ready. What the generators'
libraries print goes to `<data dir>/logs/warm.log`, summed up in one log line a pack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from palaestra.sdk.errors import UnavailableError

if TYPE_CHECKING:
    from palaestra.server.packs.catalog import PackCatalog

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0  # a progress line in the server's log at most this often a pack
STOP_GRACE_S = 5.0  # after SIGTERM, before SIGKILL
JOB = "palaestra.server.packs.warmjob"
WARM_LOG = "warm.log"  # under <data dir>/logs/: what generators and their libraries print


@dataclass
class Warming:
    """One pack being generated: how far it is (in the generator's unit)."""

    name: str
    root: Path
    done: int = 0
    total: int = 0
    unit: str = "tasks"
    since: float = field(default_factory=time.monotonic)  # start of the current unit

    started: bool = False  # the job is at this pack (it does one at a time)

    def shown(self) -> str:
        if self.total:
            return f"{self.done}/{self.total} {self.unit}"
        return "starting" if self.started else "queued"

    def start(self) -> None:
        self.started, self.since = True, time.monotonic()

    def update(self, done: int, total: int, unit: str) -> None:
        if unit != self.unit:  # a new phase (reasoning-gym: train, then held-out)
            self.since = time.monotonic()
        self.done, self.total, self.unit = done, total, unit

    def eta_s(self) -> float:
        """How long a caller should wait before asking again: what is left of this phase at
        its rate so far (1-60 s; 5 s before there is a rate)."""
        if self.done <= 0 or self.total <= 0:
            return 5.0
        rate = self.done / max(time.monotonic() - self.since, 1e-3)
        return min(60.0, max(1.0, (self.total - self.done) / rate))


def warming_error(what: str, warming: list[Warming]) -> UnavailableError:
    """The 503 for a request only warming packs can serve (retryable, with Retry-After)."""
    shown = ", ".join(f"{w.name} is being generated ({w.shown()})" for w in warming)
    eta = round(min(w.eta_s() for w in warming))
    return UnavailableError(
        f"{what}: {shown}; retry in about {eta} s (GET /readyz shows progress)",
        code="warming",
        retryable=True,
        retry_after=eta,
    )


class PackWarmer:
    """Runs the warm job for the catalog's warming packs and loads each as it is done."""

    def __init__(self, catalog: PackCatalog, cache: Path, log_path: Path) -> None:
        self.catalog = catalog
        self.cache = cache  # the generated-task cache folder (GeneratedTaskCache)
        self.log_path = log_path
        self.roots = [w.root for w in catalog.warming.values()]
        self._names = {str(w.root): w.name for w in catalog.warming.values()}
        self._logged: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._closing = False

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            JOB,
            str(self.cache),
            str(self.log_path),
            *map(str, self.roots),
        ]

    def _secret_line(self) -> bytes:
        secret = self.catalog.secret
        return (secret.hex() if secret else "").encode() + b"\n"

    def _started(self) -> None:
        names = ", ".join(self._names.values())
        log.info(
            "warming %s in the background (generated tasks not cached yet); the other packs "
            "are served now, /readyz shows progress, library output goes to %s",
            names,
            self.log_path,
        )

    # -- in the server's event loop ------------------------------------------------------
    def start(self) -> None:
        """Start warming (inside the event loop); a no-op with nothing to warm."""
        if self._task is None and self.roots:
            self._started()
            self._task = asyncio.create_task(self._run(), name="palaestra-warm")

    async def wait(self) -> None:
        """Until every warming pack is loaded (or failed to)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            await self._job()
        except Exception:  # no job (cannot start a process): generate here, in a thread
            log.exception("the warm job failed; generating what is left in the server")
        if self._closing:
            return
        for root in [w.root for w in self.catalog.warming.values()]:
            await self._load(root)  # the job died before it: generate it here (a thread)

    async def _job(self) -> None:
        self._proc = proc = await asyncio.create_subprocess_exec(
            *self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(self._secret_line())
        await proc.stdin.drain()
        proc.stdin.close()
        async for line in proc.stdout:
            root = self._note(line)
            if root is not None:
                await self._load(root)
        await proc.wait()

    async def _load(self, root: Path) -> None:
        result = await asyncio.to_thread(self.catalog.read, root)
        self.catalog.take(root, result)

    async def aclose(self) -> None:
        """Stop the loading, then the job (SIGTERM, then SIGKILL); what is cached stays.
        The loading first: a job that ends early would otherwise be made up for by
        generating in the server, which a shutdown must never wait for."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    # -- before the server answers (background warming off) ------------------------------
    def run_blocking(self) -> None:
        """Warm every pack before returning (the `background_warm = false` start)."""
        if not self.roots:
            return
        self._started()
        with subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as proc:
            stdin, stdout = proc.stdin, proc.stdout
            assert stdin is not None and stdout is not None
            stdin.write(self._secret_line())
            stdin.close()
            for line in stdout:
                root = self._note(line)
                if root is not None:
                    self.catalog.take(root, self.catalog.read(root))
        for root in [w.root for w in self.catalog.warming.values()]:
            self.catalog.take(root, self.catalog.read(root))

    # -- the job's reports ---------------------------------------------------------------
    def _note(self, line: bytes) -> Path | None:
        """Follow one report of the job; the pack folder it finished (to load), or None."""
        try:
            message: dict[str, Any] = json.loads(line)
            root = str(message["pack"])
        except (ValueError, KeyError, TypeError):
            return None
        name = self._names.get(root, root)
        warming = self.catalog.warming.get(name)
        if "error" in message:
            log.warning("warming %s failed (%s); loading it in the server", name, message["error"])
            return Path(root)
        if message.get("finished"):
            noise = int(message.get("noise", 0))
            kept = (
                f"; {noise} lines of generator and library output (warnings, errors) kept in "
                f"{self.log_path}"
                if noise
                else ""
            )
            log.info(
                "warmed %s: %d tasks generated in %.0f s%s",
                name,
                int(message.get("tasks", 0)),
                float(message.get("seconds", 0.0)),
                kept,
            )
            return Path(root)
        if warming is not None and message.get("started"):
            warming.start()
        if warming is not None and "done" in message:
            warming.update(int(message["done"]), int(message["total"]), str(message["unit"]))
            now = time.monotonic()
            if now - self._logged.get(name, 0.0) >= LOG_EVERY_S:
                self._logged[name] = now
                log.info("warming %s: %s", name, warming.shown())
        return None
