"""`POST /v1/groups/verify` (server/groups.py holds the rules; this is the wire side)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from palaestra.sdk.groups import GroupVerifyRequest, GroupVerifyResponse
from palaestra.sdk.models import ErrorResponse
from palaestra.server.caller import manager_of, principal_of

router = APIRouter(tags=["groups"])

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 403, 404, 409, 413, 422, 503)
}


@router.post("/v1/groups/verify", response_model=GroupVerifyResponse, responses=ERRORS)
async def verify_group(body: GroupVerifyRequest, request: Request) -> Response:
    """Rewards for the ended episodes of one task, judged together (pairwise tournament
    or one ranking call); the same group again answers the stored result, no judge call."""
    verifier = manager_of(request).groups
    reply = await verifier.verify(body, principal_of(request))
    return Response(reply.model_dump_json(), media_type="application/json")
