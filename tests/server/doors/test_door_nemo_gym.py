"""The NeMo Gym door (server/doors/nemo_gym.py) driven by the `nemo-gym` package's own
client, models and session conformance check, in their own venv (scripts/nemo-gym-venv.sh),
against a real `palaestra serve`; and `palaestra conformance` against each of palaestra's
doors and against NeMo Gym's own example resources server."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess
from docblocks import blocks
from servers import free_port, wait_until
from typer.testing import CliRunner

from palaestra.cli.conformance import FAIL, NA, PASS, conform
from palaestra.cli.main import app
from tests.peers import HERE, ROOT, run_peer

pytestmark = pytest.mark.slow

VERSION = "0.7.0"  # the nemo-gym release the door is tested with (docs/integrations.md)


@pytest.fixture(scope="module")
def served(door_server: ServerProcess) -> ServerProcess:
    return door_server  # one server for the doors' tests (tests/conftest.py)


def token(server: ServerProcess, name: str) -> str:
    made = httpx.post(
        f"{server.url}/v1/tokens",
        json={"scopes": ["train", "eval"], "name": name},
        headers=server.headers,
    )
    assert made.status_code == 201, made.text
    value: str = made.json()["token"]
    return value


@pytest.fixture(scope="module")
def nemo_python() -> Path:
    """The nemo-gym package's venv (made on first use); skips only where it cannot be
    installed at all: no Python >= 3.13 (exit 3), or PyPI out of reach."""
    made = subprocess.run(
        ["bash", str(ROOT / "scripts" / "nemo-gym-venv.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "NEMO_GYM_VERSION": VERSION},
    )
    offline = re.search(r"(?i)connection|resolve|network|temporary failure", made.stderr)
    if made.returncode == 3 or (made.returncode != 0 and offline):
        pytest.skip(f"the nemo-gym package cannot be installed here: {made.stderr[-300:]}")
    assert made.returncode == 0, f"scripts/nemo-gym-venv.sh failed:\n{made.stderr[-2000:]}"
    return Path(made.stdout.strip().splitlines()[-1])


def test_the_documented_example_runs_as_written(
    served: ServerProcess, nemo_python: Path, tmp_path: Path
) -> None:
    example = [b for b in blocks("integrations.md") if b.arg == "nemo_gym_example.py"]
    assert len(example) == 1, "docs/integrations.md: the NeMo Gym example block is gone"
    (tmp_path / "nemo_gym_example.py").write_text(example[0].body)
    ran = subprocess.run(
        [str(nemo_python), str(tmp_path / "nemo_gym_example.py"), served.url, token(served, "doc")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines()[1:] == ["1.0", "1.0"], ran.stdout
    assert "birch" in ran.stdout.splitlines()[0]


def test_nemo_gym_client_drives_the_door(served: ServerProcess, nemo_python: Path) -> None:
    mine, other = token(served, "nemo-a"), token(served, "nemo-b")
    seen = run_peer(nemo_python, "nemo_gym_client.py", served.url, mine, other)

    right = seen["right"]
    assert right["cookie_names"] == ["palaestra_nemo_gym"]  # the Environment Server needs one
    episode = right["view"]["episode_id"]
    assert right["seed"]["resources_tools"]["url_path"] == f"/v1/episodes/{episode}/mcp"
    assert "birch" in right["view"]["observation"]["text"]
    assert {t["name"] for t in right["view"]["tools"]} == {"echo", "submit"}
    echoed = {"output": "hello", "images": [], "data": {}, "reward": 0.0}
    assert right["echo"] == [200, {**echoed, "terminated": False, "truncated": False, "info": {}}]
    status, said = right["bad_tool"]
    assert status == 422 and "no_such_tool" in said["detail"]  # the episode goes on
    assert right["submit"][0] == 200 and right["submit"][1]["terminated"] is True
    verdict = {"reward": 1.0, "mask_sample": False, "failure_kind": None, "failure_reason": None}
    assert right["verify"] == verdict
    assert seen["wrong"]["reward"] == 0.0 and seen["wrong"]["mask_sample"] is False
    assert seen["wrong"]["failure_kind"] is None  # a scored 0: NeMo Gym names no failure
    # another token: its cookie names nothing; its close of our id is a close of one it
    # never seeded (NeMo Gym's contract: 200, no effect) and our session lives on
    assert right["foreign_tool"][0] == 404 and right["foreign_verify"][0] == 404
    assert right["foreign_close"][0] == 200 and right["after_foreign_close"] == 200
    assert right["closes"] == [200, 200]
    assert right["seed_after_close"][0] == 409

    bad = seen["bad"]
    for name in ("verify_no_cookie", "verify_unknown", "tool_unknown"):
        assert bad[name][0] == 404 and "seed_session" in bad[name][1]["detail"], name
    for name in ("close_bad_body", "seed_bad_body"):
        assert bad[name][0] == 422 and "detail" in bad[name][1], name
    assert bad["no_token"][0] == 401
    assert seen["conformance"] == "passed"  # nemo_gym.testing.session_conformance


def test_a_post_without_the_cookie_is_no_route(served: ServerProcess) -> None:
    """The door's `POST /{tool}` is NeMo Gym's only with its session cookie: elsewhere an
    unknown route is the contract's 404, and a route of another method 405."""
    missing = httpx.post(f"{served.url}/no-such-route", headers=served.headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert httpx.post(f"{served.url}/healthz", headers=served.headers).status_code == 405


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
async def test_conformance_of_palaestras_doors(served: ServerProcess, protocol: str) -> None:
    mine, other = token(served, f"conf-{protocol}-a"), token(served, f"conf-{protocol}-b")
    url = served.url + ("/openenv/palaestra/echo" if protocol == "openenv" else "")
    results = await conform(url, protocol, token=mine, other_token=other)
    got = {r.check: r.result for r in results}
    want = {check: EXPECTED[protocol].get(check, PASS) for check in got}
    assert got == want, [r for r in results if r.result != want[r.check]]


def test_conformance_command_prints_the_table_and_exits_by_it(served: ServerProcess) -> None:
    mine = token(served, "conf-cli")
    ran = CliRunner().invoke(app, ["conformance", served.url, "--token", mine])
    assert ran.exit_code == 0, ran.output
    assert "replay by request id" in ran.output and "fail" not in ran.output
    bad = CliRunner().invoke(app, ["conformance", served.url, "--protocol", "gopher"])
    assert bad.exit_code == 2 and "nemo-gym" in bad.output
    # no token: every session refused, so the checks fail, and the exit code says so
    refused = CliRunner().invoke(app, ["conformance", served.url, "--json"])
    assert refused.exit_code == 1 and '"fail"' in refused.output


@pytest.fixture
def nemo_example(nemo_python: Path) -> Iterator[str]:
    """NeMo Gym's own example resources server (example_single_tool_call) on loopback."""
    port = free_port()
    proc = subprocess.Popen(
        [str(nemo_python), str(HERE / "nemo_gym_example_server.py"), str(port)],
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(up, base_s=120.0, what="NeMo Gym's example server")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
