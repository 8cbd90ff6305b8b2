"""The MCP streamable HTTP transport for one episode: `/v1/episodes/{episode_id}/mcp`.

Both eras of MCP, chosen per request. A POST of the stateless 2026-07-28 revision (its
`MCP-Protocol-Version` header names no handshake version, or its body carries the 2026
`_meta` envelope) is checked by server/doors/mcp_stateless.py and answered on the episode
the URL names, which the token must own on every request; no session is read or opened.
Every other POST is of the handshake revisions (2024-11-05..2025-11-25), as follows.

POST carries a JSON-RPC message or batch (answered by server/doors/mcp.py) and gets
application/json, or text/event-stream when the client accepts only that; notifications
and responses alone get 202. `initialize` opens a session (`Mcp-Session-Id`), which every
later request must name: a session is bound to the episode and the token that opened it,
and any other pairing is the 404 of an unknown session. `MCP-Protocol-Version` must name
a version served (400, -32022 otherwise) and the session's own. GET is 405 (no server-
initiated stream); DELETE ends the MCP session, never the episode. Auth is /v1's bearer
token (server/caller.py); its 401 comes in JSON-RPC's error shape.

No tenant slows or evicts another (issue 34): a token past `mcp_sessions_per_token` ends
only its own least recently used session, the server past `mcp_sessions_max` refuses a new
one (429) rather than end anyone's, and a batch longer than `jsonrpc_max_batch` is 413
(-32600) before it is parsed whole; a batch is parsed, run and encoded in slices that yield
to the event loop (server/doors/mcp.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import Response

from palaestra.sdk.errors import CapacityError, PalaestraError
from palaestra.sdk.models import Action, StepRequest, StepResponse, ToolSpec
from palaestra.server.auth import Principal
from palaestra.server.caller import manager_of, principal_of, services_of
from palaestra.server.doors import mcp, mcp_stateless

router = APIRouter(tags=["mcp"])

PATH = "/v1/episodes/{episode_id}/mcp"
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
JSON = "application/json"
SSE = "text/event-stream"
CHALLENGE = {"www-authenticate": 'Bearer realm="palaestra"'}


@dataclass
class Session:
    episode_id: str
    tools: list[ToolSpec]
    state: mcp.McpSession = field(default_factory=mcp.McpSession)
    last_used: float = field(default_factory=time.monotonic)


class Sessions:
    """This server's open MCP sessions, by token, least recently used first: a session idle
    for the episode TTL is gone, a token past its cap loses its own oldest, and past the
    server's cap (all tokens) a new session is refused: one token's sessions never end
    another's, and memory stays bounded however many tokens open them."""

    def __init__(self, per_token: int, ttl_s: float, limit: int) -> None:
        self.per_token = per_token
        self.ttl_s = ttl_s
        self.limit = limit
        self.count = 0
        self._by_owner: dict[str, OrderedDict[str, Session]] = {}

    def _mine(self, owner: str) -> OrderedDict[str, Session] | None:
        """The owner's sessions, those idle past the TTL gone (None: it holds none)."""
        mine = self._by_owner.get(owner)
        if mine is None:
            return None
        deadline = time.monotonic() - self.ttl_s
        while mine and next(iter(mine.values())).last_used < deadline:
            self._pop(owner, mine)
        return self._by_owner.get(owner)

    def _pop(self, owner: str, mine: OrderedDict[str, Session]) -> None:
        """End the owner's least recently used session (and forget an owner left empty)."""
        mine.popitem(last=False)
        self.count -= 1
        if not mine:
            del self._by_owner[owner]

    def open(self, owner: str, session: Session) -> str:
        """A new session's id; CapacityError (429) when the server holds `limit` sessions
        and this owner none to give up."""
        mine = self._mine(owner)
        if mine is not None and len(mine) >= self.per_token:
            while mine and len(mine) >= self.per_token:
                self._pop(owner, mine)
        elif self.count >= self.limit:
            for other in list(self._by_owner):
                self._mine(other)
            if self.count >= self.limit:
                raise CapacityError(
                    f"this server holds {self.limit} open MCP sessions (mcp_sessions_max); "
                    "retry later, or end sessions you no longer use (DELETE with their "
                    f"{SESSION_HEADER})",
                    retry_after=5,
                )
        session_id = uuid.uuid4().hex
        self._by_owner.setdefault(owner, OrderedDict())[session_id] = session
        self.count += 1
        return session_id

    def get(self, owner: str, session_id: str, episode_id: str) -> Session | None:
        """The owner's session `session_id` on `episode_id`; None for any other."""
        mine = self._mine(owner)
        session = mine.get(session_id) if mine is not None else None
        if mine is None or session is None or session.episode_id != episode_id:
            return None
        session.last_used = time.monotonic()
        mine.move_to_end(session_id)
        return session

    def close(self, owner: str, session_id: str, episode_id: str) -> bool:
        if self.get(owner, session_id, episode_id) is None:
            return False
        mine = self._by_owner[owner]
        mine.move_to_end(session_id, last=False)
        self._pop(owner, mine)
        return True


def sessions_of(request: Request) -> Sessions:
    """The app's MCP sessions (made on first use, from its settings)."""
    sessions: Sessions | None = getattr(request.app.state, "mcp_sessions", None)
    if sessions is None:
        settings = services_of(request).settings
        sessions = Sessions(
            settings.mcp_sessions_per_token, settings.idle_ttl_s, settings.mcp_sessions_max
        )
        request.app.state.mcp_sessions = sessions
    return sessions


def _reply(status: int, body: mcp.Reply, headers: dict[str, str] | None = None) -> Response:
    if body is None:
        return Response(status_code=status, headers=headers)
    return Response(json.dumps(body), status, headers=headers, media_type=JSON)


async def _replied(status: int, body: mcp.Reply, headers: dict[str, str], sse: bool) -> Response:
    """A handled request's reply: JSON, or SSE events (a batch's encoded in slices that
    yield to the event loop)."""
    if not sse:
        if body is None:
            return Response(status_code=status, headers=headers)
        return Response(await mcp.encode(body), status, headers=headers, media_type=JSON)
    events = []
    for index, message in enumerate(body if isinstance(body, list) else [body]):
        if index and index % mcp.YIELD_EVERY == 0:
            await asyncio.sleep(0)
        events.append(f"event: message\ndata: {json.dumps(message)}\n\n")
    return Response(
        "".join(events),
        status,
        headers={"cache-control": "no-cache", **headers},
        media_type=SSE,
    )


def _refused(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    return _reply(status, mcp.error_response(None, {"code": code, "message": message}), headers)


def _failed(exc: PalaestraError, message_id: object = None) -> Response:
    """A /v1 error (401, 403, 404, 429, ...) at the transport, in JSON-RPC's shape."""
    headers = dict(CHALLENGE) if exc.status == 401 else {}
    if exc.retry_after is not None:
        headers["retry-after"] = f"{exc.retry_after:g}"
    return _reply(
        exc.status or 500, mcp.error_response(message_id, mcp.episode_error(exc)), headers
    )


def _caller(request: Request) -> Principal | Response:
    """The caller, or the 401 to answer (before anything else is looked at)."""
    try:
        return principal_of(request)
    except PalaestraError as exc:
        return _failed(exc)


def _accepts_sse_only(accept: str) -> bool | None:
    """False: answer JSON; True: the client takes only SSE; None: it takes neither."""
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",") if part.strip()}
    if not kinds or kinds & {JSON, "application/*", "*/*"}:
        return False
    if kinds & {SSE, "text/*"}:
        return True
    return None


def _unsupported(request: Request) -> Response | None:
    """400 for an MCP-Protocol-Version not served (no header: the negotiated one)."""
    version = request.headers.get(VERSION_HEADER)
    if version is None or version in mcp.SUPPORTED_VERSIONS:
        return None
    return _reply(400, mcp.error_response(None, mcp.version_error(version)))


def _mismatched(request: Request, session: Session) -> Response | None:
    version = request.headers.get(VERSION_HEADER)
    negotiated = session.state.protocol_version
    if version is None or negotiated is None or version == negotiated:
        return None
    return _refused(
        400,
        mcp.INVALID_REQUEST,
        f"Bad Request: {VERSION_HEADER} {version} is not the version this session "
        f"negotiated ({negotiated})",
    )


def _session(request: Request, principal: Principal, episode_id: str) -> Session | Response:
    session_id = request.headers.get(SESSION_HEADER)
    if not session_id:
        return _refused(
            400,
            mcp.INVALID_REQUEST,
            f"Bad Request: no {SESSION_HEADER} header; send initialize first (its reply "
            "carries the session id)",
        )
    session = sessions_of(request).get(principal.token_id, session_id, episode_id)
    if session is None:
        return _refused(
            404, mcp.INVALID_REQUEST, "Session not found (ended or expired); initialize again"
        )
    return session


MESSAGES = {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}
BODY = {"requestBody": {"required": True, "content": {JSON: {"schema": MESSAGES}}}}


@router.post(PATH, openapi_extra=BODY)
async def mcp_messages(episode_id: str, request: Request) -> Response:
    """MCP messages for the episode's tools (tools/list, tools/call: one step each)."""
    principal = _caller(request)
    if isinstance(principal, Response):
        return principal
    sse = _accepts_sse_only(request.headers.get("accept", ""))
    if sse is None:
        return _refused(
            406, mcp.INVALID_REQUEST, f"Not Acceptable: accept {JSON} or {SSE} (or both)"
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != JSON:
        return _refused(
            415, mcp.INVALID_REQUEST, f"Unsupported Media Type: Content-Type must be {JSON}"
        )
    settings = services_of(request).settings
    try:
        message = await mcp.decode(await request.body(), settings.jsonrpc_max_batch)
    except mcp.RpcError as exc:
        refusal = mcp.error_response(None, exc.error)
        return _reply(mcp.status_of(refusal) or 400, refusal)
    if mcp_stateless.wanted(request.headers, message):
        return await _stateless(request, episode_id, principal, message, sse)
    headers: dict[str, str] = {}
    if mcp.is_initialize(message):
        try:
            session = Session(episode_id, await _tools(request, principal, episode_id))
        except PalaestraError as exc:
            return _failed(exc, message.get("id"))
    else:
        found = _session(request, principal, episode_id)
        if isinstance(found, Response):
            return found
        session = found
        if (refused := _mismatched(request, session)) is not None:
            return refused

    episode = _episode(request, principal, episode_id, session.tools)
    reply = await mcp.handle(message, episode, session.state, settings.jsonrpc_max_batch)
    if mcp.is_initialize(message) and session.state.protocol_version is not None:
        try:
            session_id = sessions_of(request).open(principal.token_id, session)
        except PalaestraError as exc:
            return _failed(exc, message.get("id"))
        headers = {SESSION_HEADER: session_id}
    if reply is None:
        return Response(status_code=202, headers=headers)
    failed = isinstance(reply, dict) and reply.get("id") is None
    status = (mcp.status_of(reply) or 400) if failed else 200
    return await _replied(status, reply, headers, sse=sse and status == 200)


async def _tools(request: Request, principal: Principal, episode_id: str) -> list[ToolSpec]:
    """The tools of the caller's episode `episode_id`: 404 for an unknown id and for another
    token's episode alike (the held episode's own, else its stored state's family's)."""
    manager = manager_of(request)
    held, _ = await manager.owned(principal, episode_id)
    if held is not None:
        return held.family.tool_specs()
    state = await manager.state(episode_id, principal)
    return services_of(request).families.get(state.family).tool_specs()


def _episode(
    request: Request, principal: Principal, episode_id: str, tools: list[ToolSpec]
) -> mcp.McpEpisode:
    """The episode as the MCP core sees it: its tools, each tools/call a step of it."""
    manager = manager_of(request)

    async def step(action: Action) -> StepResponse:
        return await manager.step(episode_id, StepRequest(action=action), principal)

    return mcp.McpEpisode(tools, step)


async def _stateless(
    request: Request, episode_id: str, principal: Principal, message: object, sse: bool
) -> Response:
    """A 2026-07-28 request: the ladder (server/doors/mcp_stateless.py), then the answer on
    the caller's episode `episode_id`, looked up afresh; no session is read or opened."""
    refused = mcp_stateless.refusal(request.headers.raw, message)
    if refused is not None:
        return _reply(mcp_stateless.status(refused), refused)
    assert isinstance(message, dict)  # the ladder refuses anything but one message
    if "id" not in message:
        return Response(status_code=202)
    try:
        tools = await _tools(request, principal, episode_id)
    except PalaestraError as exc:
        return _failed(exc, message.get("id"))
    episode = _episode(request, principal, episode_id, tools)
    reply = await mcp.handle(message, episode, mcp.McpSession(stateless=True))
    assert isinstance(reply, dict)  # one request: one response
    status = mcp_stateless.status(reply)
    headers: dict[str, str] = {}
    retry_after = reply.get("error", {}).get("data", {}).get("retry_after")
    if isinstance(retry_after, (int, float)):
        headers["retry-after"] = f"{retry_after:g}"
    return await _replied(status, reply, headers, sse=sse and status == 200)


@router.get(PATH)
async def mcp_stream(episode_id: str, request: Request) -> Response:
    """405: this server sends no requests or notifications of its own (no GET stream)."""
    if isinstance(refused := _caller(request), Response):
        return refused
    return _refused(
        405,
        mcp.INVALID_REQUEST,
        "Method Not Allowed: no server-initiated stream here; POST messages",
        {"allow": "POST, DELETE"},
    )


@router.delete(PATH)
async def mcp_end_session(episode_id: str, request: Request) -> Response:
    """End the MCP session (the episode goes on: DELETE /v1/episodes/{id} closes that)."""
    principal = _caller(request)
    if isinstance(principal, Response):
        return principal
    if request.headers.get(VERSION_HEADER) in mcp.MODERN_VERSIONS:
        return _refused(
            405,
            mcp.INVALID_REQUEST,
            "Method Not Allowed: 2026-07-28 has no sessions to end; POST requests",
            {"allow": "POST"},
        )
    refused = _unsupported(request)
    found = refused or _session(request, principal, episode_id)
    if isinstance(found, Response):
        return found
    session_id = request.headers.get(SESSION_HEADER, "")
    sessions_of(request).close(principal.token_id, session_id, episode_id)
    return Response(status_code=200)
