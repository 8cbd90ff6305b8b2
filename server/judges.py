"""The server's judge endpoints (`Judges`, what `ctx.judges` is): built once from
Settings.judges, shared by every episode of this process, closed at shutdown.

In cluster mode every worker builds its own from the same settings, so an endpoint's cap
and retry budget hold per worker process (docs/reference/judges.md, "Endpoint operations").
"""

from __future__ import annotations

from collections.abc import Mapping

from palaestra.server.config import JudgeEndpointSettings, Settings
from palaestra.server.metrics import JudgeMetrics
from palaestra.verifiers.judge_endpoint import (
    EndpointConfig,
    JudgeEndpoint,
    JudgeRecorder,
    MemoryJudgeCache,
    make_pool,
)
from palaestra.verifiers.judge_protocol import JudgeCache, JudgeChat, JudgeUnavailable


def endpoint_config(name: str, settings: JudgeEndpointSettings) -> EndpointConfig:
    key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    return EndpointConfig(
        name=name,
        url=settings.url,
        model=settings.model,
        api_key=key,
        max_concurrency=settings.max_concurrency,
        deadline_s=settings.deadline_s,
        max_retries=settings.max_retries,
        retry_ratio=settings.retry_ratio,
        retry_floor=settings.retry_floor,
        timeout_s=settings.timeout_s,
        retry_after_cap_s=settings.retry_after_cap_s,
    )


class ServerJudges:
    """`Judges` over the configured endpoints, one connection pool for all of them."""

    def __init__(
        self,
        endpoints: Mapping[str, JudgeEndpointSettings],
        *,
        recorder: JudgeRecorder | None = None,
        cache_entries: int = 10_000,
    ) -> None:
        configs = [endpoint_config(name, s) for name, s in endpoints.items()]
        self._pool = make_pool()
        self._endpoints = {
            c.name: JudgeEndpoint(c, pool=self._pool, recorder=recorder) for c in configs
        }
        self._cache = MemoryJudgeCache(cache_entries)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: JudgeMetrics) -> ServerJudges:
        for name in settings.judges:
            metrics.declare(name)
        return cls(settings.judges, recorder=metrics, cache_entries=settings.judge_cache_entries)

    @property
    def names(self) -> list[str]:
        return sorted(self._endpoints)

    def get(self, name: str) -> JudgeChat:
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            raise JudgeUnavailable(name, "no judge endpoint of that name is configured")
        return endpoint

    @property
    def cache(self) -> JudgeCache:
        return self._cache

    async def aclose(self) -> None:
        await self._pool.aclose()
