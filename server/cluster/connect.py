"""Connecting a front to Ray: a cluster's address, `auto`, or a local N-node cluster.

`local:N` starts N Ray nodes on this machine (`ray.cluster_utils.Cluster`, every node on
127.0.0.1, no dashboard), for trying cluster mode and for the tests; the front that started
it stops it. Ray would otherwise advertise the machine's public address and then fail to
reach its own GCS, which listens on loopback only: `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
keeps it on 127.0.0.1 (../shared/feasibility.md §4).

Ray runs with token authentication (rayauth.py): a local cluster gets palaestra's token, and
a cluster at an address must require one (or the operator must accept that it does not).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from palaestra.server.cluster import rayauth
from palaestra.server.cluster.placement import SLOTS_RESOURCE
from palaestra.server.config import Settings

log = logging.getLogger("palaestra.cluster")

LOCAL = re.compile(r"^local:(\d+)$")
ADDRESS = re.compile(r"^(?:ray://)?([^:/\s]+):(\d+)$")


class ClusterError(RuntimeError):
    """Cluster mode cannot start; the message names the address and what to fix."""

    code = "ray_unreachable"


class ClusterAuthError(ClusterError):
    """The cluster runs without token authentication, or refuses palaestra's token."""

    code = "ray_unauthenticated"


def pin_loopback() -> None:
    """Before Ray is imported: keep a local cluster's traffic on 127.0.0.1."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray writes <tmp>/ray/ray_current_cluster and fails where that folder is missing.
    (Path(tempfile.gettempdir()) / "ray").mkdir(parents=True, exist_ok=True)


def check_address(value: str, timeout_s: float = 3.0) -> None:
    """Fail fast (ClusterError) on an address no Ray cluster answers at."""
    if value == "auto" or LOCAL.match(value):
        if LOCAL.match(value) and int(value.split(":")[1]) < 1:
            raise ClusterError("--ray local:N needs N ≥ 1 nodes")
        return
    match = ADDRESS.match(value)
    if match is None:
        raise ClusterError(
            f"--ray {value!r} is not a Ray address: give host:port (the head's GCS port, "
            "6379 by default), 'auto', or 'local:N'"
        )
    host, port = match[1], int(match[2])
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterError(
            f"no Ray cluster answers at {value} ({exc}); start one with `ray start --head` "
            "on that host, or try `--ray local:3`"
        ) from None


def join_address(settings: Settings) -> str:
    """The address to join (`auto`: the cluster `ray start` last started on this machine);
    Ray is imported, so pin_loopback() comes first."""
    if settings.ray != "auto":
        return settings.ray
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except Exception as exc:
        raise ClusterError(f"--ray auto: no Ray cluster found on this machine ({exc})") from None
    if not found:
        raise ClusterError("--ray auto: no Ray cluster found on this machine")
    return str(found)


def check_cluster(settings: Settings) -> None:
    """Fail fast (ClusterError) on an address no Ray cluster answers at, or on a cluster
    that runs without token authentication (unless the operator accepts it)."""
    check_address(settings.ray)
    if LOCAL.match(settings.ray):
        return
    pin_loopback()
    try:
        rayauth.require_auth(settings, join_address(settings))
    except rayauth.RayAuthError as exc:
        raise ClusterAuthError(str(exc)) from None


def local_labels(settings: Settings) -> dict[str, str]:
    """What this machine can do, as node labels for a local cluster."""
    from palaestra.envs.cad import runtime

    labels = {}
    if runtime.blender_toolchain(settings.toolchains_dir).available:
        labels["bpy"] = "1"
    if Path("/var/run/docker.sock").exists():
        labels["docker"] = "1"
    return labels


class RayConnection:
    """This process's connection to Ray (and the local cluster it started, if any)."""

    def __init__(self, settings: Settings) -> None:
        check_address(settings.ray)
        pin_loopback()
        import ray

        self.ray = ray
        self.cluster: Any = None
        self.temp: Path | None = None
        match = LOCAL.match(settings.ray)
        # ray.init replaces the SIGTERM handler with sys.exit, which skips the server's
        # graceful shutdown (the store's flush, this cluster's stop): keep the server's.
        on_sigterm = signal.getsignal(signal.SIGTERM)
        try:
            if match:
                address = self._start_local(settings, int(match[1]))
            else:
                address = join_address(settings)
                rayauth.require_auth(settings, address)
            ray.init(
                address=address,
                namespace=settings.ray_namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except ClusterError:
            raise
        except rayauth.RayAuthError as exc:
            self.close()
            raise ClusterAuthError(str(exc)) from None
        except Exception as exc:
            self.close()
            raise ClusterError(f"cannot join the Ray cluster at {settings.ray}: {exc}") from None
        finally:
            if on_sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, on_sigterm)

    def _start_local(self, settings: Settings, nodes: int) -> str:
        from ray.cluster_utils import Cluster

        token = rayauth.token_path(settings)  # before the nodes start: they inherit it
        rayauth.ensure_token(token, own_folder=settings.ray_token_file is None)
        rayauth.use_token(token)
        # A short path: Ray's unix sockets live under it (at most 107 bytes).
        self.temp = Path(tempfile.mkdtemp(prefix="palaestra-ray-", dir="/tmp"))
        node: dict[str, Any] = {
            "num_cpus": settings.ray_local_cpus,
            "node_ip_address": "127.0.0.1",
            "labels": local_labels(settings),
        }
        if settings.ray_node_episodes:
            node["resources"] = {SLOTS_RESOURCE: settings.ray_node_episodes}
        head = {**node, "include_dashboard": False, "temp_dir": str(self.temp)}
        self.cluster = Cluster(initialize_head=True, connect=False, head_node_args=head)
        for _ in range(nodes - 1):
            self.cluster.add_node(**node)
        self.cluster.wait_for_nodes()
        if rayauth.probe(self.cluster.address) != "closed":  # a Ray that ignored RAY_AUTH_MODE
            raise rayauth.RayAuthError("the local Ray cluster started without authentication")
        log.info("started a local Ray cluster of %d nodes at %s", nodes, self.cluster.address)
        return str(self.cluster.address)

    def close(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)
            self.temp = None
