"""The plain progress lines (stderr not a terminal) and the stop line's wording."""

from __future__ import annotations

import io

from rich.console import Console

from palaestra.cli.progress import LiveProgress, duration
from palaestra.sandbox.sweep import Running


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain(total: int | None, **kw: object) -> tuple[LiveProgress, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, width=200, markup=False, highlight=False)
    progress = LiveProgress("pack check", total, console=console, clock=clock, **kw)  # type: ignore[arg-type]
    return progress, out, clock


def test_plain_lines_give_done_total_rate_and_eta() -> None:
    progress, out, clock = plain(8)
    with progress:
        clock.now += 10
        progress.advance(2)
        assert progress.line() == "pack check: 2/8 tasks (25%) · 0.20 tasks/s · ETA 30s"
        progress.advance(note="1 problem")
        assert progress.line().endswith("ETA 17s · 1 problem")
        clock.now += 20
        progress.advance(5)
    lines = out.getvalue().splitlines()
    assert lines[0] == "pack check: 0/8 tasks (0%) · 0s elapsed"  # at once, before any work
    assert lines[-1] == "pack check: done 8/8 tasks in 30s (0.27 tasks/s) · 1 problem"


def test_total_learned_later_and_a_resumed_run_counts_only_new_work_in_the_rate() -> None:
    progress, out, clock = plain(None, done=6, unit="attempts")
    progress.open()
    assert out.getvalue() == ""  # no line until the total is known
    progress.start(10)
    clock.now += 4
    progress.advance()
    assert progress.line() == "pack check: 7/10 attempts (70%) · 0.25 attempts/s · ETA 12s"
    progress.close(finished=False)
    assert out.getvalue().splitlines()[-1].startswith("pack check: stopped at 7/10 attempts")


def test_durations_and_what_a_stop_removed() -> None:
    assert [duration(s) for s in (4.4, 65, 3 * 3600 + 125)] == ["4s", "1m05s", "3h02m"]
    assert Running().describe() == "nothing"
    assert Running(sandboxes={1}).describe() == "1 bwrap sandbox"
    both = Running(sandboxes={1, 2}, containers={"a"}, processes={3, 4})
    assert both.describe() == "1 docker container, 2 bwrap sandboxes and 2 other processes"
