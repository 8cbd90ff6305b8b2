"""Held-out draws of a pack's sealed generated splits (server/draws.py): what is served
now, and the admin's rotation (a new draw; the earlier ones retired)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from palaestra.sdk.errors import UnavailableError
from palaestra.sdk.heldout import HeldoutDraws, HeldoutRotateRequest
from palaestra.server.caller import principal_of, services_of
from palaestra.server.draws import DrawKeeper
from palaestra.server.routes.common import ERRORS, json_reply

router = APIRouter(tags=["packs"])


def keeper(request: Request) -> DrawKeeper:
    draws = services_of(request).draws
    if draws is None:
        raise UnavailableError("this server keeps no held-out draws", code="no_draws")
    return draws


@router.get("/v1/packs/{org}/{name}/heldout", response_model=HeldoutDraws, responses=ERRORS)
async def heldout_draws(org: str, name: str, request: Request) -> Response:
    """The draw each sealed generated split of the pack serves now."""
    principal_of(request)  # any token: draw numbers reveal nothing of the tasks
    return json_reply(await keeper(request).describe(f"{org}/{name}"))


@router.post("/v1/packs/{org}/{name}/heldout/rotate", response_model=HeldoutDraws, responses=ERRORS)
async def heldout_rotate(
    org: str, name: str, request: Request, body: HeldoutRotateRequest | None = None
) -> Response:
    """Draw a new held-out set (admin): every earlier draw is retired, never served again."""
    principal = principal_of(request)
    split = body.split if body is not None else None
    return json_reply(await keeper(request).rotate(f"{org}/{name}", split, principal))
