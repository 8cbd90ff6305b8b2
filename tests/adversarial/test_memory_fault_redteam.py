"""Red team: `memory_fault` (sandbox/docker/sandbox.py) subtracts only *inactive* page
cache from the container's usage. Page cache the kernel counts as active (a file read
twice: the agent's dataset, the image's libraries) is reclaimable before any OOM kill, yet
counts as "in use", so when an exec fails for a reason of the infrastructure's (the engine
hiccups) `kill_all` blames the agent (MemoryFull, "its processes hold the rest") instead of
restarting the container or voiding the episode. The agent holds no memory at all here:
no anon, no shmem."""

from __future__ import annotations

from palaestra.sandbox.docker.sandbox import memory_fault

MIB = 1 << 20


def test_reclaimable_active_page_cache_is_not_the_agents_fault() -> None:
    stats = {
        "usage": 960 * MIB,
        "limit": 1024 * MIB,
        # cgroup v2 memory.stat: the agent's processes hold 40 MiB; the rest is file cache
        "stats": {"anon": 40 * MIB, "file": 920 * MIB, "active_file": 900 * MIB,
                  "inactive_file": 20 * MIB, "shmem": 0},
    }  # fmt: skip
    fault = memory_fault(stats, 1024)
    assert fault is None, f"reclaimable page cache blamed on the agent: {fault}"
