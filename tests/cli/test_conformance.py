"""`palaestra conformance` (cli/conformance.py) against a real `palaestra serve` through each
of its doors (/v1, OpenEnv, ORS, NeMo Gym), and against third-party servers: NeMo Gym
0.7.0's own example resources server and an environment on `ors-sdk` 0.1.0's reference
server, each in its package's venv."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess
from servers import free_port, wait_until
from typer.testing import CliRunner

from palaestra.cli.conformance import FAIL, NA, PASS, conform
from palaestra.cli.main import app
from tests.peers import HERE, peer_python
from tests.peers.nemo_gym_venv import nemo_gym_python

pytestmark = pytest.mark.slow


def token(server: ServerProcess, name: str) -> str:
    made = httpx.post(
        f"{server.url}/v1/tokens",
        json={"scopes": ["train", "eval"], "name": name},
        headers=server.headers,
    )
    assert made.status_code == 201, made.text
    value: str = made.json()["token"]
    return value


EXPECTED = {  # check -> result, per protocol (palaestra's doors)
    "palaestra": dict.fromkeys(
        [
            "repeated seed",
            "conflicting seed",
            "repeated close",
            "foreign close",
            "lost reply",
            "replay by request id",
            "verify after close",
            "unknown session",
        ],
        PASS,
    ),
    "ors": {"verify after close": NA},
    "openenv": dict.fromkeys(
        [
            "repeated close",
            "foreign close",
            "lost reply",
            "replay by request id",
            "verify after close",
        ],
        NA,
    ),
    "nemo-gym": dict.fromkeys(["lost reply", "replay by request id"], NA),
}


@pytest.mark.parametrize("protocol", ["palaestra", "openenv", "ors", "nemo-gym"])
async def test_conformance_of_palaestras_doors(door_server: ServerProcess, protocol: str) -> None:
    served = door_server
    mine, other = token(served, f"conf-{protocol}-a"), token(served, f"conf-{protocol}-b")
    url = served.url + ("/openenv/palaestra/echo" if protocol == "openenv" else "")
    results = await conform(url, protocol, token=mine, other_token=other)
    got = {r.check: r.result for r in results}
    want = {check: EXPECTED[protocol].get(check, PASS) for check in got}
    assert got == want, [r for r in results if r.result != want[r.check]]


def test_conformance_command_prints_the_table_and_exits_by_it(door_server: ServerProcess) -> None:
    served = door_server
    mine = token(served, "conf-cli")
    ran = CliRunner().invoke(app, ["conformance", served.url, "--token", mine])
    assert ran.exit_code == 0, ran.output
    assert "replay by request id" in ran.output and "fail" not in ran.output
    bad = CliRunner().invoke(app, ["conformance", served.url, "--protocol", "gopher"])
    assert bad.exit_code == 2 and "nemo-gym" in bad.output
    # no token: every session refused, so the checks fail, and the exit code says so
    refused = CliRunner().invoke(app, ["conformance", served.url, "--json"])
    assert refused.exit_code == 1 and '"fail"' in refused.output


def third_party(python: Path, program: str) -> Iterator[str]:
    """tests/peers/`program PORT` served by `python` on loopback, while the test runs."""
    port = free_port()
    proc = subprocess.Popen(
        [str(python), str(HERE / program), str(port)],
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(up, base_s=120.0, what=program)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def nemo_example() -> Iterator[str]:
    """NeMo Gym's own example resources server (example_single_tool_call)."""
    yield from third_party(nemo_gym_python(), "nemo_gym_example_server.py")


@pytest.fixture
def ors_reference() -> Iterator[str]:
    """An environment on ors-sdk's reference server (tests/peers/ors_reference_server.py)."""
    yield from third_party(peer_python("ors", "ors-sdk==0.1.0"), "ors_reference_server.py")


async def test_conformance_of_nemo_gyms_own_example_server(nemo_example: str) -> None:
    """A third-party server: NeMo Gym 0.7.0's example scores its own contract, and answers a
    conflicting seed with a 500 (its seed raises ValueError) where 409 belongs."""
    results = await conform(nemo_example, "nemo-gym", task="example:0", tool="get_weather",
                            arguments={"city": "Paris"})  # fmt: skip
    got = {r.check: r.result for r in results}
    assert got == {
        "repeated seed": PASS,
        "conflicting seed": FAIL,
        "repeated close": PASS,
        "foreign close": PASS,
        "lost reply": NA,
        "replay by request id": NA,
        "verify after close": PASS,
        "unknown session": NA,  # its verify keeps no state: it scores the body
    }, results
    conflict = next(r for r in results if r.check == "conflicting seed")
    assert "500" in conflict.reason


async def test_conformance_of_ors_sdks_reference_server(ors_reference: str) -> None:
    """A third-party ORS server: ors-sdk 0.1.0's reference `Server` replays a call by its
    task id (its echo counts calls, so a second run would show), refuses a second /create
    of one session id with 400, and deletes idempotently (an unknown id: 200, a no-op)."""
    results = await conform(ors_reference, "ors", task="echoenv:0")
    got = {r.check: r.result for r in results}
    assert got == {
        "repeated seed": PASS,
        "conflicting seed": PASS,
        "repeated close": PASS,
        "foreign close": PASS,
        "lost reply": PASS,
        "replay by request id": PASS,
        "verify after close": NA,
        "unknown session": PASS,
    }, results
