"""Drive palaestra's NeMo Gym door with the `nemo-gym` package's own client (its venv).

    python nemo_gym_client.py URL TOKEN OTHER_TOKEN

An episode of palaestra/echo as NeMo Gym's Environment Server and Simple Agent run one
(`nemo_gym.server_utils.request`, the one HTTP client Gym servers use, with the session
cookie the seed set), every body through NeMo Gym's own wire models; another token's and
bad calls; then NeMo Gym's own session conformance check
(`nemo_gym.testing.session_conformance`) through the door. Prints one JSON line of what it
saw; tests/server/doors/test_door_nemo_gym.py asserts on it."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from nemo_gym.base_resources_server import (
    BaseVerifyResponse,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import (
    GlobalAIOHTTPAsyncClientConfig,
    get_response_json,
    request,
    set_global_aiohttp_client,
)
from nemo_gym.testing.session_conformance import check_resources_session_contract

TASKSET, TASK = "palaestra/echo", "say-birch"
EMPTY_RESPONSE: dict[str, Any] = {
    "id": "resp_peer",
    "created_at": 0,
    "model": "peer",
    "object": "response",
    "output": [],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}


def cookies_of(response: Any) -> dict[str, str]:
    """As NeMo Gym's single_agent_turn Environment Server reads a seed's cookies."""
    return {str(name): str(morsel.value) for name, morsel in response.cookies.items()}


async def episode(url: str, token: str, other: str, answer: str) -> dict[str, Any]:
    auth, foreign = {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {other}"}
    sid = f"resources-session-{uuid.uuid4().hex}"
    episode_id = EpisodeId(rollout_id=f"rollout-{uuid.uuid4().hex[:8]}")
    seed = ResourcesSeedSessionRequest(
        resources_session_id=sid,
        episode_id=episode_id,
        task_id=TaskId(taskset=TASKSET, task_id=TASK),
        task_data={},
    )
    seeded = await request(
        "POST", f"{url}/seed_session", json=seed.model_dump(mode="json"), headers=auth
    )
    assert seeded.status == 200, await seeded.text()
    cookies = cookies_of(seeded)
    seed_reply = ResourcesSeedSessionResponse.model_validate(await get_response_json(seeded))
    seen: dict[str, Any] = {
        "cookie_names": sorted(cookies),
        "seed": seed_reply.model_dump(mode="json"),
    }
    view = await request("POST", f"{url}/nemo_gym/session", headers=auth, cookies=cookies)
    seen["view"] = await get_response_json(view)

    async def tool(
        name: str, arguments: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, Any]:
        # as Simple Agent calls a direct-HTTP tool: POST base_url/{name}, the session's cookies
        got = await request(
            "POST", f"{url}/{name}", json=arguments, cookies=cookies, headers=headers
        )
        return got.status, json.loads((await got.content.read()).decode())

    seen["echo"] = await tool("echo", {"text": "hello"}, auth)
    seen["bad_tool"] = await tool("no_such_tool", {}, auth)
    seen["foreign_tool"] = await tool("echo", {"text": "x"}, foreign)
    close = ResourcesCloseSessionRequest(resources_session_id=sid, episode_id=episode_id)
    body = close.model_dump(mode="json")
    foreign_close = await request("POST", f"{url}/close_session", json=body, headers=foreign)
    seen["foreign_close"] = [foreign_close.status, await get_response_json(foreign_close)]
    seen["after_foreign_close"] = (await tool("echo", {"text": "still"}, auth))[0]
    seen["submit"] = await tool("submit", {"answer": answer}, auth)

    params = NeMoGymResponseCreateParamsNonStreaming(input=seen["view"]["observation"]["text"])
    verify_body = seed.task_data | {
        "responses_create_params": params.model_dump(mode="json", exclude_unset=True),
        "response": NeMoGymResponse.model_validate(EMPTY_RESPONSE).model_dump(mode="json"),
    }
    foreign_verify = await request(
        "POST", f"{url}/verify", json=verify_body, cookies=cookies, headers=foreign
    )
    seen["foreign_verify"] = [foreign_verify.status, await get_response_json(foreign_verify)]
    verified = await request(
        "POST", f"{url}/verify", json=verify_body, cookies=cookies, headers=auth
    )
    assert verified.status == 200, await verified.text()
    verdict = BaseVerifyResponse.model_validate(await get_response_json(verified))
    seen["verify"] = verdict.model_dump(
        mode="json", exclude={"responses_create_params", "response"}
    )

    closes = []
    for _ in range(2):
        closed = await request(
            "POST", f"{url}/close_session", json=body, cookies=cookies, headers=auth
        )
        closes.append(closed.status)
        ResourcesCloseSessionResponse.model_validate(await get_response_json(closed))
    seen["closes"] = closes
    late = await request(
        "POST", f"{url}/seed_session", json=seed.model_dump(mode="json"), headers=auth
    )
    seen["seed_after_close"] = [late.status, await get_response_json(late)]
    return seen


async def bad_input(url: str, token: str) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {token}"}
    out: dict[str, Any] = {}
    for name, path, body, cookies in [
        ("verify_no_cookie", "/verify", {}, None),
        ("verify_unknown", "/verify", {}, {"palaestra_nemo_gym": "ghost"}),
        ("tool_unknown", "/echo", {"text": "x"}, {"palaestra_nemo_gym": "ghost"}),
        ("close_bad_body", "/close_session", {"resources_session_id": 1}, None),
        ("seed_bad_body", "/seed_session", {"resources_session_id": ""}, None),
    ]:
        got = await request("POST", f"{url}{path}", json=body, headers=auth, cookies=cookies)
        out[name] = [got.status, await get_response_json(got)]
    got = await request("POST", f"{url}/verify", json={})
    out["no_token"] = [got.status, await get_response_json(got)]
    return out


def forwarding_app(url: str, token: str) -> FastAPI:
    """NeMo Gym's conformance check drives an app in process; this one forwards each of its
    requests, cookies and all, to the door over HTTP with the token, and answers as it did."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        if "cookie" in request.headers:
            headers["Cookie"] = request.headers["cookie"]
        async with httpx.AsyncClient() as client:
            got = await client.request(
                request.method, f"{url}/{path}", content=await request.body(), headers=headers
            )
        answer = Response(got.content, status_code=got.status_code, media_type="application/json")
        for value in got.headers.get_list("set-cookie"):
            answer.headers.append("set-cookie", value)
        return answer

    return app


def conformance(url: str, token: str) -> str:
    seed = ResourcesSeedSessionRequest(
        resources_session_id=f"conformance-{uuid.uuid4().hex}",
        episode_id=EpisodeId(rollout_id=f"rollout-{uuid.uuid4().hex[:8]}"),
        task_id=TaskId(taskset=TASKSET, task_id=TASK),
        task_data={},
    )
    try:
        check_resources_session_contract(forwarding_app(url, token), seed, keeps_state=True)
    except AssertionError as exc:
        return f"failed: {exc}"
    return "passed"


async def main(url: str, token: str, other: str) -> dict[str, Any]:
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    return {
        "right": await episode(url, token, other, "hcrib"),
        "wrong": (await episode(url, token, other, "birch"))["verify"],
        "bad": await bad_input(url, token),
    }


if __name__ == "__main__":
    url, token, other = sys.argv[1:4]
    seen = asyncio.run(main(url, token, other))
    seen["conformance"] = conformance(url, token)
    print(json.dumps(seen))
