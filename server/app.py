"""The FastAPI app over the episode manager (DESIGN §3): routes, JSON errors, OpenAPI.

Hot routes answer with pre-serialized JSON (`model_dump_json`), so a step costs one
validation of the request and one serialization of the reply.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

import palaestra
from palaestra.sdk.client import TaskQuery
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.models import (
    BatchResetRequest,
    BatchResetResponse,
    BatchStepRequest,
    BatchStepResponse,
    EpisodeState,
    ErrorResponse,
    FamilyInfo,
    PackInfo,
    PackYankResponse,
    ResetRequest,
    ResetResponse,
    SamplerReleaseRequest,
    SamplerReleaseResponse,
    SamplerReport,
    StepRequest,
    StepResponse,
    TaskList,
    Verdict,
)
from palaestra.server import auth as scopes
from palaestra.server import group_routes
from palaestra.server.caller import manager_of, principal_of, services_of
from palaestra.server.config import Settings
from palaestra.server.doors import mcp_http, openenv, ors
from palaestra.server.fastpath import (
    StepFastPath,
    authenticator,
    batch_reply,
    step_reply,
    validation_message,
)
from palaestra.server.harness import routes as harness_routes
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager

log = logging.getLogger("palaestra.server")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 422, 429, 503)
}


# Starlette's own errors, answered in the contract's shape (never `{"detail": …}`).
HTTP_ERRORS: dict[int, tuple[str, str]] = {
    404: ("not_found", "no route {}; the routes are listed at /openapi.json"),
    405: ("method_not_allowed", "{}: this route does not take that method (see Allow)"),
}


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(
        content=model.model_dump_json(), media_type="application/json", status_code=status
    )


def _error(
    status: int,
    code: str,
    message: str,
    retryable: bool = False,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "retryable": retryable}}
    return JSONResponse(body, status_code=status, headers=headers)


class PublishResponse(BaseModel):
    name: str
    version: str
    digest: str
    created: bool


class PackEnableResponse(BaseModel):
    name: str
    enabled: bool = True
    changed: bool = Field(description="false if unfiltered sampling already drew the pack")


class TokenRequest(BaseModel):
    scopes: list[str]
    name: str | None = None
    orgs: list[str] = Field(default_factory=list, description="orgs a publish token may use")
    max_live: int | None = Field(default=None, ge=0, le=10**9)
    max_episodes_per_hour: int | None = Field(default=None, ge=0, le=10**9)
    max_cpu_s_per_hour: float | None = Field(default=None, ge=0, le=1e12, allow_inf_nan=False)


class TokenRecord(BaseModel):
    id: str
    name: str
    scopes: list[str]
    created_at: float
    revoked: bool
    orgs: list[str] = Field(default_factory=list)
    max_live: int | None = None
    max_episodes_per_hour: int | None = None
    max_cpu_s_per_hour: float | None = None


class TokenCreated(TokenRecord):
    token: str


REF_TEMPLATE = "#/components/schemas/{model}"


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI requestBody for a route that parses `model` itself (its `$defs` go to
    the components: `_complete_openapi`)."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    schema.pop("$defs", None)
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def _complete_openapi(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Bodies the routes parse themselves reference models FastAPI never saw (such as
    BatchStepItem): add those, and what they reference, so every `$ref` resolves."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = generate()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template=REF_TEMPLATE)
                for name, sub in schema.pop("$defs", {}).items():
                    schemas.setdefault(name, sub)
                schemas.setdefault(model.__name__, schema)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]


def _validation_message(exc: RequestValidationError) -> str:
    return validation_message(list(exc.errors()))


def create_app(
    settings: Settings | None = None,
    manager: EpisodeManager | None = None,
    *,
    freeze_gc: bool = False,
) -> FastAPI:
    """The app; with no `manager` it builds one from `settings` at start-up.

    `freeze_gc` (for a server process of its own, as `palaestra serve` runs): once started,
    what is loaded (packs, families, the app) leaves the garbage collector's view, so its
    collections walk only what episodes allocate (`gc.freeze`)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = manager or build_manager(settings, background_warm=settings.background_warm)
        app.state.manager = owned
        await owned.start()
        log.info(
            "palaestra %s serving on http://%s:%d (sandbox %s, data dir %s)",
            palaestra.__version__,
            settings.host,
            settings.port,
            settings.sandbox,
            settings.data_dir.resolve(),
        )
        if freeze_gc:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            await owned.shutdown()

    app = FastAPI(
        title="palaestra",
        version=palaestra.__version__,
        lifespan=lifespan,
        description="Reset, step and verify over sandboxed task environments.",
    )

    app.add_middleware(StepFastPath)

    @app.exception_handler(PalaestraError)
    async def palaestra_error(request: Request, exc: PalaestraError) -> JSONResponse:
        headers = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None
        return _error(exc.status or 500, exc.code, exc.message, exc.retryable, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Starlette's own answers (unknown route, wrong method) in the contract's shape."""
        code, message = HTTP_ERRORS.get(exc.status_code, ("http_error", str(exc.detail)))
        where = f"{request.method} {request.url.path}"
        headers = dict(exc.headers) if exc.headers else None
        return _error(exc.status_code, code, message.format(where), False, headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "internal", f"internal error ({type(exc).__name__}); this is a bug")

    @app.post("/v1/episodes", response_model=ResetResponse, responses=ERRORS, tags=["episodes"])
    async def reset(body: ResetRequest, request: Request) -> Response:
        return _json(await manager_of(request).reset(body, principal_of(request)))

    @app.post(
        "/v1/episodes/{episode_id}/step",
        response_model=StepResponse,
        responses=ERRORS,
        tags=["episodes"],
        openapi_extra=_body_schema(StepRequest),
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

    for path, out, body_model in (
        ("/v1/batch/reset", BatchResetResponse, BatchResetRequest),
        ("/v1/batch/step", BatchStepResponse, BatchStepRequest),
    ):
        app.add_api_route(
            path,
            batch_route,
            methods=["POST"],
            response_model=out,
            responses=ERRORS,
            tags=["batch"],
            name=path.rsplit("/", 1)[-1] + "_batch",
            openapi_extra=_body_schema(body_model),
        )

    @app.post(
        "/v1/episodes/{episode_id}/verify",
        response_model=Verdict,
        responses=ERRORS,
        tags=["episodes"],
    )
    async def verify(episode_id: str, request: Request) -> Response:
        return _json(await manager_of(request).verify(episode_id, principal_of(request)))

    @app.get(
        "/v1/episodes/{episode_id}",
        response_model=EpisodeState,
        responses=ERRORS,
        tags=["episodes"],
    )
    async def state(episode_id: str, request: Request) -> Response:
        return _json(await manager_of(request).state(episode_id, principal_of(request)))

    @app.delete("/v1/episodes/{episode_id}", status_code=204, responses=ERRORS, tags=["episodes"])
    async def close(episode_id: str, request: Request) -> Response:
        await manager_of(request).close(episode_id, principal_of(request))
        return Response(status_code=204)

    @app.get("/v1/families", response_model=list[FamilyInfo], tags=["discovery"])
    async def families(request: Request) -> list[FamilyInfo]:
        principal_of(request)
        return services_of(request).catalog.family_infos()

    @app.get("/v1/packs", response_model=list[PackInfo], tags=["discovery"])
    async def packs(request: Request) -> list[PackInfo]:
        principal_of(request)
        return services_of(request).catalog.pack_infos()

    @app.get(
        "/v1/packs/{org}/{name}", response_model=PackInfo, responses=ERRORS, tags=["discovery"]
    )
    async def pack(org: str, name: str, request: Request) -> PackInfo:
        principal_of(request)
        return services_of(request).catalog.pack_info(f"{org}/{name}")

    @app.get("/v1/tasks", response_model=TaskList, tags=["discovery"])
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
        return _json(
            services_of(request).catalog.task_list(
                TaskQuery(pack, split, family, domain, limit, offset)
            )
        )

    @app.get("/v1/sampler", response_model=SamplerReport, responses=ERRORS, tags=["sampler"])
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
        return _json(
            services_of(request).catalog.sampler_report(
                pack=pack, split=split, domain=domain, limit=limit, principal=principal
            )
        )

    @app.post(
        "/v1/sampler/release",
        response_model=SamplerReleaseResponse,
        responses=ERRORS,
        tags=["sampler"],
    )
    async def sampler_release(body: SamplerReleaseRequest, request: Request) -> Response:
        """Let the sampler draw a quarantined task again (an admin action)."""
        principal_of(request).require(scopes.ADMIN, "releasing a quarantined task")
        return _json(services_of(request).catalog.sampler_release(body.task))

    @app.post(
        "/v1/packs",
        response_model=PublishResponse,
        responses=ERRORS,
        status_code=201,
        tags=["packs"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    kind: {"schema": {"type": "string", "format": "binary"}}
                    for kind in ("application/gzip", "application/octet-stream")
                },
            }
        },
    )
    async def publish(request: Request) -> Response:
        """Publish a pack archive (tar.gz; `publish` scope): 201 new, 200 already published."""
        principal = principal_of(request)
        principal.require(scopes.PUBLISH, "publishing a pack")
        limit = services_of(request).settings.max_pack_bytes
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return _error(413, "too_large", f"a pack archive may be at most {limit} bytes")
            chunks.append(chunk)
        pack, created = await services_of(request).catalog.publish(b"".join(chunks), principal)
        reply = PublishResponse(
            name=pack.name, version=pack.version, digest=pack.digest, created=created
        )
        return _json(reply, 201 if created else 200)

    @app.get(
        "/v1/packs/{org}/{name}/archive",
        responses={**ERRORS, 200: {"content": {"application/gzip": {}}}},
        tags=["packs"],
    )
    async def pack_download(org: str, name: str, request: Request) -> Response:
        """The archive of `org/name[@version]` (for `pack install`); packs with sealed splits:
        admin only, since an archive carries their private fields."""
        pack, data = await services_of(request).catalog.pack_archive(
            f"{org}/{name}", principal_of(request)
        )
        filename = f"{pack.name.replace('/', '-')}-{pack.version}.tar.gz"
        headers = {
            "x-palaestra-digest": pack.digest,
            "content-disposition": f'attachment; filename="{filename}"',
        }
        return Response(data, media_type="application/gzip", headers=headers)

    @app.post(
        "/v1/packs/{org}/{name}/enable",
        response_model=PackEnableResponse,
        responses=ERRORS,
        tags=["packs"],
    )
    async def pack_enable(org: str, name: str, request: Request) -> Response:
        """Let unfiltered sampling draw a published pack (admin; a new one is held out)."""
        changed = await services_of(request).catalog.enable_pack(
            f"{org}/{name}", principal_of(request)
        )
        return _json(PackEnableResponse(name=f"{org}/{name}", changed=changed))

    @app.post(
        "/v1/packs/{org}/{name}/{verb}",
        response_model=PackYankResponse,
        responses=ERRORS,
        tags=["packs"],
    )
    async def pack_yank(
        org: str, name: str, verb: Literal["yank", "unyank"], request: Request
    ) -> Response:
        """Yank `org/name@version` (its publisher or an admin; `unyank` undoes it):
        `org/name` and sampling skip it, while `org/name@version` and its digest still reach
        it (pip and cargo semantics)."""
        undo = verb == "unyank"
        return _json(
            await services_of(request).catalog.yank_pack(
                f"{org}/{name}", principal_of(request), undo=undo
            )
        )

    @app.get("/v1/tokens", response_model=list[TokenRecord], responses=ERRORS, tags=["tokens"])
    async def tokens_list(request: Request) -> list[TokenRecord]:
        principal_of(request).require(scopes.ADMIN, "listing tokens")
        rows = await asyncio.to_thread(scopes.list_tokens, services_of(request).store.db)
        return [TokenRecord(**row) for row in rows]

    @app.post(
        "/v1/tokens",
        response_model=TokenCreated,
        responses=ERRORS,
        status_code=201,
        tags=["tokens"],
    )
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
        return _json(TokenCreated(token=token, **record), 201)

    @app.delete("/v1/tokens/{name}", status_code=204, responses=ERRORS, tags=["tokens"])
    async def tokens_revoke(name: str, request: Request) -> Response:
        principal_of(request).require(scopes.ADMIN, "revoking tokens")
        hashes = await asyncio.to_thread(scopes.revoke_token, services_of(request).store.db, name)
        if not hashes:
            return _error(404, "not_found", f"no live token named (or with id) {name!r}")
        authenticator(request.app).forget(hashes)
        return Response(status_code=204)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> JSONResponse:
        """Ready (200): `status` "ready", or "warming" while packs whose tasks are not
        generated yet warm in the background (`warming`: {pack: progress}); the packs
        that are ready are served meanwhile (docs/reference/packs.md, "Ready at once")."""
        services = services_of(request)
        problems = {"packs": services.packs.errors} if services.packs.errors else {}
        if not manager_of(request).ready:
            return _error(503, "not_ready", "the episode manager is not running", True)
        if not services.store.writer_alive:  # /healthz stays a liveness check
            reason = services.store.writer_error or "closed"
            return _error(503, "store_down", f"the store writer stopped ({reason})", False)
        unreachable = await asyncio.to_thread(services.store.db.ping)
        if unreachable:  # a shared database that went down between writes
            return _error(503, "store_down", unreachable, True)
        broken = services.families.broken()  # an installed family that failed to import
        if broken:
            message = "; ".join(b.message() for b in broken)
            return _error(503, "family_unavailable", f"not ready: {message}", False)
        warming = {name: w.shown() for name, w in services.packs.warming.items()}
        if warming:
            body = {"status": "warming", "warming": warming, "pack_errors": problems}
            return JSONResponse(body)
        return JSONResponse({"status": "ready", "pack_errors": problems})

    @app.get("/metrics", tags=["operations"])
    async def metrics(request: Request) -> Response:
        return Response(
            await manager_of(request).render_metrics(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    app.include_router(mcp_http.router)
    app.include_router(harness_routes.router)
    app.include_router(group_routes.router)
    app.include_router(openenv.router)
    app.include_router(ors.router)  # at the root, after /v1: ORS's client joins absolute paths
    _complete_openapi(app, [StepRequest, BatchResetRequest, BatchStepRequest])
    return app
