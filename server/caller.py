"""Who is calling, and the front and services that serve them: one answer for the app's
routes and for every compatibility door (server/doors/), so auth works the same through each."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from palaestra.server import guards, ws_auth
from palaestra.server.auth import Principal
from palaestra.server.fastpath import PRINCIPAL_KEY
from palaestra.server.manager import EpisodeManager
from palaestra.server.services import Services


def manager_of(request: HTTPConnection) -> EpisodeManager:
    """The front: episodes (reset, step, verify, state, close) and detached work."""
    manager: EpisodeManager = request.app.state.manager
    return manager


def services_of(request: HTTPConnection) -> Services:
    """The server's shared parts: settings, store, catalog, families, tenancy, sessions."""
    services: Services = request.app.state.manager.services
    return services


def principal_of(request: HTTPConnection, header: str | None = None) -> Principal:
    """The caller: checked by StepFastPath in front; checked here when mounted bare (or
    from `header`, a credential a door's protocol carries elsewhere)."""
    principal: Principal | None = request.scope.get(PRINCIPAL_KEY)
    if principal is None:
        auth = services_of(request).auth
        principal = auth.from_value(header or request.headers.get("authorization"))
        request.scope[PRINCIPAL_KEY] = principal
        guards.trust(request.scope)  # a door's own auth: the connection is a tenant's
    return principal


def ws_principal(websocket: HTTPConnection) -> Principal:
    """A WebSocket's caller: the token of its handshake's header, `bearer.<token>`
    subprotocol or query (server/ws_auth.py); checked as a header's is."""
    return principal_of(websocket, ws_auth.credential(websocket.scope))
