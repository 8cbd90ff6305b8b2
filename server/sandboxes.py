"""Who owns the sandboxes: every one an episode uses is made here and freed here.

A family asks through its episode's `Sandboxes` (envs/base.py); this makes that object, so
each sandbox is checked against the operator's ceilings and created on the server's
backend, the episode's own is started before `reset`, and all of them are freed when the
episode ends, whatever the family did.
"""

from __future__ import annotations

import logging
from pathlib import Path

from palaestra.envs.base import Family, Sandboxes
from palaestra.sandbox import Backend, Sandbox, SandboxError, SandboxSpec
from palaestra.sandbox.forkserver import PythonForkServer
from palaestra.sandbox.pool import WarmPool
from palaestra.sdk.errors import UnavailableError
from palaestra.sdk.task import Task
from palaestra.server.ceilings import check_spec
from palaestra.server.config import Settings

log = logging.getLogger("palaestra.episodes")


class SandboxOwner:
    def __init__(
        self,
        settings: Settings,
        backend: Backend | None,
        fork_server: PythonForkServer | None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.fork_server = fork_server
        # Per family, whether the backend has the family's image (see `Sandboxes`).
        self._images: dict[str, dict[str, bool]] = {}

    @property
    def spool_dir(self) -> Path:
        """Where workspaces moved between sandboxes wait on disk (`spool_dir` setting)."""
        return self.settings.spool_folder

    @property
    def live_count(self) -> int:
        return self.backend.live_count if self.backend is not None else 0

    async def create(self, spec: SandboxSpec, where: str = "a sandbox") -> Sandbox:
        check_spec(spec, self.settings, where)  # what a family built, within the ceilings
        if self.backend is None:
            raise SandboxError("this server has no sandbox backend")
        return await self.backend.create(spec)

    async def create_cold(self, spec: SandboxSpec, where: str) -> Sandbox:
        """A sandbox for a one-off run outside episodes (a generator pack's publish), made on
        the backend behind the warm pool, so no pool starts keeping sandboxes of its spec."""
        check_spec(spec, self.settings, where)
        backend = self.backend.inner if isinstance(self.backend, WarmPool) else self.backend
        if backend is None:
            raise SandboxError("this server has no sandbox backend")
        return await backend.create(spec)

    def for_episode(self, family: Family, task: Task) -> Sandboxes:
        """An episode's sandbox object; `start` it before `reset`, `free` it at the end."""

        async def create(spec: SandboxSpec) -> Sandbox:
            return await self.create(spec, f"task {task.ref}")

        return Sandboxes(
            create,
            image=family.image,
            images=self._images.setdefault(family.name, {}),
            fork_server=self.fork_server.run if self.fork_server is not None else None,
            spool_dir=self.spool_dir,
        )

    async def start(self, sandboxes: Sandboxes, spec: SandboxSpec | None) -> None:
        """The episode's own sandbox; 503 when none can be made."""
        try:
            await sandboxes.start(spec)
        except SandboxError as exc:
            raise UnavailableError(
                f"no sandbox could be created: {exc}", code="sandbox_failed"
            ) from None

    async def fork(self, parent: Sandboxes, family: Family, task: Task) -> Sandboxes:
        """A forked episode's sandboxes: its own a copy of `parent`'s (`Backend.fork`, the
        same spec, within the ceilings it was made within); the parent's go on unchanged.
        Its verifier sandboxes are made fresh when it asks."""
        child = self.for_episode(family, task)
        box = parent.episode
        if box is None:
            return child
        if self.backend is None:
            raise SandboxError("this server has no sandbox backend")
        child.adopt(await self.backend.fork(box, self.spool_dir))
        return child

    async def free(self, sandboxes: Sandboxes) -> None:
        for exc in await sandboxes.aclose():
            log.error("closing a sandbox failed", exc_info=exc)

    async def aclose(self) -> None:
        if self.fork_server is not None:
            await self.fork_server.aclose()
        if self.backend is not None:
            await self.backend.aclose()
