"""A Gymnasium `Env` over any palaestra client: text observations, JSON tool-call actions.

    env = PalaestraEnv(HTTPClient(url), task="openai/humaneval:HumanEval-1")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(
        '{"tool": "write_file", "arguments": {"path": "solution.py", "content": "..."}}')

An action that is not valid JSON, or that the server refuses as malformed (422), is not
a step: the observation says what was wrong, the reward is 0 and the episode goes on.
"""

from __future__ import annotations

import json
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium import spaces

from palaestra.sdk.client import Client
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import ResetResponse

MAX_TEXT = 1 << 20


class AnyText(spaces.Text):
    """A Text space that admits any string up to `max_length` (samples stay in the charset)."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def parse_action(action: str) -> dict[str, Any]:
    """The JSON object an action string holds (ValueError saying why when it holds none)."""
    parsed = json.loads(action)
    if not isinstance(parsed, dict):
        raise ValueError("an action is a JSON object")
    return parsed


def invalid_observation(message: str) -> str:
    """What the agent sees after an action that was not a step."""
    return f'invalid action: {message}. Send JSON like {{"tool": "submit", "arguments": {{}}}}.'


def reset_info(reply: ResetResponse) -> dict[str, Any]:
    """The info of a reset: the server's info, the episode id and the tools."""
    return {
        **reply.info,
        "episode_id": reply.episode_id,
        "tools": [t.model_dump() for t in reply.tools],
    }


class PalaestraEnv(gym.Env[str, str]):
    metadata = {"render_modes": ["ansi"]}  # noqa: RUF012  (Gymnasium declares it so)

    def __init__(
        self,
        client: Client,
        task: str | None = None,
        *,
        pack: str | None = None,
        split: str | None = None,
        options: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.client = client
        self.task = task
        self.pack = pack
        self.split = split
        self.reset_options = options or {}
        self.render_mode = render_mode
        self.observation_space = AnyText(max_length=MAX_TEXT)
        self.action_space = AnyText(max_length=MAX_TEXT)
        self.episode_id: str | None = None
        self._last = ""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._close_episode()
        reply = self.client.reset(
            self.task,
            pack=self.pack,
            split=self.split,
            seed=seed,
            options={**self.reset_options, **(options or {})},
        )
        self.episode_id = reply.episode_id
        self._last = reply.observation.text
        return self._last, reset_info(reply)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.episode_id is None:
            raise RuntimeError("call reset() before step()")
        try:
            reply = self.client.step(self.episode_id, parse_action(action))
        except (ValueError, InvalidActionError) as exc:
            message = exc.message if isinstance(exc, InvalidActionError) else str(exc)
            self._last = invalid_observation(message)
            return self._last, 0.0, False, False, {"invalid_action": True}
        self._last = reply.observation.text
        if reply.terminated or reply.truncated:
            self.episode_id = None
        return self._last, reply.reward, reply.terminated, reply.truncated, reply.info

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def _close_episode(self) -> None:
        if self.episode_id is not None:
            self.client.close(self.episode_id)
            self.episode_id = None

    def close(self) -> None:
        self._close_episode()
        super().close()
