"""What a model policy sees and says: observations as text, tools in OpenAI's form, the
system prompt, and tool calls parsed out of generated text."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from palaestra.sdk.models import Action, Observation, ToolSpec


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


SYSTEM_PROMPT = (
    "You are solving a task in a sandboxed environment. Use the tools; call submit when done."
)


_TAGGED = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_tool_call(text: str) -> Action | None:
    """A tool call in generated text: `<tool_call>{"name", "arguments"}</tool_call>` (Hermes,
    Qwen), else the first JSON object with `name`/`tool` and `arguments`. None if there is none."""
    candidates = [m.group(1) for m in _TAGGED.finditer(text)]
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            obj, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        candidates.append(json.dumps(obj))
        if len(candidates) > 20:
            break
    for raw in candidates:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        name = obj.get("name", obj.get("tool"))
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                continue
        if isinstance(name, str) and name and isinstance(arguments, dict):
            try:
                return Action(tool=name[:128], arguments=arguments)
            except ValidationError:
                continue
    return None


def fallback_submit(text: str, tools: list[ToolSpec]) -> Action:
    """No tool call in the text: submit it as the answer when `submit` takes one."""
    submit = next((t for t in tools if t.name == "submit"), None)
    properties = (submit.parameters.get("properties") or {}) if submit else {}
    if "answer" in properties:
        return Action(tool="submit", arguments={"answer": text.strip()[:100_000]})
    return Action(tool="submit")
