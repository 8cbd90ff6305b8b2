"""Live progress of long CLI work, on stderr: done / total, rate, ETA and a short note.

On a terminal it is a rich bar redrawn in place. Anywhere else (a pipe, a CI log, a file)
it is plain lines: one at the start, then one every EVERY_S seconds when something changed,
one every HEARTBEAT_S seconds even when nothing did (a slow task never looks like a hang),
and a last one at the end. stdout stays for results, so `--json -` output is clean.

`pack check`, `pack import --build`, `images build`, `eval run|resume|report` and `train`
all report through `LiveProgress`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Task as BarTask
from rich.text import Text

from palaestra.cli.console import err

EVERY_S = 5.0  # plain mode: at most one line this often while work finishes
HEARTBEAT_S = 30.0  # plain mode: a line this often even when nothing finished


def duration(seconds: float) -> str:
    """'42s', '3m05s', '1h02m'."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _RateColumn(ProgressColumn):
    """Items a second, from rich's windowed speed estimate."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: BarTask) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:.2f} {self.unit}/s", style="cyan")


class LiveProgress:
    """Progress of `total` items (None until known: `start(total)`); `done` of them may be
    finished already (a resumed run: they count toward done, not toward the rate).

    `advance()` and `update()` may be called from any thread."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "tasks",
        done: int = 0,
        console: Console = err,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = total
        self.done = done
        self.note = ""
        self.console = console
        self.live = console.is_terminal if live is None else live
        self._first = done
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._changed = False
        self._last_line = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._open = False

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> LiveProgress:
        self.open()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(finished=kind is None)

    def open(self) -> None:
        """Show the bar (terminal) or the first line and start the ticker (plain)."""
        if self._open:
            return
        self._open = True
        self._started = self._clock()
        if self.live:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                _RateColumn(self.unit),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"),
                console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                self.label, total=self.total, completed=self.done, note=self.note
            )
            return
        if self.total is not None:
            self._emit()
        self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._ticker.start()

    def close(self, finished: bool = True) -> None:
        """Stop the bar, or print the last line (how much was done, in what time)."""
        if not self._open:
            return
        self._open = False
        self._stop.set()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            return
        if self._ticker is not None:
            self._ticker.join(timeout=1.0)
        with self._lock:
            elapsed = self._clock() - self._started
            rate = self._rate(elapsed)
            how = "done" if finished else "stopped at"
            total = f"/{self.total}" if self.total is not None else ""
            self.console.print(
                f"{self.label}: {how} {self.done}{total} {self.unit} in {duration(elapsed)}"
                + (f" ({rate:.2f} {self.unit}/s)" if rate else "")
                + (f" · {self.note}" if self.note else "")
            )

    # -- updates ---------------------------------------------------------------------------
    def start(self, total: int | None) -> None:
        """The total became known (e.g. once a pack is loaded): the work starts now."""
        with self._lock:
            self._started = self._clock()
        self.update(total=total)

    def advance(self, n: int = 1, note: str | None = None) -> None:
        self.update(advance=n, note=note)

    def update(
        self, *, advance: int = 0, total: int | None = None, note: str | None = None
    ) -> None:
        with self._lock:
            self.done += advance
            if total is not None:
                self.total = total
            if note is not None:
                self.note = note
            self._changed = True
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, total=self.total, note=self.note)
        elif self._open and total is not None:
            self._emit()

    def print(self, message: str) -> None:
        """A message above the bar (or a line between the plain lines)."""
        self.console.print(message)

    # -- plain lines -----------------------------------------------------------------------
    def _rate(self, elapsed: float) -> float:
        return (self.done - self._first) / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        """'pack check: 12/164 tasks (7%) · 0.81 tasks/s · ETA 3m08s · note'."""
        elapsed = self._clock() - self._started
        rate = self._rate(elapsed)
        parts = [f"{self.label}: {self.done}"]
        if self.total is not None:
            pct = 100.0 * self.done / self.total if self.total else 100.0
            parts[0] += f"/{self.total} {self.unit} ({pct:.0f}%)"
        else:
            parts[0] += f" {self.unit}"
        parts.append(f"{rate:.2f} {self.unit}/s" if rate else f"{duration(elapsed)} elapsed")
        if self.total is not None and rate > 0 and self.done < self.total:
            parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)

    def _emit(self) -> None:
        with self._lock:
            text = self.line()
            self._changed = False
            self._last_line = self._clock()
        self.console.print(text)

    def _tick(self) -> None:
        while not self._stop.wait(EVERY_S):
            quiet = self._clock() - self._last_line
            if self._changed or quiet >= HEARTBEAT_S:
                self._emit()
