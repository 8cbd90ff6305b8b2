"""Episodes (DESIGN §3): reset, step, verify, state, close, fork, checkpoint, resume,
and the batch calls.

Step and the batch calls are served by StepFastPath in front of the app (server/fastpath.py);
their routes here document them (OpenAPI) and serve callers that mount the bare router.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from palaestra.sdk.models import (
    BatchResetRequest,
    BatchResetResponse,
    BatchStepRequest,
    BatchStepResponse,
    CheckpointResponse,
    EpisodeState,
    ForkRequest,
    ForkResponse,
    RegradeRequest,
    ResetRequest,
    ResetResponse,
    ResumeResponse,
    StepRequest,
    StepResponse,
    Verdict,
)
from palaestra.server.caller import manager_of, principal_of
from palaestra.server.fastpath import batch_reply, step_reply
from palaestra.server.routes.common import ERRORS, body_schema, json_reply

router = APIRouter()

# The bodies these routes parse themselves: the app adds what they reference to OpenAPI.
HAND_PARSED: list[type[BaseModel]] = [StepRequest, BatchResetRequest, BatchStepRequest]


@router.post("/v1/episodes", response_model=ResetResponse, responses=ERRORS, tags=["episodes"])
async def reset(body: ResetRequest, request: Request) -> Response:
    return json_reply(await manager_of(request).reset(body, principal_of(request)))


@router.post(
    "/v1/episodes/{episode_id}/step",
    response_model=StepResponse,
    responses=ERRORS,
    tags=["episodes"],
    openapi_extra=body_schema(StepRequest),
)
async def step(episode_id: str, request: Request) -> Response:
    # Served by StepFastPath in front of the app; this route documents it (OpenAPI)
    # and serves callers that mount the bare router. Both go through step_reply.
    status, body, headers = await step_reply(
        manager_of(request), episode_id, await request.body(), principal_of(request)
    )
    extra = {k.decode(): v.decode() for k, v in headers}
    return Response(body, status_code=status, media_type="application/json", headers=extra)


async def batch_route(request: Request) -> Response:
    # Served by StepFastPath too (batch_reply); here for OpenAPI and the bare app.
    status, body, _ = await batch_reply(
        request.url.path, manager_of(request), await request.body(), principal_of(request)
    )
    return Response(body, status_code=status, media_type="application/json")


def _batch(path: str, out: type[BaseModel], body: type[BaseModel]) -> None:
    router.add_api_route(
        path,
        batch_route,
        methods=["POST"],
        response_model=out,
        responses=ERRORS,
        tags=["batch"],
        name=path.rsplit("/", 1)[-1] + "_batch",
        openapi_extra=body_schema(body),
    )


_batch("/v1/batch/reset", BatchResetResponse, BatchResetRequest)
_batch("/v1/batch/step", BatchStepResponse, BatchStepRequest)


@router.post(
    "/v1/episodes/{episode_id}/verify",
    response_model=Verdict,
    responses=ERRORS,
    tags=["episodes"],
)
async def verify(episode_id: str, request: Request) -> Response:
    return json_reply(await manager_of(request).verify(episode_id, principal_of(request)))


@router.get(
    "/v1/episodes/{episode_id}",
    response_model=EpisodeState,
    responses=ERRORS,
    tags=["episodes"],
)
async def state(episode_id: str, request: Request) -> Response:
    return json_reply(await manager_of(request).state(episode_id, principal_of(request)))


@router.delete("/v1/episodes/{episode_id}", status_code=204, responses=ERRORS, tags=["episodes"])
async def close(episode_id: str, request: Request) -> Response:
    await manager_of(request).close(episode_id, principal_of(request))
    return Response(status_code=204)


@router.post(
    "/v1/episodes/{episode_id}/checkpoint",
    response_model=CheckpointResponse,
    responses=ERRORS,
    tags=["episodes"],
)
async def checkpoint(episode_id: str, request: Request) -> Response:
    """Keep the live episode (workspace, family state, step count) in the store, to resume
    after a restart (server/checkpoint.py); the episode goes on."""
    manager = manager_of(request)
    return json_reply(await manager.checkpoint(episode_id, principal_of(request)))


@router.post(
    "/v1/episodes/{episode_id}/resume",
    response_model=ResumeResponse,
    responses=ERRORS,
    tags=["episodes"],
)
async def resume(episode_id: str, request: Request) -> Response:
    """A `resumable` episode live again at its checkpoint, in a fresh sandbox, under the
    same id (server/checkpoint.py); steps after the checkpoint are lost."""
    manager = manager_of(request)
    return json_reply(await manager.resume(episode_id, principal_of(request)))


@router.post(
    "/v1/episodes/{episode_id}/fork",
    response_model=ForkResponse,
    responses=ERRORS,
    tags=["episodes"],
)
async def fork(episode_id: str, request: Request, body: ForkRequest | None = None) -> Response:
    """A new episode of the same token: a copy of the live episode's sandbox, family state
    and trajectory so far (server/fork.py); the parent goes on unchanged."""
    manager = manager_of(request)
    return json_reply(await manager.fork(episode_id, body, principal_of(request)))


@router.post(
    "/v1/episodes/{episode_id}/regrade",
    response_model=Verdict,
    responses=ERRORS,
    tags=["episodes"],
)
async def regrade(episode_id: str, body: RegradeRequest, request: Request) -> Response:
    """A new verdict for the ended episode: its kept final state verified by another
    version of its pack (server/regrade.py); its own verdict is unchanged."""
    manager = manager_of(request)
    return json_reply(await manager.regrade(episode_id, body, principal_of(request)))
