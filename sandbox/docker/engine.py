"""The docker engine as the backend sees it: the SDK, the local socket, image names, what a
spec may ask for, and the labels that let a backend reap what a killed server left.

Images are built locally from images/ (`palaestra images build`); nothing is pulled.
`SandboxSpec.image` None is the base image (``palaestra/base:bookworm``), a bare name such
as ``"coding"`` is the family image ``palaestra/coding:latest``, anything with a ``/`` or
``:`` is used as it is.  Containers and volumes carry labels (``palaestra.sandbox``, the
owner's host, pid and process start time); a backend removes those whose owner process is
gone at its first create.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import socket
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from palaestra.sandbox import seccomp
from palaestra.sandbox.base import (
    SandboxCreateError,
    SandboxSpec,
    SandboxSpecError,
    check_ro_binds,
)

BASE_IMAGE = "palaestra/base:bookworm"
LABEL = "palaestra.sandbox"
MAX_PIDS = 32768
MAX_WORKSPACE_MB = 64 * 1024


# A docker reference: [host[:port]/]name[/name...][:tag][@sha256:digest]; never a path.
_IMAGE_REF = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[0-9a-f]{64})?\Z"
)


def image_ref(image: str | None, default: str = BASE_IMAGE) -> str:
    """The docker image a `SandboxSpec.image` names (see the module docstring); a host
    path ('/', '../x', '/root/...') is refused, not handed to the engine."""
    if image is None:
        return default
    if not _IMAGE_REF.match(image) or ".." in image:
        raise SandboxSpecError(
            f"image {image!r}: the docker backend takes an image name (e.g. 'coding' or "
            "'palaestra/base:bookworm'), never a host path"
        )
    if "/" in image or ":" in image:
        return image
    return f"palaestra/{image}:latest"


def import_docker() -> Any:
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the docker extra is not installed
        raise SandboxCreateError("the docker backend needs `pip install palaestra[docker]`") from e
    return docker


def docker_available(timeout: float = 5.0) -> tuple[bool, str]:
    """Whether the local engine answers (`docker info`); (False, why) if not."""
    try:
        docker = import_docker()
        client = docker.from_env(timeout=timeout)
        try:
            info = client.info()
        finally:
            client.close()
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return True, f"docker {info.get('ServerVersion', '?')} ({info.get('Driver', '?')})"


def socket_path() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    url = urlparse(host)
    if url.scheme not in ("unix", ""):
        raise SandboxCreateError(
            f"the docker backend needs the local engine's unix socket, not DOCKER_HOST={host}"
        )
    return url.path or "/var/run/docker.sock"


@cache
def owner() -> dict[str, str]:
    """Labels that tell whether the process that made a container is still alive."""
    pid = os.getpid()
    return {
        "palaestra.owner.host": socket.gethostname(),
        "palaestra.owner.pid": str(pid),
        "palaestra.owner.start": _start_time(pid),
    }


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_alive(labels: dict[str, str]) -> bool:
    if labels.get("palaestra.owner.host") != socket.gethostname():
        return True  # another machine's: not ours to judge
    pid = labels.get("palaestra.owner.pid", "")
    if not pid.isdigit():
        return False
    start = _start_time(int(pid))
    return bool(start) and start == labels.get("palaestra.owner.start", start)


def host_limits() -> tuple[int, int]:
    """(memory MiB, CPUs) of this machine."""
    mem = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    return mem, os.cpu_count() or 1


@cache
def seccomp_profile(traces_execs: bool = False) -> str:
    """Our seccomp policy as docker's JSON profile (`seccomp.docker_profile`), once."""
    profile = seccomp.docker_profile(traces_execs=traces_execs)
    return json.dumps(profile, separators=(",", ":"))


def check_spec(spec: SandboxSpec) -> None:
    """Raise `SandboxSpecError` when the spec asks for more than this host has."""
    image_ref(spec.image)  # a path is refused before anything else
    mem, cpus = host_limits()
    if spec.memory_mb < 16 or (mem and spec.memory_mb > mem):
        raise SandboxSpecError(f"memory_mb={spec.memory_mb}: must be 16..{mem} on this host")
    if not 0 < spec.cpus <= cpus:
        raise SandboxSpecError(f"cpus={spec.cpus}: must be > 0 and <= {cpus} on this host")
    if not 8 <= spec.pids <= MAX_PIDS:
        raise SandboxSpecError(f"pids={spec.pids}: must be 8..{MAX_PIDS}")
    top = min(MAX_WORKSPACE_MB, mem // 2) if mem else MAX_WORKSPACE_MB
    if not 1 <= spec.workspace_mb <= top:
        raise SandboxSpecError(f"workspace_mb={spec.workspace_mb}: must be 1..{top}")
    if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) in ("/", "/tmp"):
        raise SandboxSpecError(f"workdir must be an absolute path below /: {spec.workdir!r}")
    check_ro_binds(spec)


def owned_by_us(client: Any) -> tuple[list[Any], list[Any]]:
    """(containers, volumes) this process made: its owner labels are the run's label, so a
    stopped command finds exactly what it started (and no other process's)."""
    mine = owner()
    wanted = [LABEL, *(f"{k}={v}" for k, v in mine.items())]
    # sparse: no inspect of each (one removed meanwhile would fail the whole listing)
    containers = client.containers.list(all=True, sparse=True, filters={"label": wanted})
    volumes = client.volumes.list(filters={"label": wanted})
    return containers, volumes


def remove_owned(client: Any) -> set[str]:
    """Force-remove every container and volume this process made (in parallel, a stop
    cannot wait a second a container); the ids of the containers removed."""
    from concurrent.futures import ThreadPoolExecutor

    containers, volumes = owned_by_us(client)
    removed: set[str] = set()

    def drop(c: Any) -> None:
        with contextlib.suppress(Exception):
            c.remove(force=True)
            removed.add(str(c.id))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(drop, containers))
    for v in volumes:  # a volume is free once its container is gone
        with contextlib.suppress(Exception):
            v.remove(force=True)
    return removed


def reap_stale(client: Any) -> int:
    """Remove the containers and volumes of palaestra processes that are gone; how many."""
    n = 0
    with contextlib.suppress(Exception):
        for c in client.containers.list(all=True, filters={"label": LABEL}):
            if not owner_alive(c.labels):
                with contextlib.suppress(Exception):
                    c.remove(force=True)
                    n += 1
    with contextlib.suppress(Exception):
        for v in client.volumes.list(filters={"label": LABEL}):
            if not owner_alive(v.attrs.get("Labels") or {}):
                with contextlib.suppress(Exception):
                    v.remove(force=True)
    return n
