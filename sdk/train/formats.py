"""Episode formats: how observations become tokens and sampled tokens become actions.

A format renders the first observation once (the prompt), tokenizes each later
environment turn alone (appended after the sampled tokens, never re-rendering the chat),
and parses a turn's sampled tokens into an action. `JSONToolFormat` is a generic one for
text models (a tool call as JSON); the CPU demo has its own compact format.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Protocol, runtime_checkable

from pydantic import ValidationError

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


HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
EXPECTED_FORMS = (
    'write one tool call: <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> '
    '(Hermes, as Qwen models do) or the JSON object {"tool": "TOOL", "arguments": {...}}'
)


def parse_json_action(text: str) -> Action:
    """The one tool call in a turn's text: Hermes' `<tool_call>{"name", "arguments"}
    </tool_call>` (what Qwen models emit; an unclosed tag at the end too, as a stop string
    leaves it), else one JSON object `{"tool", "arguments"}` (or `{"name", "arguments"}`).
    UnparseableAction, whose message shows both forms, otherwise."""
    tagged = HERMES_CALL.findall(text)
    if len(tagged) > 1:
        raise UnparseableAction(f"{len(tagged)} tool calls in one turn; {EXPECTED_FORMS}")
    body = tagged[0] if tagged else text.strip()
    start, stop = body.find("{"), body.rfind("}")
    if start < 0 or stop < start:
        raise UnparseableAction(f"no JSON object; {EXPECTED_FORMS}")
    try:
        call = json.loads(body[start : stop + 1])
    except (ValueError, RecursionError) as exc:
        raise UnparseableAction(f"not JSON ({exc}); {EXPECTED_FORMS}") from None
    if not isinstance(call, dict):
        raise UnparseableAction(f"not a JSON object; {EXPECTED_FORMS}")
    if "tool" not in call and "name" in call:  # Hermes' keys
        call = {"tool": call["name"], "arguments": call.get("arguments", {})}
    if isinstance(call.get("arguments"), str):  # arguments as a JSON string, as OpenAI's
        with contextlib.suppress(ValueError):  # else refused below, by name
            call["arguments"] = json.loads(call["arguments"])
    try:
        return Action.model_validate(call)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UnparseableAction(f"not a tool call ({wrong}); {EXPECTED_FORMS}") from None
