"""One NeMo Gym episode end to end against palaestra's NeMo Gym door, run by NeMo Gym's own
servers (the `nemo-gym` package, its venv): the single-agent-turn Environment Server
(`environment_servers/single_agent_turn`) seeds the door's session, its Simple Agent
(`responses_api_agents/simple_agent`) calls the door's tools by direct HTTP with the seed's
cookie, and the Environment Server verifies, closes, and aggregates the batch. Only the
model is a stand-in: it answers in the Responses API's shape, calling `submit` with the word
of the prompt reversed.

    python nemo_gym_episode.py URL TOKEN

NeMo Gym's servers send no credentials of their own, so the token is a default header of
the one aiohttp client they share. Prints one JSON line: the Environment Server's response.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
from typing import Any

import aiohttp
import nemo_gym.server_utils as server_utils
import uvicorn
from environment_servers.single_agent_turn.app import (
    SingleAgentTurnEnvironmentServer,
    SingleAgentTurnEnvironmentServerConfig,
)
from fastapi import FastAPI, Request
from nemo_gym.config_types import (
    AgentServerRef,
    AggregateMetricsRequest,
    ModelServerRef,
    ResourcesServerRef,
)
from nemo_gym.episode_types import EpisodeId, MaterializedTask, TaskId
from nemo_gym.server_utils import BaseServerConfig, ServerClient
from nemo_gym.single_agent_turn_types import SingleAgentTurnRequest, SingleAgentTurnTaskInput
from omegaconf import OmegaConf
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig

HOST = "127.0.0.1"
PROMPT = "Submit the word 'birch' in reverse order of its letters."
TOOLS = [
    {
        "type": "function",
        "name": "submit",
        "description": "End the episode with an answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
        "strict": False,
    }
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def model_app() -> FastAPI:
    """A Responses API stand-in: submit the prompt's word reversed, then say done."""
    app = FastAPI()

    @app.post("/{path:path}")
    async def responses(path: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        items = body["input"] if isinstance(body["input"], list) else []
        answered = any(item.get("type") == "function_call_output" for item in items)
        if answered:
            output: dict[str, Any] = {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "done", "annotations": []}],
            }
        else:
            text = json.dumps(items)
            word = re.search(r"word '(\w+)'", text)
            answer = word[1][::-1] if word else ""
            output = {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "submit",
                "arguments": json.dumps({"answer": answer}),
                "status": "completed",
            }
        return {
            "id": "resp_model",
            "created_at": 0,
            "model": "stand-in",
            "object": "response",
            "output": [output],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
        }

    return app


async def serve(app: FastAPI, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning"))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    return server, task


async def main(url: str, token: str) -> dict[str, Any]:
    server_utils._GLOBAL_AIOHTTP_CLIENT = aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {token}"}, cookie_jar=aiohttp.DummyCookieJar()
    )
    door = url.removeprefix("http://").split(":")
    agent_port, model_port = free_port(), free_port()
    client = ServerClient(
        head_server_config=BaseServerConfig(host=HOST, port=1),
        global_config_dict=OmegaConf.create(
            {
                "palaestra": {
                    "resources_servers": {"door": {"host": door[0], "port": int(door[1])}}
                },
                "agent": {
                    "responses_api_agents": {"simple_agent": {"host": HOST, "port": agent_port}}
                },
                "model": {"responses_api_models": {"stand_in": {"host": HOST, "port": model_port}}},
            }
        ),
    )
    agent = SimpleAgent(
        config=SimpleAgentConfig(
            host=HOST,
            port=agent_port,
            entrypoint="",
            name="agent",
            model_server=ModelServerRef(type="responses_api_models", name="model"),
        ),
        server_client=client,
    )
    servers = [
        await serve(model_app(), model_port),
        await serve(agent.setup_webserver(), agent_port),
    ]
    environment = SingleAgentTurnEnvironmentServer(
        config=SingleAgentTurnEnvironmentServerConfig(
            host=HOST,
            port=free_port(),
            entrypoint="",
            name="environment",
            resources_server=ResourcesServerRef(type="resources_servers", name="palaestra"),
            agent_server=AgentServerRef(type="responses_api_agents", name="agent"),
            resources_tool_transports=["direct_http"],
            cleanup_timeout_seconds=30,
        ),
        server_client=client,
    )
    request = SingleAgentTurnRequest(
        episode_id=EpisodeId(rollout_id="palaestra-e2e"),
        task=MaterializedTask(
            task_id=TaskId(taskset="palaestra/echo", task_id="say-birch"),
            task_input=SingleAgentTurnTaskInput(
                responses_create_params={"input": PROMPT, "tools": TOOLS},
                task_data={},
            ),
        ),
    )
    try:
        response = await environment.run_request(request)
        verified = response.result.model_dump(mode="json") if response.result else {}
        # as NeMo Gym does after a batch: forwarded to the resources server, the door
        batch = AggregateMetricsRequest(verify_responses=[{**verified, "_ng_task_index": 0}])
        aggregate = await environment.aggregate_metrics(batch)
    finally:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in servers))
        await server_utils._GLOBAL_AIOHTTP_CLIENT.close()
    seen: dict[str, Any] = response.model_dump(mode="json")
    seen["aggregate"] = aggregate.model_dump(mode="json")
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
