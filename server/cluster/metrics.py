"""A cluster front's /metrics: its own series and every live worker's, in one exposition.

Each worker renders its own Prometheus text (`EpisodeWorker.metrics`); the front labels
every sample of it `worker="<name>"` and its own `worker="front"`, merges the samples of a
family under one `# HELP`/`# TYPE`, and adds a gauge per worker of its episodes, slots and
whether it answered (`palaestra_worker_up`). A worker that did not answer in time, or
answered text that does not parse, is `up 0` with no other series.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from palaestra.server.cluster.placement import WorkerInfo

LABEL = "worker"
FRONT = "front"


@dataclass(frozen=True)
class Scrape:
    """One worker's state at the front and the text it answered (None: no answer)."""

    info: WorkerInfo
    text: bytes | None


def labelled(text: str, worker: str) -> list[Metric]:
    """The families of `text` with `worker="<worker>"` on every sample; ValueError if it
    does not parse."""
    families = []
    for family in text_string_to_metric_families(text):
        out = Metric(family.name, family.documentation, family.type, family.unit)
        for sample in family.samples:
            labels = {LABEL: worker, **{k: v for k, v in sample.labels.items() if k != LABEL}}
            out.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
        families.append(out)
    return families


def merge(parts: list[list[Metric]]) -> list[Metric]:
    """One family per name, its samples in the order of `parts`; a family whose type differs
    from the first part's (two versions mid-upgrade) keeps the first part's samples only."""
    merged: dict[str, Metric] = {}
    for families in parts:
        for family in families:
            into = merged.get(family.name)
            if into is None:
                merged[family.name] = into = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            if into.type == family.type:
                into.samples.extend(family.samples)
    return list(merged.values())


def worker_gauges(up: list[tuple[WorkerInfo, bool]]) -> list[Metric]:
    """What the front knows of each worker, whether or not it answered."""
    answered = GaugeMetricFamily(
        "palaestra_worker_up", "1 when the worker answered this scrape", labels=[LABEL]
    )
    live = GaugeMetricFamily(
        "palaestra_worker_episodes", "Live episodes on the worker (its last report)", labels=[LABEL]
    )
    slots = GaugeMetricFamily(
        "palaestra_worker_slots", "Episodes the worker may host at once", labels=[LABEL]
    )
    for info, ok in up:
        answered.add_metric([info.name], 1.0 if ok else 0.0)
        live.add_metric([info.name], float(info.live))
        slots.add_metric([info.name], float(info.slots))
    return [answered, live, slots]


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def exposition(own: bytes, scrapes: list[Scrape]) -> bytes:
    """The front's exposition: its own text and its workers', labelled and merged."""
    parts = [labelled(own.decode(), FRONT)]
    up = []
    for scrape in scrapes:
        families = None
        if scrape.text is not None:
            try:
                families = labelled(scrape.text.decode(), scrape.info.name)
            except (ValueError, UnicodeDecodeError):
                families = None
        if families is not None:
            parts.append(families)
        up.append((scrape.info, families is not None))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merge(parts) + worker_gauges(up)))
    return generate_latest(registry)
