"""Operations (DESIGN §3): liveness, readiness and the Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from palaestra.server.caller import manager_of, services_of
from palaestra.server.routes.common import error_reply

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready (200): `status` "ready", or "warming" while packs whose tasks are not
    generated yet warm in the background (`warming`: {pack: progress}); the packs
    that are ready are served meanwhile (docs/reference/packs.md, "Ready at once")."""
    services = services_of(request)
    problems = {"packs": services.packs.errors} if services.packs.errors else {}
    if not manager_of(request).ready:
        return error_reply(503, "not_ready", "the episode manager is not running", True)
    if not services.store.writer_alive:  # /healthz stays a liveness check
        reason = services.store.writer_error or "closed"
        return error_reply(503, "store_down", f"the store writer stopped ({reason})", False)
    unreachable = await asyncio.to_thread(services.store.db.ping)
    if unreachable:  # a shared database that went down between writes
        return error_reply(503, "store_down", unreachable, True)
    broken = services.families.broken()  # an installed family that failed to import
    if broken:
        message = "; ".join(b.message() for b in broken)
        return error_reply(503, "family_unavailable", f"not ready: {message}", False)
    warming = {name: w.shown() for name, w in services.packs.warming.items()}
    if warming:
        body = {"status": "warming", "warming": warming, "pack_errors": problems}
        return JSONResponse(body)
    return JSONResponse({"status": "ready", "pack_errors": problems})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(
        await manager_of(request).render_metrics(),
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )
