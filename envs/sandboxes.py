"""How a family gets sandboxes: `ctx.sandboxes` (re-exported by `palaestra.envs.base`)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from palaestra.sandbox import ExecResult, Sandbox, SandboxSpec, SandboxSpecError
from palaestra.sandbox.base import spool_file
from palaestra.sandbox.forkrun import PYTHON, ForkServerUnavailable, PythonRun, PythonRunner

SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]


class Sandboxes:
    """The one way a family gets sandboxes: the episode's own, verifier sandboxes and one-shot
    Python runs. It records every sandbox it creates and the manager frees them all when the
    episode ends (done, void, closed, expired); a family never creates or frees one itself.

    Image choice: a spec with `image=None` runs on the family's `image` where the backend has
    it and on the backend's default where it refuses that image as unknown (bwrap without the
    family's rootfs); `images` remembers the answer across episodes. A spec naming an image
    gets exactly that image."""

    def __init__(
        self,
        create: SandboxFactory,
        *,
        image: str | None = None,
        images: dict[str, bool] | None = None,
        fork_server: PythonRunner | None = None,
        spool_dir: Path | None = None,
    ) -> None:
        self._create = create
        # Where a workspace moved between sandboxes waits: the server's own tmp dir (the
        # `spool_dir` setting); the system's when none is given (tests, tools).
        self.spool_dir = spool_dir if spool_dir is not None else Path(tempfile.gettempdir())
        self._image = image
        self._images = images if images is not None else {}
        self._fork_server = fork_server
        self._episode: Sandbox | None = None
        self._spec: SandboxSpec | None = None
        self._made: list[Sandbox] = []

    @property
    def episode(self) -> Sandbox | None:
        """The episode's own sandbox (from `Family.sandbox_spec`); None when the family asks
        for none, and once the episode has ended."""
        return self._episode

    async def start(self, spec: SandboxSpec | None) -> None:
        """The manager's: create the episode's sandbox before `Family.reset`."""
        if spec is not None:
            self._episode = await self._new(spec)
            self._spec = self._episode.spec

    def adopt(self, box: Sandbox) -> None:
        """The manager's: the episode's sandbox made for it elsewhere (a fork's copy of its
        parent's, `Backend.fork`), freed with the rest."""
        self._episode, self._spec = box, box.spec
        self._made.append(box)

    async def verifier(
        self, spec: SandboxSpec | None = None, *, traces_execs: bool = False
    ) -> Sandbox:
        """A fresh sandbox for the verifier (default: the episode sandbox's spec, image
        included); it lives until the episode ends. `traces_execs`: its processes may trace
        their children (`SandboxSpec.traces_execs`, the terminal verifier's exec guard)."""
        if spec is None:
            if self._spec is None:
                raise ValueError("this episode has no sandbox whose spec a verifier could copy")
            spec = self._spec
        if traces_execs:
            spec = dataclasses.replace(spec, traces_execs=True)
        return await self._new(spec)

    def spool(self) -> BinaryIO:
        """An anonymous file in the server's tmp dir for a workspace on its way from one
        sandbox to another (`Sandbox.download_tar_to`, `upload_tar_from`): it waits on disk,
        never whole in server memory; close it (`with`) and it is gone."""
        return spool_file(self.spool_dir)

    async def copy_workspace(
        self, src: Sandbox, dst: Sandbox, path: str | None = None, dest: str | None = None
    ) -> None:
        """Copy `path` of `src` (default its workdir) into `dest` of `dst` through a `spool`
        file. A copy over the limit is the agent's (SandboxFileTooLarge: reward 0)."""
        with self.spool() as f:
            await src.download_tar_to(f, path)
            await dst.upload_tar_from(f, dest)

    async def run_python(self, job: PythonRun) -> ExecResult:
        """Run `job` (`python3 -I -S -c code`) in a one-shot sandbox whose /work holds its
        files alone: a fork of the server's Python fork server where it has one, else a fresh
        sandbox, freed as soon as the run is over. Timeouts and exit codes are data."""
        if self._fork_server is not None:
            try:
                return await self._fork_server(job)
            except ForkServerUnavailable:
                pass  # logged once by the fork server; a fresh sandbox does it
        box = await self._new(SandboxSpec(memory_mb=job.memory_mb, workspace_mb=job.workspace_mb))
        try:
            for path, data in job.files.items():
                await box.write_file(path, data)
            return await box.exec(
                [PYTHON, "-I", "-S", "-c", job.code],
                stdin=job.stdin,
                timeout=job.timeout,
                max_output=job.max_output,
            )
        finally:
            if box in self._made:  # else the episode ended meanwhile: aclose() has it
                self._made.remove(box)
            await box.close()

    async def retire_episode(self) -> None:
        """Free the episode's sandbox now, before the episode ends (a verifier that wants
        every process the agent started dead before its tests run); its spec stays what
        `verifier()` copies."""
        box, self._episode = self._episode, None
        if box is not None:
            self._made.remove(box)
            await box.close()

    def episode_cpu_seconds(self) -> float | None:
        """The manager's: CPU time the episode's sandbox used so far (None: no counter)."""
        return self._episode.cpu_seconds() if self._episode is not None else None

    async def aclose(self) -> list[BaseException]:
        """The manager's: free every sandbox this episode has; returns what failed."""
        made, self._made, self._episode = self._made, [], None
        failed: list[BaseException] = []
        for box in made:
            try:
                await box.close()
            except Exception as exc:
                failed.append(exc)
        return failed

    async def _new(self, spec: SandboxSpec) -> Sandbox:
        box = await self._on_image(spec)
        self._made.append(box)
        return box

    async def _on_image(self, spec: SandboxSpec) -> Sandbox:
        image = self._image
        if spec.image is not None or image is None or self._images.get(image) is False:
            return await self._create(spec)
        try:
            box = await self._create(dataclasses.replace(spec, image=image))
        except SandboxSpecError:
            box = await self._create(spec)  # raises where the spec itself is at fault
            self._images[image] = False
            return box
        self._images[image] = True
        return box
