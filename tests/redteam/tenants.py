"""Tenants for the red-team tests: tokens of their own, each with a client on the real app."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from palaestra.server.app import create_app
from palaestra.server.auth import Quota, create_token
from palaestra.server.manager import EpisodeManager

ECHO = "palaestra/echo:say-birch"
SEALED_ECHO = "palaestra/echo:say-apple"
SAY = {"tool": "echo", "arguments": {"text": "hi"}}


@dataclass
class Tenant:
    name: str
    token_id: str
    http: httpx.AsyncClient
    token: str = ""

    async def reset(self, **body: Any) -> httpx.Response:
        return await self.http.post("/v1/episodes", json={"task": ECHO, **body})

    async def start(self, **body: Any) -> str:
        reply = await self.reset(**body)
        assert reply.status_code == 200, reply.text
        episode_id: str = reply.json()["episode_id"]
        return episode_id

    async def step(self, episode_id: str, request_id: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"action": SAY}
        if request_id is not None:
            body["request_id"] = request_id
        return await self.http.post(f"/v1/episodes/{episode_id}/step", json=body)


def tenant(manager: EpisodeManager, scopes: list[str], **quota: Any) -> Tenant:
    """A new token (its own quota where given) and a client of the app that uses it."""
    name = f"t-{uuid.uuid4().hex[:6]}"
    token, record = create_token(manager.store.db, scopes, name=name, quota=Quota(**quota))
    return Tenant(name=name, token_id=record["id"], http=client(manager, token), token=token)


def client(manager: EpisodeManager, token: str) -> httpx.AsyncClient:
    """A client of the real app (StepFastPath in front) over `manager`, with `token`."""
    app = create_app(manager.settings, manager=manager)
    app.state.manager = manager  # the ASGI transport does not run the lifespan
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://app",
        headers={"authorization": f"Bearer {token}"},
    )


def shape(response: httpx.Response, episode_id: str) -> tuple[int, str, str, bool]:
    """Status, code, message (with the id blanked) and retryable of an error reply."""
    error = response.json()["error"]
    message = error["message"].replace(episode_id, "<id>")
    return response.status_code, error["code"], message, error["retryable"]
