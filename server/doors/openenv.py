"""OpenEnv's protocol (as the `openenv` 0.10.0 `EnvClient` and its reference server speak
it) over palaestra episodes, for any pack: `/openenv/{org}/{name}/…` (the pack name's
slash is a path segment of its own, as in `/v1/packs/{org}/{name}`).

`WS /ws` is OpenEnv's session: the connection owns one episode at a time (a `reset` frame
closes the one before; leaving closes it). The HTTP routes are stateless, as OpenEnv's
are: `POST /reset` returns the episode id in `metadata.episode_id`, and `POST /step` and
`GET /state` name it (`episode_id` in the body, or the query), as `POST /mcp?episode_id=`
does. MCP (the endpoint and the `mcp` frame) is the shared core, server/doors/mcp.py.
The token travels as EnvClient's `headers={"Authorization": "Bearer …"}`; a client that
sends no headers (openenv-core's, a browser's) puts it in the WebSocket URL's user info,
query or a `bearer.<token>` subprotocol (server/ws_auth.py). OpenEnv's `MCPToolClient`
steps with `list_tools` / `call_tool` actions, answered in its observation shapes. Every
check is the episode manager's, so ownership, sealed splits, scopes and quotas are what
/v1 has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from palaestra.sdk.errors import (
    BadRequestError,
    ConflictError,
    InvalidActionError,
    PalaestraError,
    TooLargeError,
)
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    Observation,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
    ToolSpec,
)
from palaestra.server import guards, ws_auth
from palaestra.server.auth import Principal
from palaestra.server.caller import manager_of, principal_of, services_of, ws_principal
from palaestra.server.doors import mcp
from palaestra.server.doors.openenv_tasks import reset_by_index
from palaestra.server.fastpath import PRINCIPAL_KEY, validation_message
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.catalog import REF_RE
from palaestra.server.services import Services

router = APIRouter(prefix="/openenv/{org}/{name}", tags=["openenv"])

RESET_KEYS = frozenset({"task", "seed", "episode_id", "split", "index", "domain", "options"})
STEP_KEYS = frozenset({"action", "episode_id", "request_id"})
# OpenEnv's WSErrorCode values (openenv.core.env_server.types).
INVALID_JSON, UNKNOWN_TYPE = "INVALID_JSON", "UNKNOWN_TYPE"
VALIDATION_ERROR, EXECUTION_ERROR = "VALIDATION_ERROR", "EXECUTION_ERROR"
CAPACITY_REACHED, SESSION_ERROR = "CAPACITY_REACHED", "SESSION_ERROR"
WS_CODES = {
    400: VALIDATION_ERROR,
    422: VALIDATION_ERROR,
    413: VALIDATION_ERROR,
    429: CAPACITY_REACHED,
    401: SESSION_ERROR,
    403: SESSION_ERROR,
}
POLICY_VIOLATION = 1008  # the WebSocket close code after a refused session
NORMAL_CLOSURE = 1000  # after a session idle for idle_ttl_s
CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is 125 bytes, code included


def reset_request(pack: str, kwargs: dict[str, Any]) -> ResetRequest:
    """OpenEnv's reset kwargs as our reset: `task` is a task id of this pack (or its full
    `org/name[@ver]:id`), with `seed`, `episode_id`, `split`, `domain` and `options`
    (`split` and `index`, the Task API's selection, are resolved before: openenv_tasks.py)."""
    unknown = sorted(set(kwargs) - RESET_KEYS)
    if unknown:
        raise BadRequestError(
            f"unknown reset argument(s) {', '.join(unknown)}; "
            f"this door takes {', '.join(sorted(RESET_KEYS))}"
        )
    fields = dict(kwargs)
    task = fields.pop("task", None)
    if task is not None:
        if not isinstance(task, str) or not task:
            raise BadRequestError("reset argument task must be a task id of pack " + pack)
        full, door = REF_RE.match(task), REF_RE.match(f"{pack}:-")
        pinned = door["version"] if door else None  # a door at `org/name@ver` serves that one
        if full and (
            not door
            or full["pack"] != door["pack"]
            or (pinned and full["version"] not in (None, pinned))
        ):
            raise BadRequestError(f"task {task!r} is not in pack {pack} (this door's pack)")
        fields["task"] = task if full else f"{pack}:{task}"
    else:
        fields["pack"] = pack
    try:
        return ResetRequest.model_validate(fields)
    except ValidationError as exc:
        raise BadRequestError(validation_message(list(exc.errors()))) from exc


def is_call_tool(data: Any) -> bool:
    """OpenEnv's `CallToolAction` (what `MCPToolClient.call_tool` steps with)."""
    return isinstance(data, dict) and data.get("type") == "call_tool"


def is_list_tools(data: Any) -> bool:
    """OpenEnv's `ListToolsAction` (`MCPToolClient.list_tools`): answered, never a step."""
    return isinstance(data, dict) and data.get("type") == "list_tools"


def action_of(data: Any) -> Action:
    """OpenEnv's action as our tool call: `{"tool", "arguments"}` as it is, or OpenEnv's
    own `CallToolAction` (`{"type": "call_tool", "tool_name", "arguments"}`)."""
    if is_call_tool(data):
        data = {"tool": data.get("tool_name"), "arguments": data.get("arguments", {})}
    try:
        return Action.model_validate(data)
    except ValidationError as exc:
        raise InvalidActionError(
            'an action is {"tool": name, "arguments": {...}} (or OpenEnv\'s call_tool); '
            + validation_message(list(exc.errors()))
        ) from exc


def reset_payload(reply: ResetResponse) -> dict[str, Any]:
    """OpenEnv's ResetResponse: observation, reward, done, metadata."""
    return {
        "observation": reply.observation.model_dump(mode="json"),
        "reward": None,
        "done": False,
        "metadata": {
            "episode_id": reply.episode_id,
            "tools": [tool.model_dump(mode="json") for tool in reply.tools],
            "limits": reply.limits.model_dump(mode="json"),
            "info": reply.info,
        },
    }


def step_payload(episode_id: str, reply: StepResponse) -> dict[str, Any]:
    """OpenEnv's StepResponse: `done` is terminated or truncated (both kept in metadata)."""
    return {
        "observation": reply.observation.model_dump(mode="json"),
        "reward": reply.reward,
        "done": reply.terminated or reply.truncated,
        "metadata": {
            "episode_id": episode_id,
            "terminated": reply.terminated,
            "truncated": reply.truncated,
            "failure": reply.info.get("failure"),  # on the last step (sdk/failures.py)
            "info": reply.info,
        },
    }


def state_payload(state: EpisodeState) -> dict[str, Any]:
    """OpenEnv's State (`episode_id`, `step_count`, extra fields allowed): ours as it is."""
    return state.model_dump(mode="json")


def list_tools_payload(tools: list[ToolSpec]) -> dict[str, Any]:
    """OpenEnv's `ListToolsObservation`, as its `MCPToolClient` parses it."""
    listed = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
    return {"observation": {"tools": listed, "metadata": {}}, "reward": None, "done": False}


def call_tool_result(name: str, observation: Observation) -> dict[str, Any]:
    """The fields of OpenEnv's `CallToolObservation` beside ours: `result` is FastMCP's
    CallToolResult (its `data`, which `MCPToolClient.call_tool` returns, is the text)."""
    text = observation.text
    result = {
        "content": [{"type": "text", "text": text}],
        "structured_content": observation.data or None,
        "data": text,
        "is_error": False,
    }
    return {"tool_name": name, "result": result, "error": None}


def call_tool_refused(name: str, tools: list[ToolSpec], exc: InvalidActionError) -> dict[str, Any]:
    """A refused call_tool as OpenEnv's `ToolError` (no step was taken)."""
    known = any(t.name == name for t in tools)
    error = {"error_type": "invalid_args" if known else "tool_not_found", "message": exc.message}
    observation = {"tool_name": name, "result": None, "error": error, "metadata": {}}
    return {"observation": observation, "reward": None, "done": False}


def mcp_episode(
    manager: EpisodeManager, principal: Principal, episode_id: str, tools: list[ToolSpec]
) -> mcp.McpEpisode:
    """One episode's tools for the MCP core (server/doors/mcp.py): each tools/call a step."""

    async def act(action: Action) -> StepResponse:
        return await manager.step(episode_id, StepRequest(action=action), principal)

    return mcp.McpEpisode(tools, act)


def http_error(exc: PalaestraError) -> JSONResponse:
    """OpenEnv's HTTP error shape (FastAPI's `{"detail": …}`) with our status and code."""
    headers = {}
    if exc.status == 401:
        headers["www-authenticate"] = 'Bearer realm="palaestra"'
    if exc.retry_after is not None:
        headers["retry-after"] = f"{exc.retry_after:g}"
    body = {"detail": exc.message, "code": exc.code, "retryable": exc.retryable}
    return JSONResponse(body, status_code=exc.status or 500, headers=headers)


def ws_error(exc: PalaestraError) -> dict[str, Any]:
    """OpenEnv's WSErrorResponse; `status` and `error` carry our HTTP status and code."""
    code = WS_CODES.get(exc.status or 500, EXECUTION_ERROR)
    return frame_error(exc.message, code, status=exc.status, error=exc.code)


def frame_error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequestError(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    return body


def episode_of(value: Any, route: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequestError(
            f"{route} over HTTP needs episode_id (the one POST /reset returned in "
            "metadata.episode_id); WS /ws keeps it for you"
        )
    return value


async def step(
    manager: EpisodeManager,
    principal: Principal,
    episode_id: str,
    body: dict[str, Any],
    tools: list[ToolSpec] | None = None,
) -> dict[str, Any]:
    """One step; a `call_tool` action is answered as OpenEnv's `CallToolObservation` (and
    refused as its `ToolError` when `tools`, the episode's, are known)."""
    data = body.get("action")
    try:
        action = action_of(data)
        request = StepRequest(action=action, request_id=body.get("request_id"))
        reply = await manager.step(episode_id, request, principal)
    except ValidationError as exc:
        raise BadRequestError(validation_message(list(exc.errors()))) from exc
    except InvalidActionError as exc:
        if tools is None or not isinstance(data, dict) or not is_call_tool(data):
            raise
        return call_tool_refused(str(data.get("tool_name")), tools, exc)
    payload = step_payload(episode_id, reply)
    if is_call_tool(data):
        payload["observation"].update(call_tool_result(action.tool, reply.observation))
    return payload


@router.post("/reset")
async def http_reset(org: str, name: str, request: Request) -> JSONResponse:
    try:
        principal = principal_of(request)
        pack, body = f"{org}/{name}", await json_body(request)
        ask = reset_request(pack, reset_by_index(services_of(request).catalog, pack, body))
        return JSONResponse(reset_payload(await manager_of(request).reset(ask, principal)))
    except PalaestraError as exc:
        return http_error(exc)


@router.post("/step")
async def http_step(org: str, name: str, request: Request) -> JSONResponse:
    try:
        principal = principal_of(request)
        body = await json_body(request)
        unknown = sorted(set(body) - STEP_KEYS)
        if unknown:
            raise BadRequestError(
                f"unknown step field(s) {', '.join(unknown)}; this door takes "
                f"{', '.join(sorted(STEP_KEYS))} (limits come from the task)"
            )
        episode_id = episode_of(body.get("episode_id"), "POST /step")
        return JSONResponse(await step(manager_of(request), principal, episode_id, body))
    except PalaestraError as exc:
        return http_error(exc)


@router.get("/state")
async def http_state(
    org: str, name: str, request: Request, episode_id: str | None = None
) -> JSONResponse:
    try:
        principal = principal_of(request)
        state = await manager_of(request).state(episode_of(episode_id, "GET /state"), principal)
        return JSONResponse(state_payload(state))
    except PalaestraError as exc:
        return http_error(exc)


@router.get("/schema")
async def http_schema(org: str, name: str, request: Request) -> JSONResponse:
    try:
        principal_of(request)
    except PalaestraError as exc:
        return http_error(exc)
    return JSONResponse(
        {
            "action": Action.model_json_schema(),
            "observation": Observation.model_json_schema(),
            "state": EpisodeState.model_json_schema(),
        }
    )


@router.get("/metadata")
async def http_metadata(org: str, name: str, request: Request) -> JSONResponse:
    """OpenEnv's EnvironmentMetadata from the pack's own card."""
    try:
        principal_of(request)
        pack = services_of(request).catalog.pack_info(f"{org}/{name}")
    except PalaestraError as exc:
        return http_error(exc)
    return JSONResponse(
        {
            "name": pack.name,
            "description": pack.description,
            "readme_content": None,
            "version": pack.version,
            "author": pack.name.split("/", 1)[0],
            "documentation_url": None,
        }
    )


@router.get("/health")
async def http_health(org: str, name: str) -> JSONResponse:
    return JSONResponse({"status": "healthy"})


@router.post("/mcp")
async def http_mcp(
    org: str, name: str, request: Request, episode_id: str | None = None
) -> Response:
    """MCP JSON-RPC for the episode `episode_id` names (a fresh MCP session each request)."""
    try:
        principal = principal_of(request)
        manager = manager_of(request)
        held = episode_of(episode_id, "POST /mcp")
        state = await manager.state(held, principal)  # 404 for another token's episode
        tools = services_of(request).families.get(state.family).tool_specs()
    except PalaestraError as exc:
        return http_error(exc)
    episode = mcp_episode(manager, principal, held, tools)
    limit = services_of(request).settings.jsonrpc_max_batch
    reply = await mcp.handle_bytes(await request.body(), episode, mcp.McpSession(), limit)
    if reply is None:
        return Response(status_code=202)
    # JSONResponse's encoding, a batch's in slices that yield to the event loop.
    body = await mcp.encode(reply, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body, mcp.status_of(reply) or 200, media_type="application/json")


class Session:
    """One WebSocket connection's episode (at most one at a time)."""

    def __init__(
        self, manager: EpisodeManager, services: Services, principal: Principal, pack: str
    ) -> None:
        self.manager, self.services = manager, services
        self.principal, self.pack = principal, pack
        self.episode_id: str | None = None
        self.tools: list[ToolSpec] = []
        self.mcp = mcp.McpSession()

    async def end(self) -> None:
        if self.episode_id is not None:
            episode_id, self.episode_id = self.episode_id, None
            with contextlib.suppress(PalaestraError):
                await self.manager.close(episode_id, self.principal)

    async def frame(self, raw: str) -> dict[str, Any] | None:
        """The answer to one frame; None: the client closed the session."""
        settings = self.services.settings
        if len(raw) > settings.max_body_bytes:
            return ws_error(TooLargeError(guards.too_large(settings.max_body_bytes, "a frame")))
        try:
            await guards.vet_json(raw.encode(), settings)
            message = json.loads(raw)
        except (ValueError, PalaestraError) as exc:
            return frame_error(f"Invalid JSON: {exc}", INVALID_JSON)
        kind = message.get("type") if isinstance(message, dict) else None
        data = message.get("data", {}) if isinstance(message, dict) else None
        try:
            if kind == "close":
                return None
            if not isinstance(data, dict):
                raise BadRequestError(f"the data of a {kind!r} frame must be a JSON object")
            if kind == "reset":
                picked = reset_by_index(self.services.catalog, self.pack, data)
                ask = reset_request(self.pack, picked)
                await self.end()
                reply = await self.manager.reset(ask, self.principal)
                self.episode_id, self.tools = reply.episode_id, reply.tools
                self.mcp = mcp.McpSession()
                return {"type": "observation", "data": reset_payload(reply)}
            if kind == "step" and is_list_tools(data):
                tools = self.tools if self.episode_id else self.pack_tools()
                return {"type": "observation", "data": list_tools_payload(tools)}
            if kind == "step":
                body = {"action": data}
                stepped = await step(*self.held(), body, self.tools)
                return {"type": "observation", "data": stepped}
            if kind == "state":
                if self.episode_id is None:  # as OpenEnv's state before any reset
                    return {"type": "state", "data": {"episode_id": None, "step_count": 0}}
                state = await self.manager.state(self.episode_id, self.principal)
                return {"type": "state", "data": state_payload(state)}
            if kind == "mcp":
                episode = mcp_episode(*self.held(), self.tools)
                limit = settings.jsonrpc_max_batch
                answer = await mcp.handle(data, episode, self.mcp, limit)
                return {"type": "mcp", "data": {} if answer is None else answer}
        except PalaestraError as exc:
            return ws_error(exc)
        message = f"Unknown message type: {kind}; send reset, step, state, mcp or close"
        return frame_error(message, UNKNOWN_TYPE)

    def pack_tools(self) -> list[ToolSpec]:
        """Before any reset: the tools of this pack's families (OpenEnv lists tools
        without an episode)."""
        tools: dict[str, ToolSpec] = {}
        for family in self.services.catalog.pack_info(self.pack).families:
            for tool in self.services.families.get(family).tool_specs():
                tools.setdefault(tool.name, tool)
        return list(tools.values())

    def held(self) -> tuple[EpisodeManager, Principal, str]:
        if self.episode_id is None:
            raise ConflictError(
                "no episode on this connection: send a reset frame first", code="no_episode"
            )
        return self.manager, self.principal, self.episode_id


def close_reason(exc: PalaestraError) -> str:
    """The close frame's reason (at most 123 bytes): a client that sends before it reads
    (openenv-core's) sees only the close, so it says why too."""
    reason = f"{exc.code}: {exc.message}".encode()[:CLOSE_REASON_BYTES]
    return reason.decode(errors="ignore")


async def refuse(websocket: WebSocket, exc: PalaestraError) -> None:
    """OpenEnv's refused session: an error frame, then the close (with the reason)."""
    await websocket.send_text(json.dumps(ws_error(exc)))
    await websocket.close(code=POLICY_VIOLATION, reason=close_reason(exc))


@router.websocket("/ws")
async def ws(websocket: WebSocket, org: str, name: str) -> None:
    await websocket.accept(subprotocol=ws_auth.subprotocol(websocket.scope))
    try:
        principal = ws_principal(websocket)
    except PalaestraError as exc:
        await refuse(websocket, exc)
        return
    session = Session(manager_of(websocket), services_of(websocket), principal, f"{org}/{name}")
    idle_s = session.services.settings.idle_ttl_s
    try:
        while True:
            try:  # a session lives while it is used: idle as long as its episode may be, no more
                async with asyncio.timeout(idle_s):
                    raw = await websocket.receive_text()
            except TimeoutError:
                reason = f"idle: no frame for {idle_s:g} s (idle_ttl_s)"
                await websocket.close(code=NORMAL_CLOSURE, reason=reason)
                return
            try:  # each frame, as each /v1 request: a token revoked meanwhile ends the session
                websocket.scope.pop(PRINCIPAL_KEY, None)
                session.principal = ws_principal(websocket)
            except PalaestraError as exc:
                await refuse(websocket, exc)
                return
            reply = await session.frame(raw)
            if reply is None:
                break
            await websocket.send_text(json.dumps(reply))
    except WebSocketDisconnect:
        pass
    finally:
        await session.end()
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close()
