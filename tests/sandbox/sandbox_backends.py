"""The `backend` fixture every conformance test runs against, one parameter per backend.

bwrap, bwrap behind a WarmPool, docker (skipped where the engine or the module is
missing), e2b against `FakeE2B` (a fake at the SDK boundary, see fake_e2b.py; skipped
where bwrap cannot run, since the fake runs its "VMs" in bwrap), and e2b against the
real cloud (skipped unless E2B_API_KEY is set).

Not a conftest.py: tests/conftest.py is imported as `conftest` by tests that do
``from conftest import ServerProcess``, and a second conftest module would shadow it.
Test modules import the fixtures from here.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import Backend, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available

IS_ROOT = os.geteuid() == 0

BACKENDS = ["bwrap", "bwrap+pool", "docker", "e2b-fake", "e2b-live"]


def _bwrap_or_skip(tmp_path: Path) -> BwrapBackend:
    ok, why = bwrap_available()
    if not ok:
        pytest.skip(f"bwrap unusable: {why}")
    return BwrapBackend(None if IS_ROOT else tmp_path / "rt")


def _docker_or_skip() -> Backend:
    try:
        from palaestra.sandbox.docker import DockerBackend
    except ImportError as e:
        pytest.skip(f"palaestra.sandbox.docker unavailable: {e}")
    ok, why = DockerBackend.available()
    if not ok:
        pytest.skip(f"docker engine unavailable: {why}")
    return DockerBackend()


def _fake_e2b_or_skip(tmp_path: Path) -> Backend:
    pytest.importorskip("e2b", reason="the e2b SDK is not installed")
    ok, why = bwrap_available()
    if not ok:
        pytest.skip(f"FakeE2B runs its VMs in bwrap, which is unusable here: {why}")
    if not IS_ROOT:
        pytest.skip("FakeE2B enters its VMs with nsenter, which needs root")
    from palaestra.sandbox.e2b import E2BBackend
    from sandbox.fake_e2b import FakeE2B

    vms = tmp_path / "fake-e2b"
    vms.mkdir()
    return E2BBackend(sandbox_factory=FakeE2B(vms).create)


def _live_e2b_or_skip() -> Backend:
    key = os.environ.get("E2B_API_KEY")
    if not key:
        pytest.skip("E2B_API_KEY is not set: the live E2B cloud test needs it")
    pytest.importorskip("e2b", reason="the e2b SDK is not installed")
    from palaestra.sandbox.e2b import E2BBackend

    return E2BBackend(api_key=key, sandbox_timeout_s=600)


def make(kind: str, tmp_path: Path) -> Backend:
    if kind == "bwrap":
        return _bwrap_or_skip(tmp_path)
    if kind == "bwrap+pool":
        from palaestra.sandbox.pool import WarmPool

        return WarmPool(_bwrap_or_skip(tmp_path), size=2)
    if kind == "docker":
        return _docker_or_skip()
    if kind == "e2b-fake":
        return _fake_e2b_or_skip(tmp_path)
    if kind == "e2b-live":
        return _live_e2b_or_skip()
    raise AssertionError(kind)


# The docker engine and the E2B cloud are the slow tier's (tests/README.md).
SLOW_BACKENDS = {"docker", "e2b-live"}
PARAMS = [pytest.param(b, marks=pytest.mark.slow) if b in SLOW_BACKENDS else b for b in BACKENDS]


@pytest.fixture(params=PARAMS, name="backend")
async def backend_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    b = make(request.param, tmp_path)
    try:
        yield b
    finally:
        await b.aclose()
    assert b.live_count == 0


SPEC = SandboxSpec(workspace_mb=32, default_timeout_s=20)


@pytest.fixture(name="spec")
def spec_fixture() -> SandboxSpec:
    return SPEC
