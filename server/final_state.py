"""The final state a verifier saw, kept so an episode can be regraded later against a newer
verifier without rerunning the policy (server/regrade.py, `palaestra eval regrade`).

When an episode is verified, just before its verifier runs, the episode sandbox's workspace
(the tar a verifier would be handed) and the family's episode state are written under
`<data_dir>/final_states/`, content-addressed by sha256, and what was kept is recorded
with the episode (`episodes.final_state`, a `FinalStateRecord`). Bounds:
- the tar streams from the sandbox into a spool file and is filtered into the store a
  member at a time in a thread: never whole in server memory, never on the event loop;
- over `final_state_max_mb` nothing is kept and the record says why (regrade: 409); nor
  is anything once the kept files take `final_state_max_total_mb` together (a tenant
  verifying many distinct workspaces would otherwise fill the disk within the retention);
- members no upload may restore (links pointing out of the workspace, devices, hard
  links) are dropped and counted: a kept state never names anything outside it;
- files unused for `final_state_retention_days` are pruned (at the first keep after
  start, then at most hourly).
Keeping never changes a verdict: any fault is logged and recorded as the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from palaestra.sandbox.base import (
    AgentFault,
    SandboxFileTooLarge,
    SandboxPathError,
    forget_members,
    spool_file,
    tar_members,
    tar_writer,
    upload_member,
)
from palaestra.server.config import Settings
from palaestra.server.store import Store

if TYPE_CHECKING:
    from palaestra.server.episode import Episode

log = logging.getLogger("palaestra.episodes")

FOLDER = "final_states"
PRUNE_EVERY_S = 3600.0
STALE_PARTIAL_S = 3600.0  # a half-written file older than this is a crash's leftover
CHUNK = 1 << 20


class FinalStateRecord(BaseModel):
    """What was kept of one episode's final state (`episodes.final_state`, as JSON)."""

    workspace: str | None = None  # "sha256:…" of the kept tar; None: no sandbox, or not kept
    state: str | None = None  # "sha256:…" of the state document (family, seed, options, state)
    bytes: int = 0  # the kept tar's size
    dropped: int = 0  # tar members not kept (links out of the workspace, devices)
    at: float = 0.0
    why: str | None = None  # why nothing was kept
    skipped_fields: list[str] = Field(default_factory=list)  # state fields not serialisable


def state_json(state: Any) -> tuple[Any, list[str]]:
    """The family's episode state as JSON values, and the names of fields left out because
    they are not data (a live shell session): those start fresh on a regrade."""
    if isinstance(state, BaseModel):
        out: dict[str, Any] = {}
        skipped: list[str] = []
        for name in type(state).model_fields:
            try:
                out[name] = to_jsonable_python(getattr(state, name))
            except Exception:
                skipped.append(name)
        return out, skipped
    try:
        return to_jsonable_python(state), []
    except Exception:
        return None, ["*"]


class FinalStates:
    """The kept final states of this server's episodes, in `<data_dir>/final_states/`."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.store = store
        self.folder = settings.data_dir / FOLDER
        self.spool_dir = settings.spool_folder
        self.max_bytes = settings.final_state_max_mb << 20
        self.max_mb = settings.final_state_max_mb
        self.retention_s = settings.final_state_retention_days * 86400.0
        self.max_total = settings.final_state_max_total_mb << 20
        self.max_total_mb = settings.final_state_max_total_mb
        self._used: int | None = None  # bytes of the kept files (scanned at the first keep)
        self._used_lock = threading.Lock()
        self._pruned_at: float | None = None
        self._pruning: asyncio.Task[int] | None = None

    def path(self, digest: str) -> Path:
        """The file of a kept blob ("sha256:<hex>"); ValueError for anything else."""
        hexdigest = digest.removeprefix("sha256:")
        if len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.folder / hexdigest

    # -- keeping ----------------------------------------------------------------------------
    async def keep(self, episode: Episode) -> None:
        """Keep what `episode`'s verifier is about to see and record it with the episode
        (queued with the verdict's writes). Never raises: a fault is the record's `why`."""
        if self.max_bytes <= 0:
            return
        try:
            record = await self._keep(episode)
        except Exception as exc:
            extra = {"episode_id": episode.id, "task_digest": episode.task.digest}
            log.warning("final state not kept (%s)", type(exc).__name__, extra=extra)
            record = FinalStateRecord(at=time.time(), why=f"not kept ({type(exc).__name__})")
        self.store.put_final_state(episode.id, record.model_dump_json())
        self._prune_when_due()

    async def _keep(self, episode: Episode) -> FinalStateRecord:
        ctx, now = episode.ctx, time.time()
        if await asyncio.to_thread(self.used) >= self.max_total:
            why = (
                f"the server's kept final states are at final_state_max_total_mb "
                f"({self.max_total_mb} MiB); nothing kept"
            )
            return FinalStateRecord(at=now, why=why)
        values, skipped = state_json(ctx.state)
        document = {
            "family": episode.family.name,
            "seed": ctx.seed,
            "options": to_jsonable_python(ctx.options, fallback=str),
            "state": values,
        }
        data = json.dumps(document, sort_keys=True).encode()
        if len(data) > self.max_bytes:
            return FinalStateRecord(at=now, why=self._over("the family's state", len(data)))
        state = await asyncio.to_thread(self._put_bytes, data)
        record = FinalStateRecord(state=state, at=now, skipped_fields=skipped)
        box = ctx.sandboxes.episode
        if box is None:  # a family without a sandbox: its state is all there is
            return record
        if not box.alive:
            return FinalStateRecord(at=now, why="the episode's sandbox was gone; nothing kept")
        with spool_file(self.spool_dir) as raw:
            try:
                await box.download_tar_to(raw, limit=self.max_bytes)
            except SandboxFileTooLarge:
                return FinalStateRecord(at=now, why=self._over("the workspace", None))
            except AgentFault as exc:
                why = f"the workspace could not be read ({exc.failure}); nothing kept"
                return FinalStateRecord(at=now, why=why)
            digest, size, dropped = await asyncio.to_thread(self._put_tar, raw)
        if size > self.max_bytes:
            return FinalStateRecord(at=now, why=self._over("the workspace", size))
        return record.model_copy(update={"workspace": digest, "bytes": size, "dropped": dropped})

    def _over(self, what: str, size: int | None) -> str:
        had = "" if size is None else f" ({size} bytes)"
        return f"{what}{had} is over final_state_max_mb ({self.max_mb} MiB); nothing kept"

    def _partial(self) -> IO[bytes]:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return tempfile.NamedTemporaryFile(dir=self.folder, prefix=".partial-", delete=False)

    def _settle(self, partial: Path) -> str:
        """Move a written file under its digest (or drop it: already kept); refresh its
        last use either way. Runs in a thread."""
        h = hashlib.sha256()
        with open(partial, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        final = self.folder / h.hexdigest()
        if final.exists():
            partial.unlink()
            os.utime(final)
        else:
            size = partial.stat().st_size
            os.replace(partial, final)
            self._count(size)
        return "sha256:" + h.hexdigest()

    def used(self) -> int:
        """Bytes the kept files take (scanned once, then counted). Runs in a thread."""
        with self._used_lock:
            if self._used is None:
                total = 0
                with contextlib.suppress(FileNotFoundError):
                    for entry in os.scandir(self.folder):
                        with contextlib.suppress(OSError):
                            total += entry.stat(follow_symlinks=False).st_size
                self._used = total
            return self._used

    def _count(self, delta: int) -> None:
        with self._used_lock:
            if self._used is not None:
                self._used = max(0, self._used + delta)

    def _put_bytes(self, data: bytes) -> str:
        with self._partial() as f:
            f.write(data)
        return self._settle(Path(f.name))

    def _put_tar(self, raw: BinaryIO) -> tuple[str, int, int]:
        """Copy the downloaded tar a member at a time, without what no upload restores;
        (digest, size, members dropped). Runs in a thread."""
        raw.seek(0)
        dropped = 0
        with self._partial() as f:
            try:
                with tarfile.open(fileobj=raw, mode="r:") as src, tar_writer(f) as out:
                    for member in tar_members(src):
                        try:
                            upload_member(member)
                        except SandboxPathError:
                            dropped += 1
                            continue
                        body = src.extractfile(member) if member.isreg() else None
                        out.addfile(member, body)
                        forget_members(out)
                size = f.tell()
            except BaseException:
                Path(f.name).unlink(missing_ok=True)
                raise
        return self._settle(Path(f.name)), size, dropped

    # -- reading ----------------------------------------------------------------------------
    def document(self, digest: str) -> dict[str, Any] | None:
        """A kept state document (None: pruned). Runs in a thread."""
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            return None
        loaded: dict[str, Any] = json.loads(data)
        return loaded

    # -- retention --------------------------------------------------------------------------
    def _prune_when_due(self) -> None:
        now = time.monotonic()
        if self._pruning is not None and not self._pruning.done():
            return
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        self._pruning = asyncio.create_task(asyncio.to_thread(self.prune))

    def prune(self, now: float | None = None) -> int:
        """Delete kept files unused for the retention period (and crash leftovers); how many.
        Blocking: call it in a thread."""
        now = time.time() if now is None else now
        removed = 0
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return 0
        for entry in entries:
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                partial = entry.name.startswith(".partial-")
                if now - st.st_mtime > (STALE_PARTIAL_S if partial else self.retention_s):
                    os.unlink(entry.path)
                    removed += 1
                    if not partial:
                        self._count(-st.st_size)
        if removed:
            log.info("pruned %d kept final-state files", removed)
        return removed

    async def aclose(self) -> None:
        if self._pruning is not None:
            with contextlib.suppress(Exception):
                await self._pruning
