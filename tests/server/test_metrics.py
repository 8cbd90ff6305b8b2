"""The lock-free step histogram exports what prometheus_client's own histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from palaestra.server.metrics import STEP_BUCKETS, LoopHistogram


def test_loop_histogram_renders_as_prometheus_client_does() -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LoopHistogram("x_seconds", "Some latency", "family", STEP_BUCKETS)
    ours_registry.register(ours)
    theirs = Histogram(
        "x_seconds", "Some latency", ["family"], buckets=STEP_BUCKETS, registry=theirs_registry
    )
    values = [0.0, 0.0005, 0.0007, 0.001, 0.003, 0.25, 0.2500001, 7.0, 30.0, 31.0, 1e9]
    for i, value in enumerate(values):
        family = "coding" if i % 3 else "echo"
        ours.labels(family).observe(value)
        theirs.labels(family=family).observe(value)

    def samples(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return sorted(line for line in text.splitlines() if not line.startswith("#"))

    assert samples(ours_registry) == [s for s in samples(theirs_registry) if "_created" not in s]
    assert 'x_seconds_bucket{family="echo",le="+Inf"} 4.0' in samples(ours_registry)
