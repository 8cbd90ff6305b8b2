"""Harness mode on the wire: the reset option that names a harness, and the record of one
model call the episode's model proxy made (DESIGN §3, §9; docs/harness.md).

In harness mode the agent owns the loop: a harness (mini-swe-agent, the built-in bash
agent) runs inside the episode's sandbox and calls a model through the episode's session
proxy, the only thing the sandbox can reach. The proxy forwards each call to the one
endpoint named at reset and records what that endpoint returned, token ids included; the
trainer turns the records into token-in/token-out samples (sdk/train/harness.py).

    client.reset("openai/humaneval:HumanEval-1", options={"harness": {
        "name": "mini-swe-agent",
        "model_endpoint": "http://127.0.0.1:8001/v1",
        "model": "policy",
        "sampling": {"temperature": 1.0, "max_tokens": 512},
    }})
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

HARNESS_OPTION = "harness"  # the key of ResetRequest.options that starts a harness episode

LlmApi = Literal["openai-chat", "anthropic-messages", "openresponses"]  # the dialect a call spoke


class HarnessOptions(BaseModel):
    """`options["harness"]` of a reset. The server refuses unknown fields (422)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="a harness of the registry")
    model_endpoint: str = Field(
        min_length=1,
        max_length=2048,
        description="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8001/v1; "
        "the proxy forwards to it and to nothing else",
    )
    model: str = Field(min_length=1, max_length=256, description="the model name to send")
    sampling: dict[str, Any] = Field(
        default_factory=dict,
        description="sampling fields the proxy sets on every call (temperature, top_p, "
        "max_tokens, seed, ...), over what the harness sent",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="harness-specific settings (its registry entry says)"
    )
    max_calls: int | None = Field(default=None, ge=1, description="model calls, capped")
    max_tokens: int | None = Field(
        default=None, ge=1, description="completion tokens over all calls, capped"
    )


class LlmCall(BaseModel):
    """One model call through the session proxy, as stored in the episode's trajectory
    (a step record whose action tool is `LLM_CALL_TOOL`, this in `info["llm_call"]`).

    The ids and logprobs are the upstream server's own (vLLM's `prompt_token_ids`,
    `token_ids` and `logprobs`), never re-tokenized here."""

    index: int
    api: LlmApi
    request: dict[str, Any]  # the body the harness sent (before the proxy's sampling)
    response: dict[str, Any]  # the body the harness got back (streamed replies: assembled)
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    started_at: float  # time.time() when the proxy received the call
    upstream_s: float  # seconds the upstream took
    proxy_s: float  # seconds the call spent in the proxy, upstream included
    stream: bool = False
    error: str | None = Field(
        default=None,
        description="the model server refused the call: `HTTP <status>: <its message>` "
        "(e.g. the context window exceeded); no ids, nothing to train on",
    )


LLM_CALL_TOOL = "llm_call"  # the action tool a harness episode's trajectory records use


class HarnessStatus(BaseModel):
    """A harness episode's `info["harness"]` (reset, state): what is running and how far."""

    name: str
    state: Literal["starting", "running", "exited", "killed", "failed"]
    calls: int = 0
    completion_tokens: int = 0
    exit_code: int | None = None
    reason: str | None = None  # why it stopped (a limit, the harness exited, a fault)
