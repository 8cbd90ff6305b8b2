"""A stopped command leaves no docker container: a create cancelled while its worker thread
is still creating the container removes it, and the sweep of a stop finds and removes every
container the process made (by its owner labels) and nothing of another process."""

from __future__ import annotations

import asyncio

import pytest

from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.docker import BASE_IMAGE, DockerBackend
from palaestra.sandbox.docker.engine import owned_by_us
from palaestra.sandbox.sweep import containers, remove_containers
from tests.conftest import docker_skip_reason

WHY = docker_skip_reason(BASE_IMAGE)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]  # docker: the slow tier

SPEC = SandboxSpec(memory_mb=128, pids=64, workspace_mb=16, default_timeout_s=10.0)


async def test_a_create_cancelled_midway_leaves_no_container() -> None:
    backend = DockerBackend()
    try:
        kept = await backend.create(SPEC)  # the engine reached, stale containers reaped
        for delay in (0.0, 0.02, 0.05, 0.1):  # wherever the cancel lands in the create
            making = asyncio.ensure_future(backend.create(SPEC))
            await asyncio.sleep(delay)
            making.cancel()
            try:
                early = await making
            except asyncio.CancelledError:
                continue
            await early.close()  # it was made before the cancel landed
        made, volumes = await asyncio.to_thread(owned_by_us, backend.client)
        assert [c.id for c in made] == [kept.container_id]
        assert len(volumes) == 1
    finally:
        await backend.aclose()


async def test_the_sweep_removes_what_this_process_made() -> None:
    backend = DockerBackend()
    try:
        boxes = [await backend.create(SPEC) for _ in range(2)]
        ids = {b.container_id for b in boxes}
        assert (await asyncio.to_thread(containers)).containers == ids
        # the sweep's container half (its other half SIGKILLs every descendant of this
        # process: the test run's own servers; tests/cli/test_stops.py plays it whole)
        assert (await asyncio.to_thread(remove_containers)).containers == ids
        assert (await asyncio.to_thread(owned_by_us, backend.client)) == ([], [])
    finally:
        await backend.aclose()  # closing what the sweep removed is quiet
