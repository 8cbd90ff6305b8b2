"""A policy from any Python callable (`module:callable`): a Policy object or factory, or a
function of the conversation; its faults and bad actions become `PolicyError`s."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from palaestra.sdk.models import Action, ResetResponse, StepResponse
from palaestra.sdk.policies.base import PolicyError, Session, session_usage
from palaestra.sdk.policies.prompts import SYSTEM_PROMPT, openai_tools, render_observation


@dataclass
class CallablePolicy:
    """`module:callable`: either a Policy object (or a zero-argument factory of one), or a
    function `f(messages, tools) -> {"tool", "arguments"}` (sync or async) that sees the same
    OpenAI-style conversation a chat model would."""

    target: str
    name: str = "python"
    _fn: Any = field(default=None, init=False, repr=False)
    _policy: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        obj = load_callable(self.target)
        if _is_policy(obj):
            self._policy = obj
        elif inspect.isclass(obj) or (callable(obj) and _arity(obj) == 0):
            made = obj()
            if not _is_policy(made):
                raise PolicyError(
                    f"{self.target} made {type(made).__name__}, not a policy (it needs "
                    "reset_options() and async start(reset))",
                    "policy_error",
                )
            self._policy = made
        elif callable(obj):
            self._fn = obj
        else:
            raise PolicyError(f"{self.target} is not callable", "policy_error")

    def reset_options(self) -> dict[str, Any]:
        if self._policy is not None:
            options: dict[str, Any] = self._policy.reset_options()
            return options
        return {}

    async def start(self, reset: ResetResponse) -> Session:
        if self._policy is not None:
            try:
                session: Session = await self._policy.start(reset)
            except PolicyError:
                raise
            except Exception as exc:
                raise PolicyError(
                    f"{self.target}.start raised {exc!r:.300}", "policy_error"
                ) from None
            return _Guarded(session, self.target)
        return _CallableSession(self._fn, reset, self.target)


def _is_policy(obj: object) -> bool:
    return callable(getattr(obj, "start", None)) and callable(getattr(obj, "reset_options", None))


def _arity(fn: Any) -> int:
    try:
        return len(
            [
                p
                for p in inspect.signature(fn).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        )
    except (TypeError, ValueError):
        return 1


def load_callable(target: str) -> Any:
    """Import `module:attr` (a dotted attr path); the current directory is importable."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyError(f"{target!r} is not module:callable", "policy_error")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise PolicyError(f"cannot import {module_name!r}: {exc!r:.300}", "policy_error") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PolicyError(f"{module_name} has no attribute {attr!r}", "policy_error") from None
    return obj


class _Guarded:
    """A user session whose exceptions and bad actions become PolicyErrors."""

    def __init__(self, inner: Session, target: str) -> None:
        self.inner = inner
        self.target = target

    @property
    def usage(self) -> dict[str, int]:
        return session_usage(self.inner)

    async def act(self, last: StepResponse | None) -> Action:
        try:
            action: Any = await self.inner.act(last)
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"{self.target} raised {exc!r:.300}", "policy_error") from None
        return coerce_action(action, self.target)

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        except Exception as exc:
            raise PolicyError(f"{self.target}.aclose raised {exc!r:.300}", "policy_error") from None


def coerce_action(value: Any, source: str) -> Action:
    """An Action, or its dict form; anything else is the policy's garbage."""
    if isinstance(value, Action):
        return value
    if isinstance(value, dict):
        try:
            return Action.model_validate(value)
        except ValidationError as exc:
            raise PolicyError(
                f"{source} returned {value!r:.200}, not an action: {exc.errors()[0]['msg']}",
                "bad_policy_output",
            ) from None
    raise PolicyError(
        f'{source} returned {value!r:.200}; return {{"tool": ..., "arguments": {{...}}}}',
        "bad_policy_output",
    )


class _CallableSession:
    def __init__(self, fn: Any, reset: ResetResponse, target: str) -> None:
        self.fn = fn
        self.target = target
        self.tools = openai_tools(reset.tools)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": render_observation(reset.observation)},
        ]
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    async def act(self, last: StepResponse | None) -> Action:
        if last is not None:
            self.messages.append({"role": "tool", "content": render_observation(last.observation)})
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(list(self.messages), self.tools)
            else:  # a plain function may block (a local model): keep it off the event loop
                value = await asyncio.to_thread(self.fn, list(self.messages), self.tools)
                if inspect.isawaitable(value):
                    value = await value
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"{self.target} raised {exc!r:.300}", "policy_error") from None
        action = coerce_action(value, self.target)
        self.messages.append(
            {"role": "assistant", "content": json.dumps(action.model_dump(mode="json"))}
        )
        return action

    async def aclose(self) -> None:
        return None
