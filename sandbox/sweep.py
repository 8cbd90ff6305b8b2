"""What this process started that still runs, and the sweep that removes it when a command
is stopped (Ctrl-C, SIGTERM): bwrap sandboxes and every other process among its
descendants, docker containers and volumes carrying its owner labels (docker/engine.py).

A graceful stop closes sandboxes through their backends; the sweep is what makes a stop
complete even when that shutdown was cut short (a create still in a worker thread, a wedged
episode, a second Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BWRAP = "bwrap"


@dataclass
class Running:
    """What a process started that is (or was) running: bwrap sandboxes (top-level bwrap
    process ids), docker container ids, other descendant process ids."""

    sandboxes: set[int] = field(default_factory=set)
    containers: set[str] = field(default_factory=set)
    processes: set[int] = field(default_factory=set)

    def __or__(self, other: Running) -> Running:
        return Running(
            self.sandboxes | other.sandboxes,
            self.containers | other.containers,
            self.processes | other.processes,
        )

    def describe(self) -> str:
        """'2 docker containers, 5 bwrap sandboxes and 1 process', or 'nothing'."""
        parts = [
            f"{n} {one if n == 1 else many}"
            for n, one, many in (
                (len(self.containers), "docker container", "docker containers"),
                (len(self.sandboxes), "bwrap sandbox", "bwrap sandboxes"),
                (len(self.processes), "other process", "other processes"),
            )
            if n
        ]
        if not parts:
            return "nothing"
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name), from /proc."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            found[int(entry.name)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), name)
    return found


def descendants(root: int | None = None) -> dict[int, tuple[int, str]]:
    """Every process below `root` (default: this one): pid -> (parent pid, name)."""
    root = os.getpid() if root is None else root
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[int, str]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = table[pid]
        todo.extend(children.get(pid, []))
    return out


def _docker_client() -> Any:
    """A client of the local engine, only where this process used docker (the SDK is
    imported): a command that never touched docker never waits on it."""
    if "docker" not in sys.modules:
        return None
    from palaestra.sandbox.docker.engine import import_docker

    with contextlib.suppress(Exception):
        return import_docker().from_env(timeout=10)
    return None


def processes() -> Running:
    """The bwrap sandboxes and other processes this process started that run now (a read
    of /proc: quick enough for a signal handler)."""
    found = Running()
    procs = descendants()
    for pid, (ppid, name) in procs.items():
        if name == BWRAP and procs.get(ppid, (0, ""))[1] != BWRAP:
            found.sandboxes.add(pid)
    top = {pid for pid, (ppid, _) in procs.items() if ppid not in procs}
    found.processes = top - found.sandboxes
    return found


def containers() -> Running:
    """The docker containers this process made that exist now (asks the engine)."""
    found = Running()
    client = _docker_client()
    if client is not None:
        from palaestra.sandbox.docker.engine import owned_by_us

        with contextlib.suppress(Exception):
            made, _ = owned_by_us(client)
            found.containers = {str(c.id) for c in made}
        client.close()
    return found


def sweep(rounds: int = 3) -> Running:
    """Kill every descendant process (bwrap sandboxes among them) and force-remove every
    docker container and volume this process made; what was still there."""
    return kill_descendants(rounds) | remove_containers()


def kill_descendants(rounds: int = 3) -> Running:
    """SIGKILL every descendant process of this one (bwrap sandboxes among them); what was
    running. Only for a process about to exit: a test runner's own servers die too."""
    removed = Running()
    for _ in range(rounds):  # a process forked while we killed its parent: again
        procs = descendants()
        if not procs:
            break
        for pid, (ppid, name) in procs.items():
            if ppid in procs:
                continue
            (removed.sandboxes if name == BWRAP else removed.processes).add(pid)
        for pid in procs:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for pid in list(descendants()):  # reap what were our own children
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)
    return removed


def remove_containers() -> Running:
    """Force-remove every docker container and volume this process made; the containers."""
    removed = Running()
    client = _docker_client()
    if client is not None:
        from palaestra.sandbox.docker.engine import remove_owned

        with contextlib.suppress(Exception):
            removed.containers = remove_owned(client)
        client.close()
    return removed
