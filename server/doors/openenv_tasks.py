"""OpenEnv's Task API (openenv 0.10.0's `TaskProvider`, served by its `HTTPEnvServer` as
`/list_environments` and `/{env_name}/splits|tasks|num_tasks|task|task_range`) on the
OpenEnv door: `/openenv/{org}/{name}/…`, the environment being the pack.

The environment's name is the pack's `name` (OpenEnv matches it case-insensitively); the
`harbor_env` that openenv's own Task API client (`openenv.harbor.client.HarborEnv`) always
asks for names the same environment, so that client reads any pack as it is. A split is the
pack's split, a task its task in the order `/v1/tasks` lists it, and a task is selected
as OpenEnv selects one: `reset(split=…, index=…)` (`reset_by_index`).

Held-out tasks never leak: every answer is discovery's public view (DESIGN §3, a sealed
split's private fields never leave the server), and a token without the `eval` scope, which
may not start a sealed task, sees a sealed task's reference only (no public fields, no
instruction). Ranges are Python slices as OpenEnv's are, at most `MAX_TASKS` tasks an
answer: a bigger range is refused, naming the paging to do instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from palaestra.sdk.client import TaskQuery
from palaestra.sdk.errors import BadRequestError, NotFoundError, PalaestraError
from palaestra.sdk.models import PackInfo, SplitInfo, TaskInfo
from palaestra.server.auth import EVAL, Principal
from palaestra.server.caller import principal_of, services_of
from palaestra.server.catalog import Catalog
from palaestra.server.doors.ors import (
    MAX_TASKS,
    RangeBody,
    SplitBody,
    TaskBody,
    encoded,
    split_type,
)
from palaestra.server.fastpath import validation_message

router = APIRouter(prefix="/openenv/{org}/{name}", tags=["openenv"])

HARBOR_CLIENT_ENV = "harbor_env"  # the env name openenv's HarborEnv client always sends
WITHHELD = "a sealed split's task: its public fields need a token with the 'eval' scope"


def error(exc: PalaestraError) -> JSONResponse:
    """OpenEnv's (FastAPI's) error shape with our status and code, as the door's others."""
    body = {"detail": exc.message, "code": exc.code, "retryable": exc.retryable}
    headers = {"www-authenticate": 'Bearer realm="palaestra"'} if exc.status == 401 else {}
    return JSONResponse(body, status_code=exc.status or 500, headers=headers)


def environment(catalog: Catalog, org: str, name: str, env: str | None) -> PackInfo:
    """The pack the route names (404 for an unknown pack, or an environment not this one)."""
    pack = catalog.pack_info(f"{org}/{name}")
    own = env_name(name)
    if env is not None and env.lower() not in {own.lower(), HARBOR_CLIENT_ENV}:
        raise NotFoundError(
            f"unknown environment {env!r}: this door serves {own!r} "
            f"(/openenv/{org}/{name}/{own}/splits)"
        )
    return pack


def env_name(name: str) -> str:
    """The OpenEnv environment's name: the pack's, without a pinned version (`echo@0.1.0`)."""
    return name.split("@", 1)[0]


def split_of(pack: PackInfo, split: str) -> SplitInfo:
    for found in pack.splits:
        if found.name == split:
            return found
    names = ", ".join(s.name for s in pack.splits)
    raise BadRequestError(f"pack {pack.name} has no split {split!r} (it has: {names})")


def pinned(pack: PackInfo) -> str:
    """The version the door's answers are about, so the listing and the counts agree."""
    return f"{pack.name}@{pack.version}"


def shown(split: SplitInfo, principal: Principal) -> bool:
    """Whether this token may read the split's tasks' public fields."""
    return not split.sealed or principal.has(EVAL)


def task_view(task: TaskInfo, index: int, public: bool) -> dict[str, Any]:
    """OpenEnv's task spec: the index and reference OpenEnv's clients read (HarborEnv's
    `HarborTaskRef`: index, task_id, task_name, dataset, instruction), then discovery's view."""
    ref = {
        "index": index,
        "task_id": task.id,
        "task_name": task.id.rsplit(":", 1)[-1],
        "dataset": task.split,
    }
    if not public:
        return {**ref, "split": task.split, "sealed": True, "withheld": WITHHELD}
    instruction = task.public.get("instruction", task.public.get("prompt", ""))
    text = instruction if isinstance(instruction, str) else ""
    return {**ref, "instruction": text, **task.model_dump(mode="json")}


def page(
    catalog: Catalog, principal: Principal, pack: PackInfo, split: str, start: int, stop: int
) -> Callable[[], list[dict[str, Any]]]:
    """The views of the tasks [start, stop) of the split (bounds already within it), read
    and built when called (`encoded` calls it on a worker thread)."""
    found = split_of(pack, split)
    if stop - start > MAX_TASKS:
        raise BadRequestError(
            f"a range is at most {MAX_TASKS} tasks; this one is {stop - start}: ask "
            f"task_range in pages (start, start + {MAX_TASKS}, …) up to num_tasks"
        )
    query = TaskQuery(pack=pinned(pack), split=split, limit=max(stop - start, 1), offset=start)
    public = shown(found, principal)

    def views() -> list[dict[str, Any]]:
        tasks = catalog.task_list(query).tasks if stop > start else []
        return [task_view(t, start + i, public) for i, t in enumerate(tasks)]

    return views


def task_at(
    catalog: Catalog, principal: Principal, pack: PackInfo, split: str, index: int
) -> dict[str, Any]:
    total = split_of(pack, split).tasks
    if not 0 <= index < total:
        last = f"0..{total - 1}" if total else "it is empty"
        raise BadRequestError(f"Invalid task index {index}: split {split!r} has {total} ({last})")
    return page(catalog, principal, pack, split, index, index + 1)()[0]


def reset_by_index(catalog: Catalog, pack: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's task selection, `reset(split=…, index=…)`, as our reset's `task` (the task
    at that index of the Task API's listing); other reset arguments pass as they are. Who
    may start it (a sealed split: `eval` tokens) is the episode manager's check, as ever."""
    if "index" not in kwargs:
        return kwargs
    fields = dict(kwargs)
    index, split = fields.pop("index"), fields.pop("split", None)
    if "task" in fields:
        raise BadRequestError("reset takes a task or a split and an index, not both")
    if not isinstance(split, str) or not split:
        raise BadRequestError("reset by index needs the split too: reset(split=…, index=…)")
    if not isinstance(index, int) or isinstance(index, bool):
        raise BadRequestError(f"reset's index must be an integer, not {index!r}")
    info = catalog.pack_info(pack)
    total = split_of(info, split).tasks
    if not 0 <= index < total:
        raise BadRequestError(f"Invalid task index {index}: split {split!r} has {total} tasks")
    query = TaskQuery(pack=pinned(info), split=split, limit=1, offset=index)
    fields["task"] = catalog.task_list(query).tasks[0].id
    return fields


async def asked(request: Request, model: type[SplitBody]) -> Any:
    """The JSON body as the route's OpenEnv request model (a bad one is a 422 naming it)."""
    raw = await request.body()
    try:
        return model.model_validate(json.loads(raw or b"{}"))
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            raise BadRequestError(validation_message(list(exc.errors()))) from exc
        raise BadRequestError(f"the body is not JSON: {exc}") from exc


@router.get("/list_environments")
async def list_environments(org: str, name: str, request: Request) -> JSONResponse:
    try:
        principal_of(request)
        environment(services_of(request).catalog, org, name, None)
    except PalaestraError as exc:
        return error(exc)
    return JSONResponse([env_name(name)])


@router.get("/{env}/splits")
async def list_splits(org: str, name: str, env: str, request: Request) -> JSONResponse:
    """OpenEnv's split descriptors `{name, type}`, with the count and whether it is sealed."""
    try:
        principal_of(request)
        pack = environment(services_of(request).catalog, org, name, env)
    except PalaestraError as exc:
        return error(exc)
    return JSONResponse(
        [
            {
                "name": s.name,
                "type": split_type(s.name, s.sealed),
                "num_tasks": s.tasks,
                "sealed": s.sealed,
            }
            for s in pack.splits
        ]
    )


@router.post("/{env}/tasks")
async def list_tasks(org: str, name: str, env: str, request: Request) -> Response:
    """The split's tasks: the first `MAX_TASKS` (OpenEnv's bounded preview of a big split;
    num_tasks is the true total and task_range pages through it)."""
    try:
        principal, catalog = principal_of(request), services_of(request).catalog
        pack = environment(catalog, org, name, env)
        body = await asked(request, SplitBody)
        count = min(split_of(pack, body.split).tasks, MAX_TASKS)
        views = page(catalog, principal, pack, body.split, 0, count)
    except PalaestraError as exc:
        return error(exc)
    return await encoded(lambda: {"tasks": views(), "env_name": env_name(name)})


@router.post("/{env}/num_tasks")
async def num_tasks(org: str, name: str, env: str, request: Request) -> JSONResponse:
    try:
        principal_of(request)
        pack = environment(services_of(request).catalog, org, name, env)
        body = await asked(request, SplitBody)
        return JSONResponse({"num_tasks": split_of(pack, body.split).tasks})
    except PalaestraError as exc:
        return error(exc)


@router.post("/{env}/task")
async def get_task(org: str, name: str, env: str, request: Request) -> JSONResponse:
    try:
        principal, catalog = principal_of(request), services_of(request).catalog
        pack = environment(catalog, org, name, env)
        body = await asked(request, TaskBody)
        return JSONResponse({"task": task_at(catalog, principal, pack, body.split, body.index)})
    except PalaestraError as exc:
        return error(exc)


@router.post("/{env}/task_range")
async def get_task_range(org: str, name: str, env: str, request: Request) -> Response:
    """Tasks [start, stop) as a Python slice (negative bounds count from the end)."""
    try:
        principal, catalog = principal_of(request), services_of(request).catalog
        pack = environment(catalog, org, name, env)
        body = await asked(request, RangeBody)
        total = split_of(pack, body.split).tasks
        start, stop, _ = slice(body.start, body.stop).indices(total)
        views = page(catalog, principal, pack, body.split, start, stop)
    except PalaestraError as exc:
        return error(exc)
    return await encoded(lambda: {"tasks": views()})
