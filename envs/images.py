"""A family's own sandbox image, where the backend has it.

Docker runs a family's image (`images/<name>/Dockerfile`, e.g. `palaestra/cad:latest`); the
bwrap backend has an image only where its rootfs was built, and otherwise runs on the host's
read-only /usr, where the family's tools are installed beside the server. A family that
wants its image everywhere it exists, and the backend's default where it does not, asks
through `PreferredImage`: the first create learns which it is, later ones ask directly.
"""

from __future__ import annotations

from collections.abc import Callable

from palaestra.envs.base import EpisodeContext
from palaestra.sandbox import Sandbox, SandboxSpec, SandboxSpecError


class PreferredImage:
    def __init__(self, image: str) -> None:
        self.image = image
        self._available: bool | None = None  # None: not asked yet

    async def create(
        self, ctx: EpisodeContext, spec: Callable[[str | None], SandboxSpec]
    ) -> Sandbox:
        """A sandbox on `spec(image)`, or on `spec(None)` (the backend's default) where the
        backend refuses the image as unknown (SandboxSpecError)."""
        if self._available is False:
            return await ctx.new_sandbox(spec(None))
        try:
            box = await ctx.new_sandbox(spec(self.image))
        except SandboxSpecError:
            box = await ctx.new_sandbox(spec(None))  # raises where the spec itself is at fault
            self._available = False
            return box
        self._available = True
        return box
