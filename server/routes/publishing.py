"""Publishing packs (docs/reference/packs.md): publish an archive, download one, enable a
published pack for unfiltered sampling, yank and unyank a version."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import BinaryIO, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from palaestra.sandbox.base import spool_file
from palaestra.sdk.models import PackEnableResponse, PackYankResponse, PublishResponse
from palaestra.server import auth as scopes
from palaestra.server.caller import principal_of, services_of
from palaestra.server.routes.common import ERRORS, error_reply, json_reply

router = APIRouter(tags=["packs"])
DOWNLOAD_CHUNK = 1 << 20  # what a pack download holds in memory at once

# The archive arrives as the raw body (read here with a bound), not as a parsed model.
ARCHIVE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            kind: {"schema": {"type": "string", "format": "binary"}}
            for kind in ("application/gzip", "application/octet-stream")
        },
    }
}


@router.post(
    "/v1/packs",
    response_model=PublishResponse,
    responses=ERRORS,
    status_code=201,
    openapi_extra=ARCHIVE_BODY,
)
async def publish(request: Request) -> Response:
    """Publish a pack archive (tar.gz; `publish` scope): 201 new, 200 already published."""
    principal = principal_of(request)
    principal.require(scopes.PUBLISH, "publishing a pack")
    settings = services_of(request).settings
    limit = settings.max_pack_bytes
    # The archive waits on disk, never whole in memory (up to max_pack_bytes a publish).
    with spool_file(settings.spool_folder) as archive:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                message = f"a pack archive may be at most {limit} bytes"
                return error_reply(413, "too_large", message)
            await asyncio.to_thread(archive.write, chunk)
        archive.seek(0)
        pack, created = await services_of(request).catalog.publish(archive, principal)
    reply = PublishResponse(
        name=pack.name, version=pack.version, digest=pack.digest, created=created
    )
    return json_reply(reply, 201 if created else 200)


@router.get(
    "/v1/packs/{org}/{name}/archive",
    responses={**ERRORS, 200: {"content": {"application/gzip": {}}}},
)
async def pack_download(org: str, name: str, request: Request) -> Response:
    """The archive of `org/name[@version]` (for `pack install`); packs with sealed splits:
    admin only, since an archive carries their private fields."""
    pack, archive = await services_of(request).catalog.pack_archive(
        f"{org}/{name}", principal_of(request)
    )
    filename = f"{pack.name.replace('/', '-')}-{pack.version}.tar.gz"
    headers = {
        "x-palaestra-digest": pack.digest,
        "content-disposition": f'attachment; filename="{filename}"',
        "content-length": str(os.fstat(archive.fileno()).st_size),
    }
    return StreamingResponse(chunks(archive), media_type="application/gzip", headers=headers)


async def chunks(archive: BinaryIO) -> AsyncIterator[bytes]:
    """The file a chunk at a time, read off the event loop; closed at the end (or when the
    client goes away)."""
    try:
        while chunk := await asyncio.to_thread(archive.read, DOWNLOAD_CHUNK):
            yield chunk
    finally:
        archive.close()


@router.post(
    "/v1/packs/{org}/{name}/enable",
    response_model=PackEnableResponse,
    responses=ERRORS,
)
async def pack_enable(org: str, name: str, request: Request) -> Response:
    """Let unfiltered sampling draw a published pack (admin; a new one is held out)."""
    changed = await services_of(request).catalog.enable_pack(f"{org}/{name}", principal_of(request))
    return json_reply(PackEnableResponse(name=f"{org}/{name}", changed=changed))


@router.post(
    "/v1/packs/{org}/{name}/{verb}",
    response_model=PackYankResponse,
    responses=ERRORS,
)
async def pack_yank(
    org: str, name: str, verb: Literal["yank", "unyank"], request: Request
) -> Response:
    """Yank `org/name@version` (its publisher or an admin; `unyank` undoes it):
    `org/name` and sampling skip it, while `org/name@version` and its digest still reach
    it (pip and cargo semantics)."""
    undo = verb == "unyank"
    return json_reply(
        await services_of(request).catalog.yank_pack(
            f"{org}/{name}", principal_of(request), undo=undo
        )
    )
