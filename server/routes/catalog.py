"""Discovery and the sampler (DESIGN §3): families, packs, tasks, the sampler's report and
the release of a quarantined task; answered by the catalog (server/catalog.py)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from palaestra.sdk.client import TaskQuery
from palaestra.sdk.models import (
    FamilyInfo,
    PackInfo,
    SamplerReleaseRequest,
    SamplerReleaseResponse,
    SamplerReport,
    TaskList,
)
from palaestra.server import auth as scopes
from palaestra.server.caller import principal_of, services_of
from palaestra.server.routes.common import ERRORS, json_reply

router = APIRouter()


@router.get("/v1/families", response_model=list[FamilyInfo], tags=["discovery"])
async def families(request: Request) -> list[FamilyInfo]:
    principal_of(request)
    return services_of(request).catalog.family_infos()


@router.get("/v1/packs", response_model=list[PackInfo], tags=["discovery"])
async def packs(request: Request) -> list[PackInfo]:
    principal_of(request)
    return services_of(request).catalog.pack_infos()


@router.get("/v1/packs/{org}/{name}", response_model=PackInfo, responses=ERRORS, tags=["discovery"])
async def pack(org: str, name: str, request: Request) -> PackInfo:
    principal_of(request)
    return services_of(request).catalog.pack_info(f"{org}/{name}")


@router.get("/v1/tasks", response_model=TaskList, tags=["discovery"])
async def tasks(
    request: Request,
    pack: str | None = None,
    split: str | None = None,
    family: str | None = None,
    domain: str | None = None,
    limit: int = Query(default=1000, ge=1, le=10000),
    offset: int = Query(default=0, ge=0),
) -> Response:
    principal_of(request)
    return json_reply(
        services_of(request).catalog.task_list(
            TaskQuery(pack, split, family, domain, limit, offset)
        )
    )


@router.get("/v1/sampler", response_model=SamplerReport, responses=ERRORS, tags=["sampler"])
async def sampler(
    request: Request,
    pack: str | None = None,
    split: str | None = None,
    domain: str | None = None,
    limit: int = Query(default=1000, ge=0, le=100000),
) -> Response:
    """Mixture weights, effective probabilities, per-task success rates, quarantine
    (tasks of sealed splits: `eval` and admin tokens only)."""
    principal = principal_of(request)
    return json_reply(
        services_of(request).catalog.sampler_report(
            pack=pack, split=split, domain=domain, limit=limit, principal=principal
        )
    )


@router.post(
    "/v1/sampler/release",
    response_model=SamplerReleaseResponse,
    responses=ERRORS,
    tags=["sampler"],
)
async def sampler_release(body: SamplerReleaseRequest, request: Request) -> Response:
    """Let the sampler draw a quarantined task again (an admin action)."""
    principal_of(request).require(scopes.ADMIN, "releasing a quarantined task")
    return json_reply(services_of(request).catalog.sampler_release(body.task))
