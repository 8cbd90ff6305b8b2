"""A cluster front's /metrics: every worker's series labelled by worker, merged per family."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from palaestra.server.cluster.metrics import FRONT, Scrape, exposition
from palaestra.server.cluster.placement import WorkerInfo
from palaestra.server.metrics import Metrics

ECHO = "palaestra/echo:say-birch"

FRONT_TEXT = b"""\
# HELP palaestra_episodes_ended_total Episodes ended, by final status
# TYPE palaestra_episodes_ended_total counter
palaestra_episodes_ended_total{status="void"} 2.0
# HELP palaestra_sandboxes_live Sandboxes alive now
# TYPE palaestra_sandboxes_live gauge
palaestra_sandboxes_live 0.0
"""

WORKER_TEXT = b"""\
# HELP palaestra_episodes_ended_total Episodes ended, by final status
# TYPE palaestra_episodes_ended_total counter
palaestra_episodes_ended_total{status="done"} 7.0
palaestra_episodes_ended_total{status="void"} 1.0
# HELP palaestra_sandboxes_live Sandboxes alive now
# TYPE palaestra_sandboxes_live gauge
palaestra_sandboxes_live 3.0
# HELP palaestra_step_seconds Step latency inside the server
# TYPE palaestra_step_seconds histogram
palaestra_step_seconds_bucket{family="echo",le="0.001"} 4.0
palaestra_step_seconds_bucket{family="echo",le="+Inf"} 5.0
palaestra_step_seconds_count{family="echo"} 5.0
palaestra_step_seconds_sum{family="echo"} 0.25
"""


def info(name: str, live: int = 0, slots: int = 4) -> WorkerInfo:
    return WorkerInfo(
        name=name, node="n-" + name, host="127.0.0.1", port=1, key="00", live=live, slots=slots
    )


def samples(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if line and not line.startswith("#")]


def test_samples_with_and_without_labels_get_the_worker_label_and_families_appear_once() -> None:
    out = exposition(
        FRONT_TEXT,
        [Scrape(info("w1", live=2), WORKER_TEXT), Scrape(info("w2", live=1), WORKER_TEXT)],
    )
    lines = out.decode().splitlines()
    for family in (
        "palaestra_episodes_ended_total",
        "palaestra_sandboxes_live",
        "palaestra_step_seconds",
        "palaestra_worker_up",
    ):
        assert lines.count(f"# HELP {family} " + _help(lines, family)) == 1, family
        assert sum(line.startswith(f"# TYPE {family} ") for line in lines) == 1, family
    got = samples(out)
    assert 'palaestra_sandboxes_live{worker="front"} 0.0' in got
    assert 'palaestra_sandboxes_live{worker="w1"} 3.0' in got
    assert 'palaestra_episodes_ended_total{status="void",worker="front"} 2.0' in got
    assert 'palaestra_episodes_ended_total{status="done",worker="w2"} 7.0' in got
    assert 'palaestra_step_seconds_bucket{family="echo",le="+Inf",worker="w1"} 5.0' in got
    assert 'palaestra_step_seconds_sum{family="echo",worker="w2"} 0.25' in got
    assert 'palaestra_worker_up{worker="w1"} 1.0' in got
    assert 'palaestra_worker_episodes{worker="w1"} 2.0' in got
    assert 'palaestra_worker_slots{worker="w2"} 4.0' in got
    # Prometheus's own parser reads it back, every sample of a family together.
    parsed = {f.name: f for f in text_string_to_metric_families(out.decode())}
    assert {s.labels["worker"] for s in parsed["palaestra_sandboxes_live"].samples} == {
        FRONT,
        "w1",
        "w2",
    }
    assert len(parsed["palaestra_step_seconds"].samples) == 8


def _help(lines: list[str], family: str) -> str:
    found = [line for line in lines if line.startswith(f"# HELP {family} ")]
    assert found, f"no HELP for {family}"
    return found[0].removeprefix(f"# HELP {family} ")


def test_a_worker_that_did_not_answer_or_answered_garbage_is_down_with_no_series() -> None:
    out = exposition(
        FRONT_TEXT,
        [
            Scrape(info("ok"), WORKER_TEXT),
            Scrape(info("silent", live=3), None),
            Scrape(info("garbled"), b"palaestra_x{unclosed 1\n"),
        ],
    )
    got = samples(out)
    assert 'palaestra_worker_up{worker="ok"} 1.0' in got
    assert 'palaestra_worker_up{worker="silent"} 0.0' in got
    assert 'palaestra_worker_up{worker="garbled"} 0.0' in got
    assert 'palaestra_worker_episodes{worker="silent"} 3.0' in got  # the front's last report
    for name in ("silent", "garbled"):
        assert [s for s in got if f'worker="{name}"' in s and "palaestra_worker_" not in s] == []


def test_a_worker_label_of_the_workers_own_is_replaced_and_a_real_registry_round_trips() -> None:
    metrics = Metrics()
    metrics.episodes_started.labels(family="echo").inc(3)
    metrics.step_seconds.labels("echo").observe(0.01)
    sneaky = b'# TYPE palaestra_odd gauge\npalaestra_odd{worker="front"} 9.0\n'
    out = exposition(FRONT_TEXT, [Scrape(info("w1"), metrics.render()), Scrape(info("w2"), sneaky)])
    got = samples(out)
    assert 'palaestra_episodes_started_total{family="echo",worker="w1"} 3.0' in got
    assert 'palaestra_step_seconds_count{family="echo",worker="w1"} 1.0' in got
    assert 'palaestra_odd{worker="w2"} 9.0' in got
    assert not any('worker="front"' in s for s in got if s.startswith("palaestra_odd"))


def test_a_family_whose_type_differs_between_versions_keeps_the_first() -> None:
    other = b"# TYPE palaestra_sandboxes_live_total counter\npalaestra_sandboxes_live_total 5.0\n"
    got = samples(exposition(FRONT_TEXT, [Scrape(info("old"), other)]))
    assert 'palaestra_sandboxes_live{worker="front"} 0.0' in got
    assert not any('worker="old"' in s and "sandboxes" in s for s in got)
    assert 'palaestra_worker_up{worker="old"} 1.0' in got
