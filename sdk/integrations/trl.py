"""TRL: an `environment_factory` for `GRPOTrainer` over palaestra episodes.

`environment_factory(base_url, family, token=…)` returns a class TRL instantiates with no
arguments, once per rollout: `reset(**row)` starts an episode of the row's `task` (and
`seed`) and returns its first observation, each of the family's tools is a typed,
docstring'd public method that steps the episode, and `get_reward` is the verifier's reward.
TRL parses the model's tool calls, appends the results (masked out of the loss) and loops.
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any, ClassVar

from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import ToolSpec, Verdict

_JSON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}
_RESERVED = {"reset", "get_reward"}
OVER = "the episode is over; no further tool calls are taken"


class PalaestraEnvironment:
    """One palaestra episode per rollout. Subclasses made by `environment_factory` carry the
    server and one method per tool; state lives in `_` attributes (TRL lists every public
    function of the class as a tool)."""

    _base_url: ClassVar[str]
    _token: ClassVar[str | None]

    def __init__(self) -> None:
        self._client = HTTPClient(self._base_url, token=self._token)
        self._episode = ""
        self._ended = False
        self._verdict: Verdict | None = None

    def reset(self, **row: Any) -> str:
        """Start an episode of `row["task"]` (seed `row.get("seed")`); its first observation."""
        task = row.get("task")
        if not isinstance(task, str) or not task:
            raise ValueError(
                f"{type(self).__name__}.reset: the dataset row needs a `task` column "
                f'("org/name:task_id"); it has {sorted(row)}'
            )
        self._finish()
        reply = self._client.reset(task, seed=row.get("seed"))
        self._episode, self._ended, self._verdict = reply.episode_id, False, None
        return reply.observation.text

    def get_reward(self) -> float | None:
        """The verifier's reward for this rollout's episode (verified as is if still live);
        None for a void episode (the server's fault, not the model's): TRL leaves it out."""
        if self._verdict is None:
            if not self._episode:
                raise RuntimeError(f"{type(self).__name__}.get_reward before reset")
            self._verdict = self._client.verify(self._episode)
        return None if self._verdict.status == "void" else self._verdict.reward

    def _step(self, tool: str, arguments: dict[str, Any]) -> str:
        if not self._episode:
            raise RuntimeError(f"{type(self).__name__}: a tool call before reset")
        if self._ended:
            return OVER
        try:
            reply = self._client.step(self._episode, {"tool": tool, "arguments": arguments})
        except InvalidActionError as exc:
            return f"error: {exc}"
        self._ended = reply.terminated or reply.truncated
        return reply.observation.text

    def _finish(self) -> None:
        """Close the previous rollout's episode if it was never verified (kept otherwise)."""
        if self._episode and self._verdict is None:
            self._client.close(self._episode)


def environment_factory(
    base_url: str, family: str, *, token: str | None = None, name: str = ""
) -> type[PalaestraEnvironment]:
    """A `PalaestraEnvironment` class whose methods are `family`'s tools, as the server lists
    them: pass it as `GRPOTrainer(environment_factory=…)`."""
    with HTTPClient(base_url, token=token) as client:
        families = {f.name: f for f in client.families()}
    if family not in families:
        raise ValueError(f"family {family!r} is not served at {base_url}: {sorted(families)}")
    methods = {spec.name: tool_method(spec) for spec in families[family].tools}
    attrs: dict[str, Any] = {"_base_url": base_url, "_token": token, **methods}
    return type(name or f"Palaestra{family.title()}Env", (PalaestraEnvironment,), attrs)


def tool_method(spec: ToolSpec) -> Any:
    """A method `(self, **arguments) -> str` that steps `spec`'s tool, with the signature,
    type hints and Google-style docstring that TRL (transformers' get_json_schema) reads."""
    if not spec.name.isidentifier() or keyword.iskeyword(spec.name) or spec.name in _RESERVED:
        raise ValueError(
            f"tool {spec.name!r} cannot be a TRL tool method: it must be an identifier, "
            f"no keyword, and neither {' nor '.join(sorted(_RESERVED))}"
        )
    if spec.name.startswith("_"):
        raise ValueError(f"tool {spec.name!r} cannot be a TRL tool method: TRL skips '_' names")
    properties: dict[str, Any] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params, hints, args_doc = [self_param], {}, []
    for arg, schema in properties.items():
        hint: Any = _python_type(schema)
        if arg in required:
            default: Any = inspect.Parameter.empty
        else:
            default = schema.get("default")
            hint = hint if default is not None else hint | None
        keyword_only = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(arg, keyword_only, default=default, annotation=hint))
        hints[arg] = hint
        args_doc.append(f"    {arg}: {schema.get('description') or schema.get('title') or arg}")

    def call(self: PalaestraEnvironment, **arguments: Any) -> str:
        return self._step(spec.name, {k: v for k, v in arguments.items() if v is not None})

    call.__name__ = call.__qualname__ = spec.name
    call.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = {**hints, "return": str}
    args = "\n\nArgs:\n" + "\n".join(args_doc) if args_doc else ""
    call.__doc__ = (
        f"{spec.description or spec.name}{args}\n\nReturns:\n    The environment's reply."
    )
    return call


def _python_type(schema: dict[str, Any]) -> type:
    """The Python type of a JSON schema (the first non-null type of an `anyOf`)."""
    options = schema.get("anyOf") or [schema]
    for option in options:
        kind = option.get("type")
        if kind in _JSON_TYPES:
            return _JSON_TYPES[kind]
    return str
