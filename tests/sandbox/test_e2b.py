"""E2BBackend specifics against FakeE2B (a fake at the SDK boundary): errors and SDK calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import SandboxCreateError, SandboxGone, SandboxSpec
from palaestra.sandbox.bwrap import bwrap_available
from sandbox.sandbox_backends import IS_ROOT

pytest.importorskip("e2b", reason="the e2b SDK is not installed")
pytestmark = pytest.mark.skipif(
    not (bwrap_available()[0] and IS_ROOT), reason="FakeE2B needs bwrap and root (nsenter)"
)

from e2b.exceptions import AuthenticationException  # noqa: E402

from palaestra.sandbox.e2b import E2BBackend  # noqa: E402
from sandbox.fake_e2b import FakeE2B  # noqa: E402
from tests.servers import wait_until  # noqa: E402


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeE2B]:
    f = FakeE2B(tmp_path)
    yield f
    assert not f.running, "a fake VM was left running"


async def test_sdk_calls_and_errors(fake: FakeE2B) -> None:
    b = E2BBackend(sandbox_factory=fake.create, api_key="k")
    async with await b.create(SandboxSpec()) as box:
        kw = fake.create_kwargs[-1]
        assert kw["template"] == "base" and kw["allow_internet_access"] is False
        assert kw["api_key"] == "k"
        r = await box.exec("sleep 100 >/dev/null 2>&1 & echo bg")
        assert r.stdout == "bg\n"
        # The marker sweep SIGKILLed `sleep`: it is gone once the kernel next runs it and the
        # VM's init reaps it, a moment later on a loaded machine (a CI run once saw it still).
        vm = fake.created[-1]
        wait_until(lambda: vm.processes() == [], base_s=5, what=lambda: f"{vm.processes()}")
    fake.fail_next_create = AuthenticationException("bad key")
    with pytest.raises(SandboxCreateError, match="bad key"):
        await b.create(SandboxSpec())
    with pytest.raises(SandboxCreateError, match="not found"):
        await b.create(SandboxSpec(image="no-such-template"))
    assert b.live_count == 0
    await b.aclose()


async def test_vm_gone_is_sandbox_gone(fake: FakeE2B) -> None:
    b = E2BBackend(sandbox_factory=fake.create)
    box = await b.create(SandboxSpec())
    await fake.created[-1].kill()  # it expired or was killed behind our back
    with pytest.raises(SandboxGone):
        await box.exec(["true"])
    assert not box.alive
    with pytest.raises(SandboxGone):
        await box.read_file("x")
    await b.aclose()
    assert b.live_count == 0
