"""What `palaestra eval` asks the server: a pack by reference, every task of a split, the
server's version."""

from __future__ import annotations

import httpx

import palaestra
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.models import PackInfo


async def find_pack(client: AsyncClient, pack: str) -> PackInfo:
    name, _, version = pack.partition("@")
    infos = [p for p in await client.packs() if p.name == name]
    if not infos:
        raise PalaestraError(f"the server has no pack {pack!r}", code="not_found")
    if version:
        match = next((p for p in infos if p.version == version), None)
        if match is None:
            served = sorted({v for p in infos for v in (p.versions or [p.version])})
            raise PalaestraError(
                f"the server has no version {version} of {name} (it serves {', '.join(served)})",
                code="not_found",
            )
        return match
    return infos[-1] if len(infos) > 1 else infos[0]


async def server_version(url: str | None) -> str:
    """The server's palaestra version (its OpenAPI document says it)."""
    if not url:
        return palaestra.__version__
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            doc = (await http.get(f"{url.rstrip('/')}/openapi.json")).json()
            return str(doc["info"]["version"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "unknown"
