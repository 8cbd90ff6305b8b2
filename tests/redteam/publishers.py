"""Pack authors for the red-team tests: publish tokens with granted orgs, and tiny packs."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from palaestra.server.app import create_app
from palaestra.server.auth import create_token
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.archive import pack_archive

GZIP = {"content-type": "application/gzip"}


def echo_task(task_id: str = "say-oak", **public: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "family": "echo",
        "split": "train",
        "public": {"instruction": "Submit 'oak' backwards.", **public},
        "private": {"answer": "kao"},
    }


def write_pack(
    root: Path, name: str, version: str = "1.0.0", tasks: list[dict[str, Any]] | None = None
) -> Path:
    """A pack directory of `tasks` (default: one echo task), families taken from them."""
    tasks = tasks or [echo_task()]
    families = sorted({t["family"] for t in tasks})
    root.mkdir(parents=True, exist_ok=True)
    (root / "pack.toml").write_text(
        f'name = "{name}"\nversion = "{version}"\nfamilies = {json.dumps(families)}\n\n'
        "[splits.train]\nsealed = false\n"
    )
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return root


def archive(tmp: Path, name: str, version: str = "1.0.0", **kw: Any) -> bytes:
    return pack_archive(write_pack(tmp / f"{uuid.uuid4().hex[:8]}", name, version, **kw))


@asynccontextmanager
async def client(
    manager: EpisodeManager, scopes: list[str], orgs: tuple[str, ...] = ()
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the real app with a new token of `scopes`, granted `orgs`."""
    token, _ = create_token(manager.store.db, scopes, name=f"p-{uuid.uuid4().hex[:6]}", orgs=orgs)
    app = create_app(manager.settings, manager=manager)
    app.state.manager = manager  # the ASGI transport does not run the lifespan
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://app",
        headers={"authorization": f"Bearer {token}"},
    ) as http:
        yield http


async def publish(http: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await http.post("/v1/packs", content=data, headers=GZIP)


def error(response: httpx.Response) -> tuple[int, str, str]:
    """(status, code, message) of a contract error reply (it must have that shape)."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "retryable"}
    return response.status_code, body["error"]["code"], body["error"]["message"]
