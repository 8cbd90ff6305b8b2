"""Policies that act in episodes: oracle, null, and an OpenAI-compatible chat model.

A policy sees the reset response and each step's reply and returns the next action.
The oracle's answers stay on the server: it sends the `oracle` tool and the server
plays the task's reference solution (episodes must be started with `options.oracle`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from palaestra.sdk.models import Action, Observation, ResetResponse, StepResponse, ToolSpec


class PolicyError(Exception):
    """The policy could not produce an action (endpoint unreachable, garbage reply, …)."""

    def __init__(self, message: str, error_class: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class Session(Protocol):
    """One episode's worth of a policy's state."""

    async def act(self, last: StepResponse | None) -> Action: ...

    async def aclose(self) -> None: ...


class Policy(Protocol):
    name: str

    def reset_options(self) -> dict[str, Any]: ...

    async def start(self, reset: ResetResponse) -> Session: ...


class _Scripted:
    def __init__(self, action: Action) -> None:
        self._action = action

    async def act(self, last: StepResponse | None) -> Action:
        return self._action

    async def aclose(self) -> None:
        return None


@dataclass
class OraclePolicy:
    """Plays the task's reference solution, server-side."""

    name: str = "oracle"

    def reset_options(self) -> dict[str, Any]:
        return {"oracle": True}

    async def start(self, reset: ResetResponse) -> Session:
        return _Scripted(Action(tool="oracle"))


@dataclass
class NullPolicy:
    """Submits at once without doing anything; every verifier must give it 0."""

    name: str = "null"

    def reset_options(self) -> dict[str, Any]:
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        return _Scripted(Action(tool="submit"))


def render_observation(observation: Observation) -> str:
    text = observation.text
    if observation.images:
        text += f"\n[{len(observation.images)} image(s) omitted]"
    return text


def openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


@dataclass
class ChatPolicy:
    """An OpenAI-compatible `/chat/completions` endpoint with tool calling."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 2048
    timeout_s: float = 120.0
    system_prompt: str = (
        "You are solving a task in a sandboxed environment. Use the tools; call submit when done."
    )
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

    async def act(self, last: StepResponse | None) -> Action:
        if last is not None and self.pending_call is not None:
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": self.pending_call,
                    "content": render_observation(last.observation),
                }
            )
        body = {
            "model": self.policy.model,
            "messages": self.messages,
            "tools": self.tools,
            "temperature": self.policy.temperature,
            "max_tokens": self.policy.max_tokens,
        }
        try:
            response = await self.http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise PolicyError(
                f"model endpoint unreachable: {exc!r}", "endpoint_unreachable"
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
        except (ValueError, KeyError, IndexError, TypeError):
            raise PolicyError(
                f"model endpoint returned garbage: {response.text[:300]}", "bad_model_output"
            ) from None
        for key in self.usage:
            self.usage[key] += int(usage.get(key, 0) or 0)
        self.messages.append({k: v for k, v in message.items() if v is not None})
        calls = message.get("tool_calls") or []
        if not calls:
            self.pending_call = None
            self.messages.append({"role": "user", "content": "Call one of the tools."})
            return Action(tool="submit")
        call = calls[0]
        self.pending_call = call.get("id", "call_0")
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = {"_unparsable": function.get("arguments")}
        if not isinstance(arguments, dict):
            arguments = {"_unparsable": arguments}
        return Action(tool=str(function.get("name", "")), arguments=arguments)

    async def aclose(self) -> None:
        await self.http.aclose()
