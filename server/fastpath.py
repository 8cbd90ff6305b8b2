"""The step route as a plain ASGI middleware: the trainer's hot path, without the framework.

`POST /v1/episodes/{id}/step` is most of a training run's traffic (and the batch routes,
`POST /v1/batch/reset` and `/v1/batch/step`, are the rest of a trainer's hot path). Served through
FastAPI, a no-op step spends more CPU in routing, request objects and dependency
solving than in the episode manager. This middleware answers that one route itself
(body bytes → pydantic-core → manager → pre-serialized JSON) and hands every other
request to the app. server/app.py's `PalaestraAPI` runs it ahead of FastAPI's whole
stack (its middleware and telemetry check), not inside it. The FastAPI route of the same
path stays, for OpenAPI and for callers that mount its routers bare, and both call
`step_reply`, so they cannot drift.

It is also the front door of authentication: every `/v1` request is checked here (the
bearer token → principal lookup is cached in memory, so a step pays a dict lookup), a
401 is answered here, and the principal travels to the routes in the ASGI scope
(`scope["palaestra.principal"]`); routes check the scope they need (DESIGN §3).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import Any, NamedTuple

from pydantic import ValidationError
from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.models import StepRequest
from palaestra.server import batch, guards, ws_auth
from palaestra.server.auth import Principal
from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.services import Services

log = logging.getLogger("palaestra.server")

STEP_PATH = re.compile(r"^/v1/episodes/([^/]+)/step$")
PUBLISH_PATH = "/v1/packs"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_HEADERS = [(b"content-type", b"application/json")]
PRINCIPAL_KEY = "palaestra.principal"
CHALLENGE = [(b"www-authenticate", b'Bearer realm="palaestra"')]
# Doors under /v1 whose protocol shapes its own 401 (server/doors/mcp_http.py): their
# routes authenticate first thing, through server/caller.py.
OWN_AUTH_PATH = re.compile(r"^/v1/episodes/[^/]+/mcp$")


def error_body(code: str, message: str, retryable: bool = False) -> bytes:
    body = {"error": {"code": code, "message": message, "retryable": retryable}}
    return json.dumps(body).encode()


def validation_message(errors: list[Any]) -> str:
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "malformed request: " + "; ".join(parts)


Reply = tuple[int, bytes, list[tuple[bytes, bytes]]]  # status, body, extra headers


class HotRoute(NamedTuple):
    """A request of the trainer's hot path: a step (`episode_id`) or a batch call (`path`)."""

    path: str
    episode_id: str | None


def hot_route(method: str, path: str) -> HotRoute | None:
    """The hot route `method path` names, if any (both front doors decide with this)."""
    if method != "POST":
        return None
    match = STEP_PATH.match(path)
    if match is not None:
        return HotRoute(path, match[1])
    return HotRoute(path, None) if path in batch.ROUTES else None


def authenticate(services: Services, headers: list[tuple[bytes, bytes]]) -> Principal | Reply:
    """The caller's principal, or the 401 to answer."""
    try:
        return services.auth.from_headers(headers)
    except PalaestraError as exc:
        return exc.status, error_body(exc.code, exc.message, exc.retryable), CHALLENGE


async def hot_reply(
    manager: EpisodeManager, route: HotRoute, principal: Principal, raw: bytes
) -> Reply:
    """The answer to a hot request whose body is `raw`, errors included."""
    try:
        await guards.vet_json(raw, manager.services.settings)
    except PalaestraError as exc:
        return exc.status, error_body(exc.code, exc.message), []
    if route.episode_id is not None:
        return await step_reply(manager, route.episode_id, raw, principal)
    return await batch_reply(route.path, manager, raw, principal)


async def batch_reply(
    path: str, manager: EpisodeManager, raw: bytes, principal: Principal
) -> Reply:
    """Status, body and headers of a batch route: 200 with per-item results and errors,
    or one error when the envelope itself is malformed."""
    try:
        return 200, await batch.ROUTES[path](manager, raw, principal), []
    except PalaestraError as exc:
        return exc.status or 500, error_body(exc.code, exc.message, exc.retryable), []
    except Exception as exc:
        log.exception("unhandled error in %s", path)
        return 500, error_body("internal", f"internal error ({type(exc).__name__}); a bug"), []


async def step_reply(
    manager: EpisodeManager, episode_id: str, raw: bytes, principal: Principal
) -> Reply:
    """Status, body and extra headers of a step request, errors included."""
    try:
        request = StepRequest.model_validate_json(raw)
        reply = await manager.step(episode_id, request, principal)
        return 200, to_json(reply), []  # its model_dump_json, without the Python around it
    except ValidationError as exc:
        return 422, error_body("invalid_request", validation_message(exc.errors())), []
    except PalaestraError as exc:
        headers = []
        if exc.retry_after is not None:
            headers.append((b"retry-after", f"{exc.retry_after:g}".encode()))
        return exc.status or 500, error_body(exc.code, exc.message, exc.retryable), headers
    except Exception as exc:
        log.exception("unhandled error stepping %s", episode_id)
        return 500, error_body("internal", f"internal error ({type(exc).__name__}); a bug"), []


class StepFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            ws_auth.lift(scope)  # a WebSocket's query token, out of the scope uvicorn logs
            await self.app(scope, receive, send)
            return
        try:
            onward = await self._front(scope, receive, send)
        except Exception as exc:  # a bug (or the token table gone): the contract's 500
            log.exception("unhandled error in front of %s", scope["path"])
            body = error_body("internal", f"internal error ({type(exc).__name__}); a bug")
            with contextlib.suppress(Exception):  # an answer already begun: it stays cut
                await _respond(send, 500, body, [])
            return
        if onward is not None:
            await self.app(scope, onward, send)

    async def _front(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Answer the request here (None), or the `receive` to hand it on with."""
        manager: EpisodeManager = scope["app"].state.manager
        services = manager.services
        settings = services.settings
        publish = scope["method"] == "POST" and scope["path"] == PUBLISH_PATH
        limit = settings.max_pack_bytes if publish else settings.max_body_bytes
        declared = guards.declared_length(scope["headers"])
        if declared is not None and declared > limit:  # refused before a byte is read
            message = (
                guards.too_large(limit, "a pack archive", "max_pack_bytes")
                if publish
                else guards.too_large(limit)
            )
            await _respond(send, 413, error_body("too_large", message), [])
            return None
        path = scope["path"]
        if path.startswith("/v1/") and not (path.endswith("/mcp") and OWN_AUTH_PATH.match(path)):
            principal = authenticate(services, scope["headers"])
            if not isinstance(principal, Principal):
                await _respond(send, *principal)
                return None
            guards.trust(scope)  # the connection is a tenant's now, not a stranger's
            route = hot_route(scope["method"], path)
            if route is not None:
                await self._hot(manager, route, principal, receive, send)
                return None
            scope[PRINCIPAL_KEY] = principal
        if not publish and scope["method"] in BODY_METHODS:
            # Read (bounded) and vetted here, then handed to the app as if unread: FastAPI's
            # own `json.loads` would raise RecursionError (a 500) on a deep enough body.
            raw = await _vetted(settings, receive, send)
            if raw is None:
                return None
            return guards.replay(raw, receive)
        return receive

    async def _hot(
        self,
        manager: EpisodeManager,
        route: HotRoute,
        principal: Principal,
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            raw = await guards.read_body(receive, manager.services.settings.max_body_bytes)
        except PalaestraError as exc:
            await _respond(send, exc.status, error_body(exc.code, exc.message), [])
            return
        if raw is not None:
            await _respond(send, *await hot_reply(manager, route, principal, raw))


async def _vetted(settings: Settings, receive: Receive, send: Send) -> bytes | None:
    """The body, at most max_body_bytes, max_json_depth deep and max_json_values values;
    None: answered."""
    try:
        raw = await guards.read_body(receive, settings.max_body_bytes)
        if raw is not None:
            await guards.vet_json(raw, settings)
        return raw
    except PalaestraError as exc:
        await _respond(send, exc.status, error_body(exc.code, exc.message), [])
        return None


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    length = [(b"content-length", str(len(body)).encode())]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": JSON_HEADERS + length + headers,
        }
    )
    await send({"type": "http.response.body", "body": body})
