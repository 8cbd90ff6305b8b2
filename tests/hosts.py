"""The local host behind an embedded front, for tests that look at live episodes."""

from __future__ import annotations

from palaestra.server.local_host import LocalHost
from palaestra.server.manager import EpisodeManager


def local_host(manager: EpisodeManager) -> LocalHost:
    host = manager.host
    assert isinstance(host, LocalHost), f"an embedded front's host, not {type(host).__name__}"
    return host
