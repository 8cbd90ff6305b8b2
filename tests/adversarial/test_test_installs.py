"""A Terminal-Bench task whose test script installs a package at test time, imported with the
package registries on the operator's allow-list, through real episodes on bwrap and docker
(its terminal image has no pip: the Python stand-in's installs there): the install
goes through the egress proxy from a sandbox of its own, the tests run without the network.

The fixture (tests/fixtures/terminal-bench-installs/pip-six) pins six 1.17.0, another version
than the host's, and its tests assert that version: the install is what they import. Where
this machine cannot reach PyPI the test is skipped (it is real, not mocked)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.importer import import_tasks
from palaestra.envs.terminal.installs import PYPI_HOSTS
from palaestra.sdk.models import Action
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.runtime import build_manager

from .harness import BACKENDS, backend_unavailable

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parents[1] / "fixtures" / "terminal-bench-installs"
TASK = "test/installs:pip-six"
# The agent's plants: a six that would pass the tests (the verifier imports the installed one,
# or the reward would be 1), and a sitecustomize, .pth and `pip` package for any Python or pip
# started in the workdir (the install runs in a sandbox that never holds them).
PLANTS = """
cat > /app/six.py <<'PY'
__version__ = "1.17.0"
def ensure_str(b): return "compatible"
PY
mkdir -p /app/pip
echo 'open("/app/PWNED-pip", "w")' > /app/pip/__init__.py
echo 'open("/app/PWNED-site", "w")' > /app/sitecustomize.py
echo 'import os; open("/app/PWNED-pth", "w")' > /app/evil.pth
"""


def _pypi_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=3):
            return True
    except OSError:
        return False


async def _episode(client: AsyncInProcessClient, command: str) -> tuple[float | None, str]:
    reset = await client.reset(TASK)
    reply = await client.step(reset.episode_id, Action(tool="bash", arguments={"command": command}))
    assert not reply.terminated, reply
    reply = await client.step(reset.episode_id, Action(tool="submit", arguments={}))
    assert reply.terminated, reply
    return reply.reward, str(reply.info)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.skipif(not _pypi_reachable(), reason="pypi.org is not reachable from here")
async def test_imported_test_time_install_runs_through_the_proxy(
    backend: str, tmp_path: Path
) -> None:
    if (why := backend_unavailable(backend)) is not None:
        pytest.skip(why)
    ceilings = Ceilings(4096, 4, 4096, 600, 3600, egress_allow=PYPI_HOSTS)
    pack = tmp_path / "packs" / "installs"
    report = import_tasks("terminal-bench", FIXTURE, pack, name="test/installs", ceilings=ceilings)
    assert list(report.imported) == ["pip-six"], report.skipped
    settings = Settings(
        data_dir=tmp_path / "data",
        packs_dirs=[tmp_path / "packs"],
        pool_size=0,
        sandbox=backend,
        egress_allow=list(PYPI_HOSTS),
    )
    manager = build_manager(settings)
    await manager.start()
    try:
        client = AsyncInProcessClient(manager)
        oracle = await _episode(client, "echo compatible > /app/answer.txt")
        null = await _episode(client, "true")
        # The agent has no network of its own (the task does not allow it one) ...
        reset = await client.reset(TASK)
        probe = "python3 -c 'import urllib.request as u; u.urlopen(\"https://pypi.org\")' 2>&1"
        bash = Action(tool="bash", arguments={"command": probe})
        reply = await client.step(reset.episode_id, bash)
        assert "Error" in reply.observation.text, reply.observation.text
        # ... and what it plants neither passes the tests nor runs with the verifier's network.
        planted = await _episode(client, PLANTS + "echo nope > /app/answer.txt")
    finally:
        await manager.shutdown()
    assert (oracle[0], null[0], planted[0]) == (1.0, 0.0, 0.0), (oracle, null, planted)
