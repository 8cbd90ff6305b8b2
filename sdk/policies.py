"""Policies that act in episodes: oracle, null, an OpenAI-compatible chat model, a local
Hugging Face transformers model, and any Python callable (`module:callable`).

A policy sees the reset response and each step's reply and returns the next action.
The oracle's answers stay on the server: it sends the `oracle` tool and the server
plays the task's reference solution (episodes must be started with `options.oracle`).

Every session counts the tokens it spends in `usage` (prompt and completion), so the
evaluator can hold an attempt to a token budget. `PolicySpec` is the serialisable
description a run stores in its manifest: `palaestra eval resume` rebuilds the same
policy from it (a key is never stored; only the name of the variable that holds it).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


def session_usage(session: object) -> dict[str, int]:
    """Tokens a session has spent so far (`{}` for sessions that count none)."""
    usage = getattr(session, "usage", None)
    if not isinstance(usage, dict):
        return {}
    return {str(k): int(v) for k, v in usage.items() if isinstance(v, int | float)}


def attempt_seed(reset: ResetResponse) -> int:
    """The evaluator's seed for this attempt (it puts it in `reset.info["seed"]`)."""
    value = reset.info.get("seed", 0)
    return int(value) if isinstance(value, int | float) else 0


class _Scripted:
    def __init__(self, action: Action) -> None:
        self._action = action
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

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


SYSTEM_PROMPT = (
    "You are solving a task in a sandboxed environment. Use the tools; call submit when done."
)


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


# -- text-completion models: tool calls parsed out of generated text ----------------------------

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


@dataclass
class HFPolicy:
    """A local Hugging Face transformers causal LM (CPU or GPU), never downloaded.

    The prompt is the tokenizer's chat template over the conversation (with the tools,
    where the template takes them); the reply is parsed for a tool call. Generation runs
    in a worker thread, one at a time per model, seeded per attempt."""

    path: str
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    device: str = "cpu"
    system_prompt: str = SYSTEM_PROMPT
    name: str = "hf"
    _loaded: tuple[Any, Any] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def reset_options(self) -> dict[str, Any]:
        return {}

    def load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is None:
                try:
                    from transformers import AutoModelForCausalLM, AutoTokenizer
                except ImportError:
                    raise PolicyError(
                        "the hf policy needs transformers and torch: pip install "
                        "'palaestra[train]'",
                        "policy_error",
                    ) from None
                try:
                    tokenizer: Any = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
                    model: Any = AutoModelForCausalLM.from_pretrained(
                        self.path, local_files_only=True
                    )
                except (OSError, ValueError) as exc:
                    raise PolicyError(
                        f"cannot load a local transformers model from {self.path!r}: {exc}",
                        "policy_error",
                    ) from None
                model.to(self.device)
                model.eval()
                self._loaded = (tokenizer, model)
            return self._loaded

    async def start(self, reset: ResetResponse) -> Session:
        await asyncio.to_thread(self.load)
        return _HFSession(self, reset)

    def generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int
    ) -> tuple[str, int, int]:
        """(text, prompt tokens, completion tokens); blocking: run it in a thread."""
        import torch

        tokenizer, model = self.load()
        with self._lock:
            prompt = _chat_prompt(tokenizer, messages, tools)
            encoded = tokenizer(prompt, return_tensors="pt").to(self.device)
            torch.manual_seed(seed)
            sample = self.temperature > 0
            kwargs: dict[str, Any] = {
                "max_new_tokens": self.max_new_tokens,
                "do_sample": sample,
                "pad_token_id": tokenizer.pad_token_id
                if tokenizer.pad_token_id is not None
                else tokenizer.eos_token_id,
            }
            if sample:
                kwargs["temperature"] = self.temperature
            with torch.no_grad():
                out = model.generate(**encoded, **kwargs)
            prompt_len = int(encoded["input_ids"].shape[1])
            new = out[0][prompt_len:]
            text = tokenizer.decode(new, skip_special_tokens=True)
            return str(text), prompt_len, int(new.shape[0])


def _chat_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> str:
    if getattr(tokenizer, "chat_template", None):
        try:
            return str(
                tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=True
                )
            )
        except Exception:  # a template that rejects tools: render without them
            return str(
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


class _HFSession:
    def __init__(self, policy: HFPolicy, reset: ResetResponse) -> None:
        self.policy = policy
        self.reset = reset
        self.tools = openai_tools(reset.tools)
        tool_text = json.dumps([t["function"] for t in self.tools])
        self.messages: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": f"{policy.system_prompt}\nTools: {tool_text}\nAnswer with "
                '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.',
            },
            {"role": "user", "content": render_observation(reset.observation)},
        ]
        self.turn = 0
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    async def act(self, last: StepResponse | None) -> Action:
        if last is not None:
            self.messages.append({"role": "user", "content": render_observation(last.observation)})
        seed = (self.policy.seed * 1_000_003 + attempt_seed(self.reset)) * 1009 + self.turn
        self.turn += 1
        try:
            text, prompt, completion = await asyncio.to_thread(
                self.policy.generate, self.messages, self.tools, seed
            )
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"generation failed: {exc!r:.300}", "policy_error") from None
        self.usage["prompt_tokens"] += prompt
        self.usage["completion_tokens"] += completion
        self.messages.append({"role": "assistant", "content": text})
        return parse_tool_call(text) or fallback_submit(text, self.reset.tools)

    async def aclose(self) -> None:
        return None


# -- a Python callable ---------------------------------------------------------------------------


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


# -- the serialisable description of a policy ---------------------------------------------------


class PolicySpec(BaseModel):
    """What a run's manifest records about its policy (never a key, only where it is)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["oracle", "null", "chat", "hf", "python"]
    target: str = Field(default="", description="hf: model dir; python: module:callable")
    base_url: str = ""
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = Field(default=1024, description="completion tokens a model call may use")
    seed: int = 0

    @property
    def label(self) -> str:
        if self.kind == "chat":
            return f"chat:{self.model}@{self.base_url}"
        if self.kind in ("hf", "python"):
            return f"{self.kind}:{self.target}"
        return self.kind


def parse_policy(
    value: str,
    *,
    base_url: str | None = None,
    model: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    temperature: float = 0.0,
    max_tokens: int = 1024,
    seed: int = 0,
) -> PolicySpec:
    """`oracle` | `null` | `chat` (with base_url and model) | an http(s) URL (chat there) |
    `hf:PATH` or a directory holding a transformers model | `module:callable`."""
    common = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed}
    if value in ("oracle", "null"):
        return PolicySpec(kind=value, **common)
    if value == "chat" or value.startswith(("http://", "https://")):
        url = value if value != "chat" else base_url
        if not url or not model:
            raise ValueError(
                "a chat policy needs the endpoint's base URL (--base-url, or the URL as "
                "--policy) and --model"
            )
        return PolicySpec(kind="chat", base_url=url, model=model, api_key_env=api_key_env, **common)
    if value.startswith("hf:") or (Path(value) / "config.json").is_file():
        path = value.removeprefix("hf:")
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"hf:{path}: no transformers model there (no config.json)")
        return PolicySpec(kind="hf", target=str(Path(path).resolve()), **common)
    target = value.removeprefix("py:")
    if ":" in target:
        return PolicySpec(kind="python", target=target, **common)
    raise ValueError(
        f"unknown policy {value!r}: use oracle, null, chat (with --base-url and --model), "
        "hf:MODEL_DIR or module:callable"
    )


def build_policy(spec: PolicySpec) -> Policy:
    """The live policy a spec describes; PolicyError when it cannot be built."""
    if spec.kind == "oracle":
        return OraclePolicy()
    if spec.kind == "null":
        return NullPolicy()
    if spec.kind == "chat":
        return ChatPolicy(
            base_url=spec.base_url,
            model=spec.model,
            api_key_env=spec.api_key_env,
            temperature=spec.temperature,
            max_tokens=spec.max_tokens,
            seed=spec.seed,
            name=spec.label,
        )
    if spec.kind == "hf":
        return HFPolicy(
            path=spec.target,
            max_new_tokens=spec.max_tokens,
            temperature=spec.temperature,
            seed=spec.seed,
            name=spec.label,
        )
    return CallablePolicy(target=spec.target, name=spec.label)
