"""NeMo Gym's resources-server protocol (`nemo-gym` 0.7.0, `nemo_gym.base_resources_server`)
over palaestra's episodes: NeMo Gym's Environment Server seeds a session, its agent calls
the session's tools, the Environment Server verifies and closes it.

| NeMo Gym                     | palaestra                                            |
| ---------------------------- | ---------------------------------------------------- |
| `POST /seed_session`         | reset (the task from `task_id`/`task_data`)          |
| `POST /{tool}` (direct HTTP) | a step of that tool; the body is its arguments       |
| `POST /verify`               | the verdict: reward, `mask_sample` (void), its kind  |
| `POST /close_session`        | close                                                |
| `POST /aggregate_metrics`    | the batch's mean reward (masked samples out), counts |

NeMo Gym's `ServerClient` joins paths onto `http://host:port`, so the routes sit at the
server's root, after palaestra's and the ORS door's own (a tool named like one of those
routes is reached through MCP instead: the seed's `resources_tools` names the episode's
`/v1/episodes/{id}/mcp`). The seed reply sets the session cookie NeMo Gym's Environment
Server requires; the cookie names the episode, and every call also carries the token
(`Authorization: Bearer`, or `X-API-Key`), so a cookie is worth nothing to another token.

Sessions follow NeMo Gym's contract (`nemo_gym.testing.session_conformance`): a repeated
seed of the same `resources_session_id` and episode returns the session, a seed naming
another episode or task is 409, close is idempotent and answers 200 for a session never
seeded, and a seed after a close is refused (409). A session belongs to its token: another
token's id is one it never seeded (its close is a no-op, its cookie 404). Errors are
NeMo Gym's (FastAPI's) shape, `{"detail": "..."}`. Open sessions per token are capped by
`ors_sessions_per_token` and all of them by `ors_sessions_max` (429 past either, never the
end of another session); closed ids are remembered, boundedly, to refuse late seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from palaestra.sdk.errors import (
    BadRequestError,
    CapacityError,
    ConflictError,
    NotFoundError,
    PalaestraError,
)
from palaestra.sdk.failures import FailureKind, nemo_gym_name
from palaestra.sdk.models import (
    Action,
    Observation,
    ResetRequest,
    StepRequest,
    StepResponse,
    ToolSpec,
    Verdict,
)
from palaestra.server.auth import Principal
from palaestra.server.caller import manager_of, principal_of, services_of
from palaestra.server.fastpath import validation_message

VERSION = "0.7.0"  # the nemo-gym release whose protocol this door speaks (and is tested with)
COOKIE = "palaestra_nemo_gym"
CLOSED_KEPT = 4  # closed ids remembered per token, as a multiple of its open-session cap

router = APIRouter(tags=["nemo-gym"])
Handler = Callable[..., Awaitable[Any]]


# -- the wire (nemo_gym.episode_types / base_resources_server) ---------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EpisodeId(_Wire):
    rollout_id: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)


class TaskId(_Wire):
    taskset: str = Field(min_length=1, max_length=256)
    task_id: str = Field(min_length=1, max_length=512)


class SeedRequest(_Wire):
    """`ResourcesSeedSessionRequest`. `task_data` may name the task (`task`: a palaestra
    ref), a `seed` and reset `options`; by default the task is `taskset:task_id`."""

    resources_session_id: str = Field(min_length=1, max_length=256)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, JsonValue]


class MCPServerMetadata(_Wire):
    server_name: str
    url_path: str = "/mcp"
    transport: str = "http"
    headers: dict[str, str] = Field(default_factory=dict)


class SeedResponse(_Wire):
    resources_session_id: str
    resources_tools: MCPServerMetadata | None = None


class CloseRequest(_Wire):
    resources_session_id: str = Field(min_length=1, max_length=256)
    episode_id: EpisodeId


class CloseResponse(_Wire):
    resources_session_id: str


class VerifyRequest(BaseModel):
    """`BaseVerifyRequest` as the Environment Server sends it: the task's data, the request
    and the agent's response, flat. palaestra reads none of it: the episode is the record."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, JsonValue] | None = None
    response: dict[str, JsonValue] | None = None


class AggregateRequest(BaseModel):
    """`AggregateMetricsRequest`: the verify responses of a batch of rollouts."""

    verify_responses: list[dict[str, Any]] = Field(max_length=1_000_000)


class AggregateMetrics(_Wire):
    """NeMo Gym's `AggregateMetrics`: flat keys, masked samples out of every mean."""

    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)
    repeat_level_metrics: list[dict[str, Any]] = Field(default_factory=list)


class ToolReply(_Wire):
    """A tool's output (model-visible text first) and the step's outcome."""

    output: str
    images: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = Field(default_factory=dict)


class SessionView(_Wire):
    """`POST /nemo_gym/session`: what the seed reply has no field for (NeMo Gym takes the
    prompt from its dataset row): the first observation and the tools, OpenAI's shape."""

    resources_session_id: str
    episode_id: str
    observation: Observation
    tools: list[dict[str, Any]]


# -- sessions ------------------------------------------------------------------------------


@dataclass
class Session:
    """One seeded session: who seeded it (for repeated seeds), its episode once reset."""

    seed: SeedRequest
    opened: asyncio.Future[tuple[str, Observation, list[ToolSpec]]]
    closed: bool = False
    last_used: float = field(default_factory=time.monotonic)


class Sessions:
    """This app's NeMo Gym sessions by owner and `resources_session_id`, open and closed
    (the episodes themselves, and who may reach them, stay with the manager). Closed ids are
    kept, boundedly, so a late seed of one is refused. Kept on `app.state`."""

    def __init__(self, per_token: int, limit: int, ttl_s: float) -> None:
        self.per_token, self.limit, self.ttl_s = per_token, limit, ttl_s
        self.total = 0  # open sessions, all owners
        self._open: dict[str, OrderedDict[str, Session]] = {}
        self._closed: dict[str, OrderedDict[str, Session | None]] = {}
        self._by_episode: dict[tuple[str, str], str] = {}  # (owner, episode id) -> session id

    def _opens(self, owner: str) -> OrderedDict[str, Session]:
        return self._open.setdefault(owner, OrderedDict())

    def _closeds(self, owner: str) -> OrderedDict[str, Session | None]:
        return self._closed.setdefault(owner, OrderedDict())

    def _sweep(self, owners: list[str]) -> None:
        """Close the sessions idle past the TTL (the reaper has ended their episodes)."""
        deadline = time.monotonic() - self.ttl_s
        for owner in owners:
            idle = [k for k, s in self._opens(owner).items() if s.last_used < deadline]
            for sid in idle:
                self.close(owner, sid)

    def claim(self, owner: str, seed: SeedRequest) -> tuple[Session, bool]:
        """The session `seed` names: the one held (False) or a new one (True); 409 for a
        closed id or another episode's, 429 past a cap."""
        sid = seed.resources_session_id
        if sid in self._closeds(owner):
            raise ConflictError(
                f"resources session {sid!r} is closed: a seed after close never opens it "
                "again (seed a new resources_session_id)",
                code="session_closed",
            )
        mine = self._opens(owner)
        held = mine.get(sid)
        if held is not None:
            if (held.seed.episode_id, held.seed.task_id, held.seed.task_data) != (
                seed.episode_id,
                seed.task_id,
                seed.task_data,
            ):
                raise ConflictError(
                    f"resources session {sid!r} is already seeded for another episode or task",
                    code="session_conflict",
                )
            held.last_used = time.monotonic()
            return held, False
        if len(mine) >= self.per_token:
            self._sweep([owner])
            if len(mine) >= self.per_token:
                raise CapacityError(
                    f"this token holds {self.per_token} open NeMo Gym sessions "
                    "(ors_sessions_per_token); close some (POST /close_session)",
                    retry_after=1,
                )
        if self.total >= self.limit:
            self._sweep(list(self._open))
            if self.total >= self.limit:
                raise CapacityError(
                    f"this server holds {self.limit} open sessions (ors_sessions_max); retry later",
                    retry_after=5,
                )
        new = Session(seed, asyncio.get_running_loop().create_future())
        mine[sid] = new
        self.total += 1
        return new, True

    def opened(self, owner: str, sid: str, episode_id: str) -> None:
        self._by_episode[(owner, episode_id)] = sid

    def drop(self, owner: str, sid: str) -> None:
        """Forget an open session whose seed failed (a closed one stays closed)."""
        if self._opens(owner).pop(sid, None) is not None:
            self.total -= 1

    def close(self, owner: str, sid: str) -> Session | None:
        """Mark `sid` closed (remembered even if never seeded); the session it was, if any."""
        held = self._opens(owner).pop(sid, None)
        closed = self._closeds(owner)
        if held is not None:
            self.total -= 1
            held.closed = True
        else:
            held = closed.get(sid)
        closed[sid] = held
        closed.move_to_end(sid)
        while len(closed) > CLOSED_KEPT * self.per_token:
            _, gone = closed.popitem(last=False)
            episode = None if gone is None else episode_of(gone)
            if episode is not None:
                self._by_episode.pop((owner, episode), None)
        return held

    def seeded(self, owner: str, sid: str) -> Session | None:
        """The open session `sid` names, if any."""
        return self._opens(owner).get(sid)

    def by_cookie(self, owner: str, episode_id: str | None) -> tuple[str, Session]:
        """The caller's session (open or closed) its cookie names: 404 for none, an unknown
        one, another token's alike."""
        sid = self._by_episode.get((owner, episode_id or ""))
        held = None
        if sid is not None:
            held = self._opens(owner).get(sid) or self._closeds(owner).get(sid)
        if sid is None or held is None:
            raise NotFoundError(
                "no NeMo Gym session of this token is named by the request's session cookie "
                f"({COOKIE}); POST /seed_session first and send its cookie"
            )
        held.last_used = time.monotonic()
        return sid, held


def episode_of(session: Session) -> str | None:
    """The session's episode id; None while it opens, or when it never opened."""
    opened = session.opened
    if not opened.done() or opened.cancelled() or opened.exception() is not None:
        return None
    return opened.result()[0]


def sessions_of(request: Request) -> Sessions:
    state = request.app.state
    found: Sessions | None = getattr(state, "nemo_gym_sessions", None)
    if found is None:
        settings = services_of(request).settings
        found = state.nemo_gym_sessions = Sessions(
            settings.ors_sessions_per_token, settings.ors_sessions_max, settings.idle_ttl_s
        )
    return found


# -- plumbing ------------------------------------------------------------------------------


def detail(status: int, message: str) -> JSONResponse:
    """NeMo Gym's (FastAPI's) error shape."""
    return JSONResponse({"detail": message}, status_code=status)


def nemo(handler: Handler) -> Handler:
    """palaestra's errors and bad bodies in NeMo Gym's error shape."""

    @wraps(handler)
    async def route(request: Request, **params: Any) -> Response:
        try:
            answer = await handler(request, **params)
        except PalaestraError as exc:
            refusal = detail(exc.status, exc.message)
            if exc.retry_after is not None:
                refusal.headers["Retry-After"] = f"{exc.retry_after:g}"
            return refusal
        except ValidationError as exc:
            return detail(422, validation_message(list(exc.errors())))
        if isinstance(answer, Response):
            return answer
        return JSONResponse(
            answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer
        )

    return route


def caller(request: Request) -> Principal:
    key = request.headers.get("x-api-key")
    return principal_of(request, f"Bearer {key.strip()}" if key else None)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def body(request: Request) -> Any:
    """The JSON body; `NaN`/`Infinity` (which Python's parser takes) are refused: no reply
    could carry them back (a 500 where a 400 belongs)."""
    try:
        return json.loads(await request.body() or b"{}", parse_constant=_no_constant)
    except ValueError:
        raise BadRequestError("the request body is not JSON") from None


def task_of(seed: SeedRequest) -> str:
    named = seed.task_data.get("task")
    if isinstance(named, str) and named:
        return named
    if ":" in seed.task_id.task_id:
        return seed.task_id.task_id
    return f"{seed.task_id.taskset}:{seed.task_id.task_id}"


def reset_of(seed: SeedRequest) -> ResetRequest:
    seed_value = seed.task_data.get("seed")
    options = seed.task_data.get("options")
    if seed_value is not None and not isinstance(seed_value, int):
        raise BadRequestError("task_data.seed must be an integer")
    if options is not None and not isinstance(options, dict):
        raise BadRequestError("task_data.options must be an object")
    return ResetRequest(task=task_of(seed), seed=seed_value, options=options or {})


def failure_kind(verdict: Verdict) -> str | None:
    """NeMo Gym's name for the verdict's failure kind (namespaced where it has none)."""
    if verdict.failure_kind is None:
        return None
    shared = nemo_gym_name(verdict.failure_kind)
    if shared is None and verdict.status == "ok":
        return None  # a scored 0: NeMo Gym reports no failure
    return shared or f"palaestra:{FailureKind(verdict.failure_kind).value}"


TASK_INDEX = "_ng_task_index"  # NeMo Gym's key for a row's task in a batch


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean reward of the rows not masked (a void episode is no measurement), and counts."""
    scored = [r for r in rows if not r.get("mask_sample")]
    rewards = [x for r in scored if (x := _reward(r.get("reward"))) is not None]
    out: dict[str, Any] = {
        "mean/reward": sum(rewards) / len(rewards) if rewards else None,
        "num_samples": len(rows),
        "num_masked": len(rows) - len(scored),
    }
    kinds = Counter(str(r["failure_kind"]) for r in rows if r.get("failure_kind"))
    out.update((f"failure_kind/{kind}", n) for kind, n in sorted(kinds.items()))
    return out


def _reward(value: Any) -> float | None:
    """A row's reward as a finite float; None for none, or an integer past float's range
    (`float(10**400)` raises: a 500 where the row is only not counted)."""
    if not isinstance(value, int | float):
        return None
    try:
        reward = float(value)
    except OverflowError:
        return None
    return reward if math.isfinite(reward) else None


def aggregate(rows: list[dict[str, Any]]) -> AggregateMetrics:
    by_task: dict[Any, list[dict[str, Any]]] = {}
    for n, row in enumerate(rows):
        if not isinstance(row.get(TASK_INDEX), int | str | None):  # a list or object: no key
            raise BadRequestError(f"verify_responses[{n}].{TASK_INDEX}: an integer or a string")
        by_task.setdefault(row.get(TASK_INDEX), []).append(row)
    groups = [{TASK_INDEX: task, **summary(of)} for task, of in by_task.items() if task is not None]
    overall = summary(rows)
    return AggregateMetrics(
        group_level_metrics=groups,
        agent_metrics=overall,
        key_metrics={"mean/reward": overall["mean/reward"]},
    )


def tool_json(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "name": t.name, "description": t.description,
         "parameters": t.parameters, "strict": False}
        for t in tools
    ]  # fmt: skip


# -- routes --------------------------------------------------------------------------------


@router.post("/seed_session")
@nemo
async def seed_session(request: Request) -> Any:
    principal = caller(request)
    seed = SeedRequest.model_validate(await body(request))
    sessions = sessions_of(request)
    held, new = sessions.claim(principal.token_id, seed)
    if new:
        try:
            reset = await manager_of(request).reset(reset_of(seed), principal)
        except BaseException as exc:
            sessions.drop(principal.token_id, seed.resources_session_id)
            cancelled = ConflictError("the seed that was opening this session was cancelled")
            held.opened.set_exception(exc if isinstance(exc, Exception) else cancelled)
            held.opened.exception()  # seen: a waiting repeat re-raises it
            raise
        held.opened.set_result((reset.episode_id, reset.observation, reset.tools))
        sessions.opened(principal.token_id, seed.resources_session_id, reset.episode_id)
        if held.closed:  # closed while it opened: its episode goes too
            await manager_of(request).close(reset.episode_id, principal)
    episode_id, _, _ = await asyncio.shield(held.opened)
    pack = task_of(seed).partition(":")[0].partition("@")[0]
    reply = JSONResponse(
        SeedResponse(
            resources_session_id=seed.resources_session_id,
            resources_tools=MCPServerMetadata(
                server_name=pack.replace("/", "-") or "palaestra",
                url_path=f"/v1/episodes/{episode_id}/mcp",
            ),
        ).model_dump(mode="json")
    )
    reply.set_cookie(COOKIE, episode_id, httponly=True, samesite="strict")
    return reply


@router.post("/close_session")
@nemo
async def close_session(request: Request) -> Any:
    principal = caller(request)
    asked = CloseRequest.model_validate(await body(request))
    sessions = sessions_of(request)
    held = sessions.seeded(principal.token_id, asked.resources_session_id)
    if held is not None and held.seed.episode_id != asked.episode_id:
        raise ConflictError(
            f"resources session {asked.resources_session_id!r} was seeded for another episode",
            code="session_conflict",
        )
    held = sessions.close(principal.token_id, asked.resources_session_id)
    episode_id = None if held is None else episode_of(held)
    if episode_id is not None:
        with contextlib.suppress(NotFoundError):  # expired and reaped: closed all the same
            await manager_of(request).close(episode_id, principal)
    reply = JSONResponse(
        CloseResponse(resources_session_id=asked.resources_session_id).model_dump(mode="json")
    )
    reply.delete_cookie(COOKIE)
    return reply


@router.post("/verify")
@nemo
async def verify(request: Request) -> Any:
    principal = caller(request)
    asked = VerifyRequest.model_validate(await body(request))
    _, held = sessions_of(request).by_cookie(principal.token_id, request.cookies.get(COOKIE))
    episode_id = held.opened.result()[0]
    verdict = await manager_of(request).verify(episode_id, principal)
    kind = failure_kind(verdict)
    return {
        **asked.model_dump(mode="json", exclude_unset=True),
        "reward": verdict.reward,
        "mask_sample": verdict.status == "void",
        "failure_kind": kind,
        "failure_reason": (
            f"{verdict.failure_kind}" + (f": {verdict.failure}" if verdict.failure else "")
            if verdict.failure_kind is not None
            else None
        ),
        "palaestra": {"episode_id": episode_id, "status": verdict.status, "passed": verdict.passed},
    }


@router.post("/aggregate_metrics")
@nemo
async def aggregate_metrics(request: Request) -> Any:
    caller(request)
    return aggregate(AggregateRequest.model_validate(await body(request)).verify_responses)


@router.post("/nemo_gym/session")
@nemo
async def session_view(request: Request) -> Any:
    principal = caller(request)
    sid, held = sessions_of(request).by_cookie(principal.token_id, request.cookies.get(COOKIE))
    episode_id, observation, tools = held.opened.result()
    return SessionView(
        resources_session_id=sid,
        episode_id=episode_id,
        observation=observation,
        tools=tool_json(tools),
    )


def unrouted(request: Request) -> StarletteHTTPException:
    """What the framework answers a request no other route takes, as if `/{tool}` were not
    there: 405 where a route of another method has the path, else 404 (this door's own
    routers match `/{tool}` fully, never partly)."""
    for other in request.app.router.routes:
        if other.matches(request.scope)[0] is Match.PARTIAL:
            return StarletteHTTPException(405)
    return StarletteHTTPException(404)


OTHER_METHODS = ["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/{tool}", methods=OTHER_METHODS, include_in_schema=False)
async def not_a_tool(request: Request, tool: str) -> Response:
    """A tool is called by POST: any other method at the root is what it was before this
    door (the contract's 404, or 405 where another route has the path)."""
    raise unrouted(request)


@router.post("/{tool}")
@nemo
async def call_tool(request: Request, tool: str) -> Any:
    """A tool of the session the cookie names (direct HTTP tool access). Without the cookie
    this is no route of NeMo Gym's: the contract's 404, as for any unknown route."""
    if COOKIE not in request.cookies:
        raise unrouted(request)
    principal = caller(request)
    _, held = sessions_of(request).by_cookie(principal.token_id, request.cookies[COOKIE])
    arguments = await body(request)
    if not isinstance(arguments, dict):
        raise BadRequestError("a tool's body is its arguments, a JSON object")
    step = StepRequest(
        action=Action(tool=tool, arguments=arguments),
        request_id=request.headers.get("x-request-id") or None,
    )
    reply: StepResponse = await manager_of(request).step(held.opened.result()[0], step, principal)
    return ToolReply(
        output=reply.observation.text,
        images=reply.observation.images,
        data=reply.observation.data,
        reward=reply.reward,
        terminated=reply.terminated,
        truncated=reply.truncated,
        info=reply.info,
    )
