"""`PolicySpec`, the serialisable description of a policy a run's manifest records (never a
key, only the variable that holds it), parsed from `--policy` and built into a live one."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from palaestra.sdk.policies.base import NullPolicy, OraclePolicy, Policy
from palaestra.sdk.policies.chat import ChatPolicy
from palaestra.sdk.policies.hf import HFPolicy
from palaestra.sdk.policies.python import CallablePolicy


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
    """`oracle` | `null` | `openai` or `chat` (with base_url and model) | an http(s) URL
    (chat there) | `hf:PATH` or a directory holding a transformers model | `module:callable`.

    `openai` names the same kind as `chat` (an OpenAI-compatible `/chat/completions` with
    tool calling); the manifest records kind `chat`, so runs made either way resume alike."""
    common = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed}
    if value in ("oracle", "null"):
        return PolicySpec(kind=value, **common)
    if value in ("chat", "openai") or value.startswith(("http://", "https://")):
        url = base_url if value in ("chat", "openai") else value
        if not url or not model:
            raise ValueError(
                f"--policy {value} needs the endpoint's base URL (--base-url, or the URL as "
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
        f"unknown policy {value!r}: use oracle, null, openai (with --base-url and --model), "
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
