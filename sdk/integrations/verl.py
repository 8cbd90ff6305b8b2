"""A verl agent loop that plays palaestra episodes (verl 0.9.1, `AgentLoopBase`).

Each dataset row names its task in `extra_info.task` ("org/name:task_id"; or `pack` and
`split` to let the server sample). The loop resets that episode, shows the model the
episode's observation and tools through the chat template, generates with verl's server
manager, parses the tool calls with verl's tool parser (`multi_turn.format`), steps the
episode with each call and appends the observation as a `tool` message (response mask 0,
so only the model's own tokens are trained on). It stops when the episode ends, the model
makes no tool call, or the response budget or `multi_turn.max_assistant_turns` is spent;
an episode still open then is verified. The verdict's reward is the `reward_score`.

Where the server is: `palaestra.url` and `palaestra.token` in the trainer config, e.g.
`+palaestra.url=http://gym:8000 +palaestra.token='${oc.env:PALAESTRA_TOKEN}'`. verl's
workers find the loop by `agent_loop_config_path` (docs/integrations.md, "## verl").
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.schemas import OpenAIFunctionToolSchema

from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.http import AsyncHTTPClient
from palaestra.sdk.models import ResetResponse, StepResponse


def tool_schemas(reply: ResetResponse) -> list[dict[str, Any]]:
    """The episode's tools in the OpenAI function shape chat templates render."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in reply.tools
    ]


@register("palaestra")
class PalaestraAgentLoop(AgentLoopBase):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("tools", None)  # verl's BaseTools: the episode brings its own
        super().__init__(*args, **kwargs)
        section = self.config.get("palaestra") or {}
        if not section.get("url"):
            raise ValueError(
                "the palaestra agent loop needs the server's address: set palaestra.url "
                "(and palaestra.token) in the trainer config, e.g. +palaestra.url=http://host:8000"
            )
        self.url: str = section["url"]
        self.token: str | None = section.get("token")
        self.response_length: int = self.rollout_config.response_length
        self.max_turns: int = self.rollout_config.multi_turn.max_assistant_turns or 1 << 30
        self.parser = ToolParser.get_tool_parser(
            self.rollout_config.multi_turn.format, self.tokenizer
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = dict(kwargs.get("extra_info") or {})
        if not (extra.get("task") or extra.get("pack")):
            raise ValueError(
                "a palaestra dataset row needs extra_info.task ('org/name:task_id') "
                "or extra_info.pack (and split) for the server to sample from"
            )
        async with AsyncHTTPClient(self.url, token=self.token) as client:
            reply = await client.reset(
                extra.get("task"),
                pack=extra.get("pack"),
                split=extra.get("split"),
                seed=extra.get("seed"),
                options=dict(extra.get("options") or {}),
            )
            try:
                return await self._play(client, reply, sampling_params, kwargs)
            except BaseException:
                await client.close(reply.episode_id)
                raise

    async def _play(
        self,
        client: AsyncHTTPClient,
        reply: ResetResponse,
        sampling_params: dict[str, Any],
        row: dict[str, Any],
    ) -> AgentLoopOutput:
        schemas = tool_schemas(reply)
        parsed_tools = [OpenAIFunctionToolSchema.model_validate(s) for s in schemas]
        system = [m for m in row.get("raw_prompt", []) if m.get("role") == "system"]
        messages = [*system, {"role": "user", "content": reply.observation.text}]
        ids = await self.ct_build_initial_tokens(messages, tools=schemas)
        mask: list[int] = []
        logprobs: list[float] = []
        ended: StepResponse | None = None
        turns = 0
        params = dict(sampling_params)
        if self.parser.stop_token_ids:
            stops = set(params.get("stop_token_ids") or []) | set(self.parser.stop_token_ids)
            params["stop_token_ids"] = sorted(stops)
        while turns < self.max_turns and len(mask) < self.response_length:
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=ids, sampling_params=params
            )
            turns += 1
            merged, mask, merged_logprobs = await self.ct_merge_assistant_token(
                ids, out.token_ids, mask, logprobs if out.log_probs else None, out.log_probs
            )
            ids, logprobs = merged.token_ids, list(merged_logprobs or [])
            content, calls = await self.parser.extract_tool_calls(out.token_ids, parsed_tools)
            messages.append(_assistant(content, calls))
            if not calls or len(mask) >= self.response_length:
                break
            before = list(messages)
            for call in calls:
                observation, ended = await self._step(client, reply.episode_id, call)
                if ended is not None:
                    break  # no turn follows: the last observation is not trained on
                messages.append({"role": "tool", "content": observation})
            if ended is not None:
                break
            merged, mask, merged_logprobs = await self.ct_merge_context_msg(
                before,
                messages,
                ids,
                mask,
                logprobs or None,
                tools=schemas,
            )
            ids, logprobs = merged.token_ids, list(merged_logprobs or [])
        if ended is not None:
            reward = float(ended.reward)
        else:
            reward = (await client.verify(reply.episode_id)).reward
        prompt = ids[: len(ids) - len(mask)]
        response = ids[len(ids) - len(mask) :]
        output = AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=response[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] or None,
            reward_score=reward,
            num_turns=len(messages) - len(system),
            metrics={},
            extra_fields={
                "episode_id": reply.episode_id,
                "turn_scores": [],
                "tool_rewards": [],
            },
        )
        return output

    async def _step(
        self, client: AsyncHTTPClient, episode_id: str, call: FunctionCall
    ) -> tuple[str, StepResponse | None]:
        """The observation of one tool call, and the reply when it ended the episode. A
        call the server refuses as malformed (422) is no step: the model is told why."""
        try:
            action = {"tool": call.name, "arguments": _arguments(call.arguments)}
            reply = await client.step(episode_id, action)
        except (ValueError, InvalidActionError) as exc:
            message = exc.message if isinstance(exc, InvalidActionError) else str(exc)
            return f"invalid tool call: {message}", None
        ended = reply if reply.terminated or reply.truncated else None
        return reply.observation.text, ended


def _assistant(content: str, calls: list[FunctionCall]) -> dict[str, Any]:
    """The assistant message of a turn, its tool calls as the chat template renders them."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": _shown(c.arguments)}}
            for c in calls
        ]
    return message


def _shown(raw: str) -> dict[str, Any] | str:
    """Arguments as the template shows them: the object, or the raw text when not one."""
    try:
        return _arguments(raw)
    except ValueError:
        return raw


def _arguments(raw: str) -> dict[str, Any]:
    """A tool call's arguments: verl's parsers hand them over as a JSON string."""
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return value
