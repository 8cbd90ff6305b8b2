"""Episode formats: how observations become tokens and sampled tokens become actions.

A format renders the first observation once (the prompt), tokenizes each later
environment turn alone (appended after the sampled tokens, never re-rendering the chat),
and parses a turn's sampled tokens into an action. `JSONToolFormat` is a generic one for
text models (a tool call as JSON); the CPU demo has its own compact format.
"""

from __future__ import annotations

import json
from typing import Protocol, runtime_checkable

from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.train.tokenizers import Tokenizer


class UnparseableAction(ValueError):
    """The sampled text is no action; the message becomes the environment's reply."""


@runtime_checkable
class EpisodeFormat(Protocol):
    stop_token_ids: tuple[int, ...]

    def prompt_ids(self, reset: ResetResponse) -> list[int]: ...

    def observation_ids(self, reply: StepResponse) -> list[int]: ...

    def error_ids(self, message: str) -> list[int]: ...

    def parse_action(self, ids: list[int]) -> Action: ...


class JSONToolFormat:
    """Plain-text turns: the model answers one JSON tool call `{"tool": …, "arguments": …}`
    and ends its turn with `end`; observations come back between `<obs>` tags."""

    def __init__(self, tokenizer: Tokenizer, *, end: str = "\n", system: str = "") -> None:
        self.tokenizer = tokenizer
        self.end = end
        self.system = system
        end_ids = tokenizer.encode(end)
        self.stop_token_ids = tuple(end_ids[-1:])

    def prompt_ids(self, reset: ResetResponse) -> list[int]:
        tools = json.dumps([t.model_dump(mode="json") for t in reset.tools])
        text = (
            f"{self.system}Tools: {tools}\nAnswer each turn with one JSON tool call "
            f'{{"tool": name, "arguments": {{...}}}} on one line.\n'
            f"<obs>{reset.observation.text}</obs>\n"
        )
        return self.tokenizer.encode(text)

    def observation_ids(self, reply: StepResponse) -> list[int]:
        return self.tokenizer.encode(f"<obs>{reply.observation.text}</obs>\n")

    def error_ids(self, message: str) -> list[int]:
        return self.tokenizer.encode(f"<obs>error: {message}</obs>\n")

    def parse_action(self, ids: list[int]) -> Action:
        return parse_json_action(self.tokenizer.decode(ids))


def parse_json_action(text: str) -> Action:
    """The one JSON tool call `{"tool": …, "arguments": …}` in a turn's text."""
    text = text.strip()
    start, stop = text.find("{"), text.rfind("}")
    if start < 0 or stop < start:
        raise UnparseableAction('no JSON object; answer {"tool": …, "arguments": {…}}')
    try:
        return Action.model_validate_json(text[start : stop + 1])
    except ValueError as exc:
        raise UnparseableAction(f"not a tool call: {str(exc).splitlines()[0]}") from None
