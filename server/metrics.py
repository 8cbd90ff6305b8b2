"""Prometheus metrics, one registry per server (no process-global state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.episodes_started = Counter(
            "palaestra_episodes_started", "Episodes started", ["family"], registry=self.registry
        )
        self.episodes_ended = Counter(
            "palaestra_episodes_ended",
            "Episodes ended, by final status",
            ["status"],
            registry=self.registry,
        )
        self.episodes_live = Gauge(
            "palaestra_episodes_live",
            "Episodes in memory now, by status",
            ["status"],
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "palaestra_step_seconds",
            "Step latency inside the server",
            ["family"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.verify_seconds = Histogram(
            "palaestra_verify_seconds",
            "Verification time",
            ["family"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.sandboxes_live = Gauge(
            "palaestra_sandboxes_live", "Sandboxes alive now", registry=self.registry
        )
        self.tasks_quarantined = Gauge(
            "palaestra_tasks_quarantined",
            "Tasks the sampler holds back after repeated void episodes",
            registry=self.registry,
        )

    def bind_live(
        self, live_by_status: Callable[[], dict[str, int]], sandboxes: Callable[[], int]
    ) -> None:
        """Read live gauges at scrape time from the manager, so they never drift."""
        self._live_by_status = live_by_status
        self.sandboxes_live.set_function(lambda: float(sandboxes()))

    def bind_sampler(self, quarantined: Callable[[], int]) -> None:
        """Read the sampler's quarantine count at scrape time."""
        self.tasks_quarantined.set_function(lambda: float(quarantined()))

    def bind_pool(self, stats: Callable[[], Any]) -> None:
        """Expose a warm pool's counters (`WarmPool.stats`), read at scrape time."""
        self.registry.register(_PoolCollector(stats))

    def render(self) -> bytes:
        live = getattr(self, "_live_by_status", None)
        if live is not None:
            for status, count in live().items():
                self.episodes_live.labels(status=status).set(count)
        return generate_latest(self.registry)


class _PoolCollector:
    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        s = self._stats()
        yield CounterMetricFamily(
            "palaestra_sandbox_pool_hits", "Sandboxes handed out warm from the pool", s.hits
        )
        yield CounterMetricFamily(
            "palaestra_sandbox_pool_misses", "Sandboxes created cold (pool empty)", s.misses
        )
        yield GaugeMetricFamily(
            "palaestra_sandbox_pool_ready", "Warm sandboxes ready in the pool", s.pooled
        )
