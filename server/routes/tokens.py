"""API tokens (admin scope): list, make (the reply is the only place a token is shown) and
revoke; a revoked token is dropped from the front door's cache at once."""

from __future__ import annotations

import asyncio
import functools

from fastapi import APIRouter, Request
from fastapi.responses import Response

from palaestra.sdk.models import TokenCreated, TokenRecord, TokenRequest
from palaestra.server import auth as scopes
from palaestra.server.caller import principal_of, services_of
from palaestra.server.routes.common import ERRORS, error_reply, json_reply

router = APIRouter(tags=["tokens"])


@router.get("/v1/tokens", response_model=list[TokenRecord], responses=ERRORS)
async def tokens_list(request: Request) -> list[TokenRecord]:
    principal_of(request).require(scopes.ADMIN, "listing tokens")
    rows = await asyncio.to_thread(scopes.list_tokens, services_of(request).store.db)
    return [TokenRecord(**row) for row in rows]


@router.post("/v1/tokens", response_model=TokenCreated, responses=ERRORS, status_code=201)
async def tokens_create(body: TokenRequest, request: Request) -> Response:
    """Make a token; the reply is the only place it is ever shown."""
    principal_of(request).require(scopes.ADMIN, "making tokens")
    quota = scopes.Quota(body.max_live, body.max_episodes_per_hour, body.max_cpu_s_per_hour)
    token, record = await asyncio.to_thread(
        functools.partial(
            scopes.create_token,
            services_of(request).store.db,
            body.scopes,
            body.name,
            orgs=body.orgs,
            quota=quota,
        )
    )
    return json_reply(TokenCreated(token=token, **record), 201)


@router.delete("/v1/tokens/{name}", status_code=204, responses=ERRORS)
async def tokens_revoke(name: str, request: Request) -> Response:
    principal_of(request).require(scopes.ADMIN, "revoking tokens")
    hashes = await asyncio.to_thread(scopes.revoke_token, services_of(request).store.db, name)
    if not hashes:
        return error_reply(404, "not_found", f"no live token named (or with id) {name!r}")
    services_of(request).auth.forget(hashes)
    return Response(status_code=204)
