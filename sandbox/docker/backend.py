"""`DockerBackend`: creates `DockerSandbox`es on the local engine, and reaps at its first
create what killed servers left (containers and volumes whose owner process is gone)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from palaestra.sandbox.base import (
    Backend,
    SandboxCreateError,
    SandboxError,
    SandboxSpec,
    SocketService,
    check_gateway,
    close_all,
    default_cache,
)
from palaestra.sandbox.docker.engine import (
    BASE_IMAGE,
    check_spec,
    docker_available,
    image_ref,
    import_docker,
    reap_stale,
)
from palaestra.sandbox.docker.sandbox import DockerSandbox
from palaestra.sandbox.egress import EgressProxy, check_network


class DockerBackend(Backend):
    """Creates `DockerSandbox`es on the local engine; `cache` holds the execute-only copies
    of the images' bash (``<cache>/docker-shell``); `egress` is the server's proxy, the only
    way out of a sandbox whose spec has `network`, and `gateway` serves the one listener of a
    sandbox whose spec has `gateway` (harness mode); both need the engine on this host."""

    name = "docker"

    def __init__(
        self,
        *,
        default_image: str = BASE_IMAGE,
        client: Any = None,
        cache: Path | None = None,
        egress: EgressProxy | None = None,
        gateway: SocketService | None = None,
    ) -> None:
        self.default_image = default_image
        self.egress = egress  # what a sandbox with spec.network reaches (and nothing else)
        self.gateway = gateway  # what a sandbox with spec.gateway reaches (and nothing else)
        self.cache = cache if cache is not None else default_cache()
        self._client = client
        self._started = False
        self._start_lock = asyncio.Lock()
        self._live: set[DockerSandbox] = set()

    @staticmethod
    def available() -> tuple[bool, str]:
        return docker_available()

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = import_docker().from_env(timeout=60)
            except Exception as e:
                raise SandboxCreateError(f"docker engine unavailable: {e}") from e
        return self._client

    async def _start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            try:
                await asyncio.to_thread(self.client.ping)
            except SandboxError:
                raise
            except Exception as e:
                raise SandboxCreateError(f"docker engine unavailable: {e}") from e
            await asyncio.to_thread(reap_stale, self.client)
            self._started = True

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        check_spec(spec)
        check_network(spec, self.egress, self.name)
        check_gateway(spec, self.gateway, self.name)
        await self._start()
        box = DockerSandbox(
            spec,
            self.client,
            image_ref(spec.image, self.default_image),
            self._live.discard,
            cache=self.cache,
            egress=self.egress,
            gateway=self.gateway,
        )
        making = asyncio.ensure_future(asyncio.to_thread(box.create_sync))
        try:
            await asyncio.shield(making)
            await box.attach_listener()
        except BaseException:
            # Cancelled (a stop) while the thread still creates the container: it would
            # appear after this close and outlive the command. Let it finish, then remove it.
            await asyncio.shield(self._discard(box, making))
            raise
        self._live.add(box)
        return box

    @staticmethod
    async def _discard(box: DockerSandbox, making: asyncio.Future[None]) -> None:
        with contextlib.suppress(BaseException):
            await making
        await box.close()

    async def aclose(self) -> None:
        await close_all(self._live)
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None
            self._started = False
