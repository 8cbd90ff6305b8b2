"""The FastAPI app over the episode manager (DESIGN §3): start-up and shutdown, the front
door (StepFastPath, ahead of FastAPI's own stack), JSON errors, the routers and the
OpenAPI completion.

The routes are `APIRouter`s per concern (server/routes/: episodes, catalog, publishing,
tokens, operations; the groups route, the harness's `/llm/` and the doors beside them);
hot routes answer with pre-serialized JSON (`model_dump_json`), so a step costs one
validation of the request and one serialization of the reply.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

import palaestra
from palaestra.sdk.errors import PalaestraError
from palaestra.server import group_routes
from palaestra.server.config import Settings
from palaestra.server.doors import mcp_http, nemo_gym, openenv, openenv_tasks, ors
from palaestra.server.fastpath import StepFastPath, validation_message
from palaestra.server.harness import routes as harness_routes
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.warming import PackWarmer
from palaestra.server.routes import catalog, episodes, heldout, operations, publishing, tokens
from palaestra.server.routes.common import REF_TEMPLATE, error_reply
from palaestra.server.runtime import build_manager

log = logging.getLogger("palaestra.server")

# Starlette's own errors, answered in the contract's shape (never `{"detail": …}`).
HTTP_ERRORS: dict[int, tuple[str, str]] = {
    404: ("not_found", "no route {}; the routes are listed at /openapi.json"),
    405: ("method_not_allowed", "{}: this route does not take that method (see Allow)"),
}


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


# Container objects allocated (net) between two collections of the youngest generation:
# Python's default of 700 runs one several times per batch step call, each walking every
# in-flight reply; a server's garbage is almost all freed by reference counting anyway.
YOUNG_COLLECTION_EVERY = 10_000


async def _freeze_once_warm(warmer: PackWarmer) -> None:
    """Packs warmed in the background are loaded after start-up: out of the collector's view
    with the rest once they are in (only the young generations are collected first: a full
    collection of a large catalog would hold the event loop)."""
    await warmer.wait()
    gc.collect(1)
    gc.freeze()


def _validation_message(exc: RequestValidationError) -> str:
    return validation_message(list(exc.errors()))


class AppState(State):
    """`app.state`, whose values are plain instance attributes as well: the front door reads
    `app.state.manager` on every request, and Starlette's `State` answers an attribute only
    after the normal lookup has raised (and caught) an AttributeError (675 against 43 ns)."""

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, value)
        object.__setattr__(self, key, value)

    def __delattr__(self, key: str) -> None:
        super().__delattr__(key)
        object.__delattr__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.__setattr__(key, value)

    def __delitem__(self, key: str) -> None:
        self.__delattr__(key)


class PalaestraAPI(FastAPI):
    """FastAPI with the front door (server/fastpath.py) ahead of its whole stack, not inside
    it: a step or batch call skips FastAPI's telemetry check, Starlette's error middleware
    and their `send` wrappers (a tenth of a step's CPU, bench/api.py), and every other
    request goes on through all of them. Errors of the front door itself are answered in
    the contract's shape there."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state = AppState()
        self._front = StepFastPath(super().__call__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: the front door reads the manager there
        await self._front(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    manager: EpisodeManager | None = None,
    *,
    freeze_gc: bool = False,
) -> FastAPI:
    """The app; with no `manager` it builds one from `settings` at start-up.

    `freeze_gc` (for a server process of its own, as `palaestra serve` runs): once started,
    what is loaded (packs, families, the app) leaves the garbage collector's view, so its
    collections walk only what episodes allocate (`gc.freeze`), and they run less often."""
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
        frozen: asyncio.Task[None] | None = None
        if freeze_gc:
            gc.collect()
            gc.freeze()
            gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])
            if owned.packs.warmer is not None:
                frozen = asyncio.create_task(_freeze_once_warm(owned.packs.warmer))
        try:
            yield
        finally:
            if frozen is not None:
                frozen.cancel()
            await owned.shutdown()

    app = PalaestraAPI(
        title="palaestra",
        version=palaestra.__version__,
        lifespan=lifespan,
        description="Reset, step and verify over sandboxed task environments.",
    )

    @app.exception_handler(PalaestraError)
    async def palaestra_error(request: Request, exc: PalaestraError) -> JSONResponse:
        headers = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None
        return error_reply(exc.status or 500, exc.code, exc.message, exc.retryable, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_reply(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Starlette's own answers (unknown route, wrong method) in the contract's shape."""
        code, message = HTTP_ERRORS.get(exc.status_code, ("http_error", str(exc.detail)))
        where = f"{request.method} {request.url.path}"
        headers = dict(exc.headers) if exc.headers else None
        return error_reply(exc.status_code, code, message.format(where), False, headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_reply(500, "internal", f"internal error ({type(exc).__name__}); this is a bug")

    # in this order their routes match, and OpenAPI lists them
    app.include_router(episodes.router)
    app.include_router(catalog.router)
    app.include_router(publishing.router)
    app.include_router(heldout.router)  # held-out draws (server/draws.py)
    app.include_router(tokens.router)
    app.include_router(operations.router)
    app.include_router(mcp_http.router)
    app.include_router(harness_routes.router)
    app.include_router(group_routes.router)
    app.include_router(openenv.router)
    app.include_router(openenv_tasks.router)  # OpenEnv's Task API on the same door
    app.include_router(ors.router)  # at the root, after /v1: ORS's client joins absolute paths
    app.include_router(nemo_gym.router)  # at the root too, last: its `POST /{tool}` after all
    _complete_openapi(app, episodes.HAND_PARSED)
    return app
