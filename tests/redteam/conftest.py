"""Fixtures of the red-team suite: the real app over a real manager, spoken to over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from palaestra.server.app import create_app
from palaestra.server.manager import EpisodeManager


@asynccontextmanager
async def app_client(manager: EpisodeManager) -> AsyncIterator[httpx.AsyncClient]:
    """The app (with its StepFastPath front door) over a started `manager`, as the admin."""
    app = create_app(manager.settings, manager=manager)
    app.state.manager = manager  # the ASGI transport does not run the lifespan
    token = (manager.settings.data_dir / "admin.token").read_text().strip()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://app",
        headers={"authorization": f"Bearer {token}"},
    ) as client:
        yield client


@pytest.fixture
async def api(manager: EpisodeManager) -> AsyncIterator[httpx.AsyncClient]:
    """`app_client` over conftest's per-test manager."""
    async with app_client(manager) as client:
        yield client
