"""A policy on an OpenAI-compatible `/chat/completions` endpoint with tool calling."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.policies.base import PolicyError, Session, attempt_seed
from palaestra.sdk.policies.prompts import SYSTEM_PROMPT, openai_tools, render_observation


@dataclass
class ChatPolicy:
    """An OpenAI-compatible `/chat/completions` endpoint with tool calling."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 2048
    timeout_s: float = 120.0
    seed: int | None = None
    system_prompt: str = SYSTEM_PROMPT
    name: str = field(default="chat")

    def reset_options(self) -> dict[str, Any]:
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        key = os.environ.get(self.api_key_env, "")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        http = httpx.AsyncClient(
            base_url=self.base_url.rstrip("/"), headers=headers, timeout=self.timeout_s
        )
        return _ChatSession(self, http, reset)


class _ChatSession:
    def __init__(self, policy: ChatPolicy, http: httpx.AsyncClient, reset: ResetResponse) -> None:
        self.policy = policy
        self.http = http
        self.tools = openai_tools(reset.tools)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": policy.system_prompt},
            {"role": "user", "content": render_observation(reset.observation)},
        ]
        self.pending_call: str | None = None
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self.seed = None if policy.seed is None else policy.seed + attempt_seed(reset)

    async def act(self, last: StepResponse | None) -> Action:
        if last is not None and self.pending_call is not None:
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": self.pending_call,
                    "content": render_observation(last.observation),
                }
            )
        body: dict[str, Any] = {
            "model": self.policy.model,
            "messages": self.messages,
            "tools": self.tools,
            "temperature": self.policy.temperature,
            "max_tokens": self.policy.max_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        try:
            response = await self.http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise PolicyError(
                f"model endpoint {self.policy.base_url} unreachable: {exc!r}; check --base-url "
                "and that the model server is running",
                "endpoint_unreachable",
            ) from None
        if response.status_code >= 400:
            raise PolicyError(
                f"model endpoint answered {response.status_code}: {response.text[:300]}",
                "endpoint_error",
            )
        try:
            reply = response.json()
            message = reply["choices"][0]["message"]
            usage = reply.get("usage") or {}
            if not isinstance(message, dict) or not isinstance(usage, dict):
                raise TypeError("message or usage is not an object")
        except (ValueError, KeyError, IndexError, TypeError):
            raise PolicyError(
                "model endpoint returned garbage (not an OpenAI chat completion): "
                f"{response.text[:300]!r}",
                "bad_model_output",
            ) from None
        for key in self.usage:
            value = usage.get(key, 0)
            self.usage[key] += int(value) if isinstance(value, int | float) else 0
        self.messages.append({k: v for k, v in message.items() if v is not None})
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise PolicyError(f"tool_calls is not a list: {calls!r:.200}", "bad_model_output")
        if not calls:
            self.pending_call = None
            self.messages.append({"role": "user", "content": "Call one of the tools."})
            return Action(tool="submit")
        call = calls[0] if isinstance(calls[0], dict) else {}
        self.pending_call = str(call.get("id", "call_0"))
        function = call.get("function") or {}
        if not isinstance(function, dict):
            function = {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (json.JSONDecodeError, TypeError):
            arguments = {"_unparsable": function.get("arguments")}
        if not isinstance(arguments, dict):
            arguments = {"_unparsable": arguments}
        tool = str(function.get("name") or "")
        if not tool:
            raise PolicyError(f"tool call without a name: {call!r:.200}", "bad_model_output")
        return _action(tool[:128], arguments)

    async def aclose(self) -> None:
        await self.http.aclose()


def _action(tool: str, arguments: dict[str, Any]) -> Action:
    try:
        return Action(tool=tool, arguments=arguments)
    except ValidationError as exc:
        raise PolicyError(f"not an action: {exc.errors()[0]['msg']}", "bad_model_output") from None
