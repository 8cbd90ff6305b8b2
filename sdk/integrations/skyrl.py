"""SkyRL: a `skyrl_gym` text environment over one palaestra episode at a time.

`register()` makes it `skyrl_gym.make("palaestra", env_config={"base_url": …, "token": …},
extras={"task": "org/name:task_id", "seed": 0})`. `init` starts the episode; `step` parses
the model's text as one tool call, in Hermes' `<tool_call>{"name", "arguments"}</tool_call>`
form (what Qwen models emit) or as the JSON `{"tool", "arguments"}` (the collector's
format), steps, and on the episode's end returns the verifier's reward. Text that is no
tool call gets an error observation that shows both forms. The server does all checks;
this only translates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from skyrl_gym import register as skyrl_register
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import Verdict
from palaestra.sdk.train.formats import UnparseableAction, parse_json_action

ENV_ID = "palaestra"
INSTRUCTIONS = (
    'Answer each turn with one tool call, <tool_call>{"name": TOOL, "arguments": {...}}'
    '</tool_call> or the JSON {"tool": TOOL, "arguments": {...}}. Tools: '
)


class PalaestraTextEnv(BaseTextEnv):  # type: ignore[misc]  # skyrl_gym is untyped
    """One palaestra episode. `env_config`: base_url, token (optional), max_turns (20);
    `extras` (a dataset row's): task (required), seed (optional)."""

    def __init__(
        self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        config, row = dict(env_config or {}), dict(extras or {})
        for where, values, key in (("env_config", config, "base_url"), ("extras", row, "task")):
            if not values.get(key):
                raise ValueError(f"PalaestraTextEnv: {where} needs {key!r}")
        self.client = HTTPClient(str(config["base_url"]), token=config.get("token"))
        self.task: str = str(row["task"])
        self.seed: int | None = row.get("seed")
        self.max_turns = int(config.get("max_turns", 20))
        self.episode_id = ""
        self.verdict: Verdict | None = None

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode; its first observation and tool list follow `prompt`."""
        reset = self.client.reset(self.task, seed=self.seed)
        self.episode_id = reset.episode_id
        tools = json.dumps([t.model_dump(mode="json") for t in reset.tools])
        first = {"role": "user", "content": f"{INSTRUCTIONS}{tools}\n{reset.observation.text}"}
        return [*prompt, first], {"episode_id": reset.episode_id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if not self.episode_id:
            raise RuntimeError("PalaestraTextEnv.step before init")
        if self.verdict is not None:
            raise RuntimeError(f"episode {self.episode_id} is over; make a new env")
        self.turns += 1
        text, ended = self._act(action)
        if ended or self.turns >= self.max_turns:
            self.verdict = self.client.verify(self.episode_id)
            return self._output(text, self.verdict.reward, done=True)
        return self._output(text, 0.0, done=False)

    def _act(self, action: str) -> tuple[str, bool]:
        """The environment's reply to `action` and whether the episode ended."""
        try:
            reply = self.client.step(self.episode_id, parse_json_action(action))
        except (UnparseableAction, InvalidActionError) as exc:
            return f"error: {exc}", False
        return reply.observation.text, reply.terminated or reply.truncated

    def _output(self, text: str, reward: float, *, done: bool) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": text}],
            reward=reward,
            done=done,
            metadata={"episode_id": self.episode_id, "observation": text},
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        passed = self.verdict is not None and self.verdict.passed
        return {"turns": self.turns, "passed": float(passed)}

    def close(self) -> None:
        """Close a still-live episode (an ended one is kept, verified, on the server)."""
        if self.episode_id and self.verdict is None:
            self.client.close(self.episode_id)
        self.client.close_connection()


def register(env_id: str = ENV_ID) -> None:
    """Register `PalaestraTextEnv` with skyrl_gym under `env_id`."""
    skyrl_register(id=env_id, entry_point=PalaestraTextEnv)
