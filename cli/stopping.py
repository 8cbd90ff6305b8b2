"""Ctrl-C and SIGTERM for long CLI commands: stop within seconds, leave nothing running.

    with Stop("pack check") as stop:
        report = stop.run(check_pack(...))      # async work
        build_images()                          # sync work

The first signal cancels the command's main task (async work under `stop.run`), or raises
`Stopped` in the main thread (sync work), so the command's own cleanup runs: episodes end,
sandboxes close through their backends, partial results are written (a command that keeps
some says where with `keep`). Then the sweep (sandbox/sweep.py) kills what is left among
this process's descendants (bwrap sandboxes, builds) and removes the docker containers that
carry its owner labels, one line on stderr says what was removed and what was kept, and the
exit status is 128 + the signal (130 for SIGINT, 143 for SIGTERM).

A watchdog thread bounds all of it: when the cleanup takes longer than GRACE_S, or a second
signal comes, it sweeps and exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from types import FrameType, TracebackType
from typing import Any, TypeVar

import typer

from palaestra.cli.console import err
from palaestra.sandbox.sweep import Running, containers, processes, sweep

T = TypeVar("T")

GRACE_S = 5.0  # how long the command's own cleanup may take before the sweep forces it
EXIT_GRACE_S = 10.0  # after the stop line: how long the interpreter may take to exit
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread of a command that is being stopped."""


_active: Stop | None = None


def keep(text: str) -> None:
    """Say what partial results survive a stop (e.g. a run directory and how to resume it):
    the stop's line ends with it; printed at once where no `Stop` is active."""
    if _active is not None:
        _active.kept = text
    else:
        err.print(f"interrupted: {text}")


class Stop:
    """The stop handling of one command (see the module docstring)."""

    def __init__(self, command: str, *, grace_s: float = GRACE_S) -> None:
        self.command = command
        self.grace_s = grace_s
        self.signum: int | None = None
        self.kept: str | None = None
        self._old: dict[int, Any] = {}
        self._outer: Stop | None = None  # a command's Stop around this one (pack import)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._before = Running()
        self._snapshot = threading.Event()
        self._hurry = threading.Event()
        self._finished = threading.Event()
        self._finishing = threading.Lock()

    @property
    def code(self) -> int:
        return 128 + (self.signum or 0)

    # -- the with block --------------------------------------------------------------------
    def __enter__(self) -> Stop:
        global _active
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only (a command run by a test thread)
        for sig in SIGNALS:
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue  # started with it ignored (nohup, a background job): keep it so
            self._old[sig] = signal.signal(sig, self._on_signal)
        if self._old:
            self._outer, _active = _active, self
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        global _active
        if self.signum is None:
            for sig, old in self._old.items():
                signal.signal(sig, old)
            if self._old:
                _active = self._outer
            return
        self._finish()  # raises typer.Exit; the handlers stay: a second signal hurries

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`asyncio.run(coro)`, stopped by cancelling its task at the first signal."""

        async def main() -> T:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            if self.signum is not None:  # it came before the loop ran
                coro.close()
                raise Stopped
            return await coro

        executor = _Executor(self)
        try:
            with asyncio.Runner() as runner:
                runner.get_loop().set_default_executor(executor)
                result = runner.run(main())
        except BaseException:
            if self.signum is not None:
                raise Stopped from None
            raise
        finally:
            self._loop = self._task = None
        if self.signum is not None:  # the work ended while it was being stopped
            raise Stopped
        return result

    # -- the stop --------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            self._hurry.set()  # a second signal: the watchdog sweeps and exits now
            return
        self.signum = signum
        # Work cut off mid-flight logs errors (a sandbox closed under a verify): the stop's
        # own line says what happened.
        logging.disable(logging.ERROR)
        with contextlib.suppress(Exception):  # before the cleanup closes any of them
            self._before = processes()
        threading.Thread(target=self._watch, name="stop-watchdog", daemon=True).start()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)
            return
        raise Stopped

    def _watch(self) -> None:
        with contextlib.suppress(Exception):
            self._before = self._before | containers()
        self._snapshot.set()
        self._hurry.wait(self.grace_s)
        if self._finishing.acquire(blocking=False):
            self._end(forced=True)
        # The main thread printed the line: the interpreter may now exit, but not hang.
        self._finished.wait()
        self._hurry.wait(EXIT_GRACE_S)
        _exit(self.code)

    def _finish(self) -> None:
        if not self._finishing.acquire(blocking=False):
            self._finished.wait()  # the watchdog is ending the process
            _exit(self.code)
        self._snapshot.wait(self.grace_s)
        self._end(forced=False)
        main = threading.main_thread()
        if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
            _exit(self.code)  # a worker thread still blocked in a call: never wait on it
        raise typer.Exit(self.code)

    def _end(self, *, forced: bool) -> None:
        """Sweep, then the one line: what was removed, what was kept."""
        if forced and err.is_terminal:
            with contextlib.suppress(Exception):
                err.show_cursor(True)
                err.file.write("\n")
        try:
            removed = self._before | sweep()
        except Exception as exc:  # the line still tells the user
            removed = self._before
            err.print(f"the sweep failed: {type(exc).__name__}: {exc}")
        name = signal.Signals(self.signum or 0).name
        what = removed.describe()
        text = f"{self.command} stopped by {name}: " + (
            "nothing was left running" if what == "nothing" else f"removed {what}"
        )
        if forced:
            text += f" (its cleanup did not finish within {self.grace_s:g} s)"
        if self.kept:
            text += f"; {self.kept}"
        err.print(text)
        self._finished.set()
        if forced:
            _exit(self.code)


class _Executor(ThreadPoolExecutor):
    """The loop's default executor: once the command is being stopped, the loop's shutdown
    does not wait for threads still blocked in a call (their work is abandoned and swept)."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(thread_name_prefix="palaestra-cli")
        self._stopper = stop

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        stopping = self._stopper.signum is not None
        super().shutdown(wait=wait and not stopping, cancel_futures=cancel_futures or stopping)


def _exit(code: int) -> None:
    """Exit now, with what was written flushed (worker threads may still be blocked)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
