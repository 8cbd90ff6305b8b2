"""The Open Reward Standard door: ORS's routes (as the `ors-sdk` client calls them) over
palaestra's episodes. An ORS environment is a pack (`org/name`), a session is an episode
whose id is the session id, a tool call is a step (answered as ORS's SSE stream) and the
verdict is the submit call's reward.

The client joins absolute paths onto its base URL, so the routes sit at the server's root
(`/create_session`, `/{org}/{name}/splits`, ...). Every route takes the token as ORS sends
it (`X-API-Key`, or `Authorization: Bearer`) and answers errors in ORS's shape,
`{"detail": "..."}`.

Sessions belong to their token (issue 34): a token past `ors_sessions_per_token` ends only
its own least recently used session, and the server past `ors_sessions_max` refuses a new
one (429) rather than end another token's."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from palaestra.sdk.client import TaskQuery
from palaestra.sdk.errors import BadRequestError, CapacityError, NotFoundError, PalaestraError
from palaestra.sdk.models import (
    Action,
    Observation,
    ResetRequest,
    StepRequest,
    StepResponse,
    TaskInfo,
    ToolSpec,
)
from palaestra.server.auth import Principal
from palaestra.server.caller import manager_of, principal_of, services_of
from palaestra.server.catalog import Catalog
from palaestra.server.fastpath import validation_message

SUPPORTED = "0.1"  # the ORS protocol (ors-sdk major.minor) this door speaks
AGENT = re.compile(r"\bors-sdk/(\d+)\.(\d+)")
HEARTBEAT_S = 10.0  # the client drops a stream silent for 30 s
SPLIT_TYPES = {"train": "train", "validation": "validation", "test": "test"}
MAX_TASKS = 10_000

router = APIRouter(tags=["ors"])
Handler = Callable[..., Awaitable[Any]]
Asked = TypeVar("Asked", bound="SplitBody")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SplitBody(_Body):
    split: str


class TaskBody(SplitBody):
    index: int


class RangeBody(SplitBody):
    start: int | None = None
    stop: int | None = None


class CreateBody(_Body):
    env_name: str | None = None
    task_spec: dict[str, Any] | None = None
    split: str | None = None
    index: int | None = None
    secrets: dict[str, str] | None = None


class CallBody(_Body):
    name: str
    input: dict[str, Any]
    task_id: str | None = None


@dataclass(frozen=True)
class Opened:
    """What a session's reset showed: ORS asks for the prompt and tools later."""

    observation: Observation
    tools: list[ToolSpec]


@dataclass
class Held:
    """One open session: its reset view, and when it was last used."""

    opened: Opened
    last_used: float = field(default_factory=time.monotonic)


class Sessions:
    """The reset views of this app's ORS sessions, by owner, least recently used first (the
    episode itself, and who may reach it, stay with the manager).

    Capacity is per owner: an owner past `per_token` ends its own least recently used, never
    another's. The whole is bounded too: a session idle for the TTL is gone, and past `limit`
    (all owners, sessions being opened included) a new one is refused (429) rather than
    another owner's ended. `claim` holds a place before the episode starts (no flood of
    concurrent creates slips past the caps); `put` fills it, `release` gives it back."""

    def __init__(self, per_token: int, limit: int, ttl_s: float) -> None:
        self.per_token = per_token
        self.limit = limit
        self.ttl_s = ttl_s
        self.count = 0  # sessions held, all owners
        self.pending: dict[str, int] = {}  # places claimed, by owner
        self._by_owner: dict[str, OrderedDict[str, Held]] = {}

    def _mine(self, owner: str) -> OrderedDict[str, Held] | None:
        """The owner's sessions, those idle past the TTL gone (None: it holds none)."""
        mine = self._by_owner.get(owner)
        if mine is None:
            return None
        deadline = time.monotonic() - self.ttl_s
        while mine and next(iter(mine.values())).last_used < deadline:
            self._pop(owner, mine)
        return self._by_owner.get(owner)

    def _pop(self, owner: str, mine: OrderedDict[str, Held], sid: str | None = None) -> None:
        """End the owner's session `sid` (its least recently used by default)."""
        if sid is None:
            mine.popitem(last=False)
        else:
            del mine[sid]
        self.count -= 1
        if not mine:
            del self._by_owner[owner]

    def claim(self, owner: str) -> None:
        """Hold a place for the owner's new session, ending its own least recently used
        when it is at its cap; CapacityError (429) when it cannot have one now."""
        mine = self._mine(owner)
        held, claimed = len(mine or ()), self.pending.get(owner, 0)
        if claimed >= self.per_token:
            raise CapacityError(
                f"this token is opening {claimed} ORS sessions at once "
                f"(ors_sessions_per_token); wait for them before opening more",
                retry_after=1,
            )
        ended_own = False
        while mine and held + claimed >= self.per_token:
            self._pop(owner, mine)
            held, ended_own = held - 1, True
        if not ended_own and self.count + sum(self.pending.values()) >= self.limit:
            for other in list(self._by_owner):  # the idle first
                self._mine(other)
            if self.count + sum(self.pending.values()) >= self.limit:
                raise CapacityError(
                    f"this server holds {self.limit} open ORS sessions (ors_sessions_max); "
                    "retry later, and end sessions you are done with (POST /delete)",
                    retry_after=5,
                )
        self.pending[owner] = claimed + 1

    def release(self, owner: str) -> None:
        """Give back a place `claim` held (its session was not opened)."""
        left = self.pending.get(owner, 0) - 1
        if left > 0:
            self.pending[owner] = left
        else:
            self.pending.pop(owner, None)

    def put(self, owner: str, sid: str, opened: Opened) -> None:
        """Open the session in the place `claim` held."""
        self.release(owner)
        mine = self._by_owner.setdefault(owner, OrderedDict())
        if sid in mine:
            self._pop(owner, mine, sid)
            mine = self._by_owner.setdefault(owner, OrderedDict())
        mine[sid] = Held(opened)
        self.count += 1

    def get(self, owner: str, sid: str) -> Opened | None:
        mine = self._mine(owner)
        held = mine.get(sid) if mine is not None else None
        if mine is None or held is None:
            return None
        held.last_used = time.monotonic()
        mine.move_to_end(sid)
        return held.opened

    def drop(self, owner: str, sid: str) -> None:
        mine = self._by_owner.get(owner)
        if mine is not None and sid in mine:
            self._pop(owner, mine, sid)


def sessions_of(request: Request) -> Sessions:
    state = request.app.state
    found: Sessions | None = getattr(state, "ors_sessions", None)
    if found is None:
        settings = services_of(request).settings
        found = state.ors_sessions = Sessions(
            settings.ors_sessions_per_token, settings.ors_sessions_max, settings.idle_ttl_s
        )
    return found


def detail(status: int, message: str) -> JSONResponse:
    """ORS's (FastAPI's) error shape."""
    return JSONResponse({"detail": message}, status_code=status)


def version_error(request: Request) -> JSONResponse | None:
    found = AGENT.search(request.headers.get("user-agent", ""))
    if found is None or f"{found[1]}.{found[2]}" == SUPPORTED:
        return None
    return detail(
        400,
        f"ORS protocol version {found[1]}.{found[2]} (ors-sdk) is not supported: this server "
        f"speaks ORS {SUPPORTED} (ors-sdk {SUPPORTED}.x); use an ors-sdk {SUPPORTED} client",
    )


def ors(handler: Handler) -> Handler:
    """Version check first; palaestra's errors and bad bodies in ORS's error shape."""

    @wraps(handler)
    async def route(request: Request, **params: Any) -> Response:
        refused = version_error(request)
        if refused is not None:
            return refused
        try:
            answer = await handler(request, **params)
        except PalaestraError as exc:
            refusal = detail(exc.status, exc.message)
            if exc.retry_after is not None:
                refusal.headers["Retry-After"] = f"{exc.retry_after:g}"
            return refusal
        except ValidationError as exc:
            return detail(422, validation_message(list(exc.errors())))
        return answer if isinstance(answer, Response) else JSONResponse(answer)

    return route


RESERVED = frozenset({"v1", "openenv"})  # palaestra's own prefixes: never an ORS environment


def environment(org: str, name: str) -> str:
    """The pack a route's `/{org}/{name}/…` names. Paths under palaestra's own prefixes are
    not ORS's: they get the contract's 404, as any unknown route does."""
    if org in RESERVED:
        raise StarletteHTTPException(404)
    return f"{org}/{name}"


def caller(request: Request) -> Principal:
    key = request.headers.get("x-api-key")
    return principal_of(request, f"Bearer {key.strip()}" if key else None)


def sid_of(request: Request) -> str:
    sid = (request.headers.get("x-session-id") or "").strip()
    if not sid:
        raise BadRequestError("the X-Session-ID header is required (POST /create_session)")
    return sid


async def body(request: Request) -> Any:
    """The JSON body (validated by the caller: a bad one is ORS's 422 `detail`)."""
    try:
        return json.loads(await request.body() or b"{}")
    except ValueError:
        raise BadRequestError("the request body is not JSON") from None


def split_type(name: str, sealed: bool) -> str:
    return "test" if sealed else SPLIT_TYPES.get(name, "validation")


def split_size(catalog: Catalog, env: str, split: str) -> tuple[str, int]:
    """The pack version the answer is about (pinned, so counts and listings agree) and how
    many tasks `split` holds."""
    pack = catalog.pack_info(env)
    for found in pack.splits:
        if found.name == split:
            return f"{pack.name}@{pack.version}", found.tasks
    names = ", ".join(s.name for s in pack.splits)
    raise BadRequestError(f"environment {env!r} has no split {split!r} (it has: {names})")


def env_tasks(
    catalog: Catalog, env: str, split: str, start: int = 0, stop: int | None = None
) -> Callable[[], list[TaskInfo]]:
    """The public view of `env`'s tasks [start, stop) in `split` (a sealed split: ids and
    public fields), as a Python slice of the split, read when called (`encoded` calls it on
    a worker thread). At most MAX_TASKS an answer: a larger one is refused (now) naming
    task_range, never cut short."""
    pinned, total = split_size(catalog, env, split)
    first, last, _ = slice(start, stop).indices(total)
    if last - first > MAX_TASKS:
        raise BadRequestError(
            f"split {split!r} has {total} tasks and one answer lists at most {MAX_TASKS}: ask "
            f"task_range in pages (start, start + {MAX_TASKS}, …) up to num_tasks"
        )
    query = TaskQuery(pack=pinned, split=split, limit=max(last - first, 1), offset=first)
    return lambda: catalog.task_list(query).tasks if last > first else []


def nth(catalog: Catalog, env: str, split: str, index: int) -> TaskInfo:
    _, total = split_size(catalog, env, split)
    if not 0 <= index < total:
        raise BadRequestError(f"index {index} is outside split {split!r} (0..{total - 1})")
    return env_tasks(catalog, env, split, index, index + 1)()[0]


def task_view(task: TaskInfo) -> dict[str, Any]:
    return task.model_dump(mode="json")


async def encoded(build: Callable[[], dict[str, Any]]) -> Response:
    """`build()` as JSON, read, built and encoded on a worker thread, a list one item at a
    time (one `json.dumps` of megabytes holds the GIL, so the loop, throughout): a page of
    MAX_TASKS tasks held the event loop (every other tenant's steps) 0.2-0.5 s a request.
    `build` reads one pack's tasks, which never change once the pack is loaded."""

    def dumps(value: Any) -> str:
        if isinstance(value, list):
            return "[" + ",".join(map(dumps, value)) + "]"
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def run() -> bytes:
        fields = (f"{dumps(key)}:{dumps(value)}" for key, value in build().items())
        return ("{" + ",".join(fields) + "}").encode()

    return Response(await asyncio.to_thread(run), media_type="application/json")


def tool_view(tools: list[ToolSpec]) -> dict[str, Any]:
    return {
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in tools
        ]
    }


def blocks(observation: Observation) -> list[dict[str, Any]]:
    """ORS content blocks: the text, then each image (PNG, base64)."""
    out: list[dict[str, Any]] = [{"type": "text", "text": observation.text, "detail": None}]
    out += [
        {"type": "image", "data": image, "mimeType": "image/png", "detail": None}
        for image in observation.images
    ]
    return out


def tool_output(reply: StepResponse) -> dict[str, Any]:
    """ORS's RunToolSuccess: the step's reward (the verdict's on the last step); its
    metadata is the step's info (the failure, sdk/failures.py, on the last step)."""
    metadata = dict(reply.info)
    if reply.observation.data:
        metadata["data"] = reply.observation.data
    return {
        "ok": True,
        "output": {
            "blocks": blocks(reply.observation),
            "metadata": metadata,
            "reward": reply.reward,
            "finished": reply.terminated or reply.truncated,
        },
    }


def sse(event: str, data: str) -> bytes:
    return f"event: {event}\r\ndata: {data}\r\n\r\n".encode()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- discovery ----------------------------------------------------------------------------


@router.get("/list_environments")
@ors
async def list_environments(request: Request) -> Any:
    caller(request)
    return [p.name for p in services_of(request).catalog.pack_infos()]


@router.get("/{org}/{name}/splits")
@ors
async def list_splits(request: Request, env: str = Depends(environment)) -> Any:
    caller(request)
    pack = services_of(request).catalog.pack_info(env)
    return [{"name": s.name, "type": split_type(s.name, s.sealed)} for s in pack.splits]


async def asked_tasks(request: Request, model: type[Asked]) -> tuple[Asked, Catalog]:
    """The body of a task query, and the catalog that answers it."""
    caller(request)
    return model.model_validate(await body(request)), services_of(request).catalog


@router.post("/{org}/{name}/tasks")
@ors
async def list_tasks(request: Request, env: str = Depends(environment)) -> Any:
    asked, catalog = await asked_tasks(request, SplitBody)
    tasks = env_tasks(catalog, env, asked.split)
    return await encoded(lambda: {"tasks": [task_view(t) for t in tasks()], "env_name": env})


@router.post("/{org}/{name}/num_tasks")
@ors
async def num_tasks(request: Request, env: str = Depends(environment)) -> Any:
    asked, catalog = await asked_tasks(request, SplitBody)
    return {"num_tasks": split_size(catalog, env, asked.split)[1]}


@router.post("/{org}/{name}/task")
@ors
async def get_task(request: Request, env: str = Depends(environment)) -> Any:
    asked, catalog = await asked_tasks(request, TaskBody)
    return {"task": task_view(nth(catalog, env, asked.split, asked.index))}


@router.post("/{org}/{name}/task_range")
@ors
async def get_task_range(request: Request, env: str = Depends(environment)) -> Any:
    asked, catalog = await asked_tasks(request, RangeBody)
    tasks = env_tasks(catalog, env, asked.split, asked.start or 0, asked.stop)
    return await encoded(lambda: {"tasks": [task_view(t) for t in tasks()]})


@router.get("/{org}/{name}/tools")
@ors
async def list_tools(request: Request, env: str = Depends(environment)) -> Any:
    caller(request)
    catalog = services_of(request).catalog
    families = set(catalog.pack_info(env).families)
    tools: dict[str, ToolSpec] = {}
    for family in catalog.family_infos():
        if family.name in families:
            tools.update((t.name, t) for t in family.tools)
    return tool_view(list(tools.values()))


# -- sessions -----------------------------------------------------------------------------


@router.post("/create_session")
@ors
async def create_session(request: Request) -> Any:
    caller(request)
    sid = uuid.uuid4().hex

    async def stream() -> AsyncIterator[bytes]:
        yield sse("task_id", sid)
        yield sse("end", "")

    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/create")
@ors
async def create(request: Request) -> Any:
    principal = caller(request)
    sid = sid_of(request)
    asked = CreateBody.model_validate(await body(request))
    manager = manager_of(request)
    if asked.secrets:
        raise BadRequestError("secrets are not taken: palaestra tasks carry no credentials")
    if asked.task_spec is not None:
        # Only the id is read: a client-sent spec never stands in for the pack's task.
        task = asked.task_spec.get("id")
        if not isinstance(task, str) or not task:
            raise BadRequestError("task_spec.id is required: a task as listed by /tasks")
        if asked.env_name and not task.startswith((f"{asked.env_name}@", f"{asked.env_name}:")):
            raise BadRequestError(f"task {task!r} is not in environment {asked.env_name!r}")
    elif asked.env_name and asked.split is not None and asked.index is not None:
        task = nth(services_of(request).catalog, asked.env_name, asked.split, asked.index).id
    else:
        raise BadRequestError(
            "this server serves many environments and split/index name none: open the "
            "session with a task from POST /{env}/tasks (env.session(task=...))"
        )
    sessions = sessions_of(request)
    sessions.claim(principal.token_id)  # 429 before an episode starts, never another's end
    try:
        reset = await manager.reset(ResetRequest(task=task, episode_id=sid), principal)
    except BaseException:
        sessions.release(principal.token_id)
        raise
    sessions.put(principal.token_id, sid, Opened(reset.observation, reset.tools))
    return {"sid": sid}


async def opened(request: Request) -> tuple[Principal, str, Opened]:
    """The caller's session: 404 for an unknown id and for another token's alike."""
    principal = caller(request)
    sid = sid_of(request)
    try:
        await manager_of(request).state(sid, principal)  # the manager's ownership check
    except NotFoundError:
        sessions_of(request).drop(principal.token_id, sid)  # its episode is gone
        raise
    found = sessions_of(request).get(principal.token_id, sid)
    if found is None:
        raise NotFoundError(f"session {sid!r} is not open on this server (POST /create)")
    return principal, sid, found


@router.post("/ping")
@ors
async def ping(request: Request) -> Any:
    await opened(request)
    return {"status": "ok"}


@router.get("/{org}/{name}/task_tools")
@ors
async def task_tools(request: Request, env: str = Depends(environment)) -> Any:
    return tool_view((await opened(request))[2].tools)


@router.get("/{org}/{name}/prompt")
@ors
async def prompt(request: Request, env: str = Depends(environment)) -> Any:
    return blocks((await opened(request))[2].observation)


@router.post("/{org}/{name}/call")
@ors
async def call(request: Request, env: str = Depends(environment)) -> Any:
    principal, sid, _ = await opened(request)
    asked = CallBody.model_validate(await body(request))
    manager = manager_of(request)
    # The call's id is the step's request id: a resumed stream replays, never re-runs.
    call_id = asked.task_id or uuid.uuid4().hex
    step = StepRequest(action=Action(tool=asked.name, arguments=asked.input), request_id=call_id)
    manager.may_detach(principal)  # a dropped stream's step runs on, counted
    work = asyncio.ensure_future(manager.step(sid, step, principal))
    manager.detach(work, principal.token_id)
    work.add_done_callback(lambda done: done.cancelled() or done.exception())  # seen, if dropped

    async def stream() -> AsyncIterator[bytes]:
        yield sse("task_id", call_id)
        while True:
            done, _ = await asyncio.wait({work}, timeout=HEARTBEAT_S)
            if done:
                break
            yield b": ping\r\n\r\n"
        try:
            answer: dict[str, Any] = tool_output(work.result())
        except PalaestraError as exc:  # the tool's failure, as ORS reports one
            answer = {"ok": False, "error": exc.message}
        yield sse("end", json.dumps(answer, separators=(",", ":")))

    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/delete")
@ors
async def delete(request: Request) -> Any:
    principal, sid, _ = await opened(request)
    await manager_of(request).close(sid, principal)
    sessions_of(request).drop(principal.token_id, sid)
    return {"sid": sid}


@router.post("/delete_session")
@ors
async def delete_session(request: Request) -> Any:
    principal = caller(request)
    sid = sid_of(request)
    sessions_of(request).drop(principal.token_id, sid)
    return {"sid": sid}
