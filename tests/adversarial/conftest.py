"""Fixtures: a backend per parametrized name, the attacked sandbox, its neighbour, the guard."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from palaestra.sandbox.base import Backend, Sandbox

from .harness import ATTACK_SPEC, SECRET_NAME, Guard, make_backend, new_marker


@pytest.fixture
async def backend(backend_name: str) -> AsyncIterator[Backend]:
    b = make_backend(backend_name)
    try:
        yield b
    finally:
        await b.aclose()
    assert b.live_count == 0


@pytest.fixture
async def box(backend: Backend) -> AsyncIterator[Sandbox]:
    s = await backend.create(ATTACK_SPEC)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def neighbour(backend: Backend) -> AsyncIterator[Sandbox]:
    """A sandbox of the same backend that exists before the attack and must not notice it."""
    s = await backend.create(ATTACK_SPEC)
    try:
        r = await s.exec("echo ok", timeout=10)
        assert r.stdout == "ok\n", r
        yield s
    finally:
        await s.close()


@pytest.fixture
def marker() -> str:
    return new_marker()


@pytest.fixture
async def guard(
    backend_name: str,
    box: Sandbox,
    neighbour: Sandbox,
    marker: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Guard:
    secret = f"s3cret-{new_marker()}"
    monkeypatch.setenv(SECRET_NAME, secret)
    g = Guard(backend_name, box, neighbour, marker, secret)
    g.start()
    return g
