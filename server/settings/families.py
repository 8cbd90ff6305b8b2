"""What families are handed: their own settings slices, and the judge endpoints their
verifiers ask for (verifiers/judge_endpoint.py, docs/reference/judges.md)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)

from palaestra.server import family_slices
from palaestra.server.settings.shown import secret_shown

JUDGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class JudgeEndpointSettings(BaseModel):
    """One judge endpoint (`judges.<name>`): any OpenAI-compatible /chat/completions, with
    the limits every episode on this server shares (verifiers/judge_endpoint.py)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        description="the OpenAI base URL, http(s)://HOST[:PORT]/v1 (or the full …/chat/completions)"
    )
    model: str = Field(min_length=1, description="the model the endpoint is asked for")
    api_key: SecretStr | None = Field(default=None, description="sent as a bearer token")
    max_concurrency: int = Field(
        default=16, ge=1, le=4096, description="requests in flight at most (per server process)"
    )
    deadline_s: float = Field(
        default=120.0,
        gt=0,
        allow_inf_nan=False,
        description="one judge call at most, queueing, cool-downs and retries included",
    )
    max_retries: int = Field(default=4, ge=0, le=100, description="retries of one call at most")
    retry_ratio: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="retries at most this share of the last minute's calls (plus retry_floor)",
    )
    retry_floor: int = Field(
        default=10, ge=0, description="retries a quiet endpoint may make in a minute anyway"
    )
    timeout_s: float = Field(
        default=60.0, gt=0, allow_inf_nan=False, description="one HTTP request at most"
    )
    retry_after_cap_s: float = Field(
        default=60.0, gt=0, allow_inf_nan=False, description="a Retry-After is honoured up to it"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        """The URL stripped of surrounding whitespace (a pasted newline); one with a space
        or control character inside is refused here, not when the first judge call fails."""
        value = value.strip()
        if any(ord(c) <= 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
            raise ValueError(f"{value!r} holds a space or a control character; write the URL alone")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{value!r} is no endpoint URL: write http(s)://HOST[:PORT]/v1, the "
                "OpenAI base URL of the judge server"
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("write the URL without query, fragment or user info (the key "
                             "goes in api_key)")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _timeout_fits(self) -> JudgeEndpointSettings:
        if self.timeout_s > self.deadline_s:
            raise ValueError("timeout_s (one request) must be at most deadline_s (the call)")
        return self

    @field_serializer("api_key", when_used="json")
    def _key_shown(self, value: SecretStr | None, info: FieldSerializationInfo) -> str | None:
        """Masked, except for the settings a cluster front hands its workers."""
        return secret_shown(value, info)


class JudgeSettings(BaseModel):
    """Judges (verifiers/judge_endpoint.py, docs/reference/judges.md "Endpoint operations"):
    the endpoints by name and the judgements kept in memory."""

    model_config = ConfigDict(extra="forbid")

    judges: dict[str, JudgeEndpointSettings] = Field(
        default_factory=dict,
        description=(
            "judge endpoints by name, which a family's verifier asks for (ctx.judges); "
            "toml [judges.NAME] url, model, api_key, …; env: JSON"
        ),
    )
    judge_cache_entries: int = Field(
        default=10_000, ge=1, description="judgements kept in memory (least recently used go)"
    )

    @field_validator("judges")
    @classmethod
    def _judge_names(
        cls, value: dict[str, JudgeEndpointSettings]
    ) -> dict[str, JudgeEndpointSettings]:
        for name in value:
            if not JUDGE_NAME.fullmatch(name):
                raise ValueError(
                    f"judge name {name!r}: letters, digits, '_', '.', '-', at most 64, "
                    "starting with a letter or digit"
                )
        return value


class FamiliesSettings(BaseModel):
    """Each family's own settings, by family name (server/family_slices.py; a family
    validates its slice with its `settings_model`)."""

    model_config = ConfigDict(extra="forbid")

    families: family_slices.FamilySlices = Field(
        default_factory=dict, description=family_slices.HELP
    )
