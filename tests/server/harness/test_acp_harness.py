"""ACP harness episodes end to end (server/harness/acp.py): a real `palaestra serve` starts
palaestra's ACP client in the episode's bwrap sandbox, which starts the reference agent on
the protocol's own SDK (agent-client-protocol 0.12.1, the `acp` toolchain) and drives one
session; the agent's model is FakeModel (a scripted upstream, a fake) through the session
proxy, so every call is recorded with its token ids. The agent writes the answer with
`fs/write_text_file`, checks it through a terminal, and submits; its requests outside the
workspace are refused and told to the model. The episode is started by the example of
docs/integrations.md, run as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adversarial.harness import BACKENDS, make_backend

from palaestra.sandbox.base import SandboxSpec
from palaestra.server import served
from palaestra.server.harness.registry import PROGRAMS_TARGET
from palaestra.server.harness.toolchain import acp
from tests.conftest import ServerProcess
from tests.docblocks import blocks
from tests.harness_peers import call, ending, llm_calls
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.server.test_sealed import make_token

CHAIN = acp()
pytestmark = pytest.mark.skipif(not CHAIN.available, reason=f"acp toolchain: {CHAIN.reason}")
SOLUTION = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant message calling the reference agent's tool `name`."""
    call = {"id": f"call_{name}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
    return {"content": f"calling {name}", "tool_calls": [call]}


@pytest.fixture(scope="module")
def token(door_server: ServerProcess) -> str:
    return make_token(door_server, "train", "harness")


@pytest.mark.slow
def test_the_acp_reference_agent_solves_a_task(
    door_server: ServerProcess, token: str, tmp_path: Path
) -> None:
    fake = FakeModel([
        tool("read_file", path="/etc/passwd"),
        tool("write_file", path="../../tmp/out.py", content="x"),
        tool("write_file", path="solution.py", content=SOLUTION),
        bash_call("python3 -c 'import solution; print(solution.truncate_number(3.5))'"),
        submit_call(),
    ])  # fmt: skip
    example = [b for b in blocks("integrations.md") if b.arg == "acp_example.py"]
    assert len(example) == 1, "docs/integrations.md: the ACP example block is gone"
    (tmp_path / "acp_example.py").write_text(example[0].body)
    with fake.serve() as url:
        argv = [sys.executable, str(tmp_path / "acp_example.py"), door_server.url, token, url]
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    episode, reward, calls_made, reason = ran.stdout.strip().split(" ", 3)
    assert (reward, calls_made) == ("1.0", "5"), ran.stdout
    assert reason == "the ACP prompt turn ended: end_turn"
    state = call(door_server, token, "GET", f"/v1/episodes/{episode}").json()
    assert state["status"] == "done" and state["verdict"]["reward"] == 1.0, state["verdict"]
    results = [r["messages"][-1]["content"] for r in fake.requests[1:]]
    assert "outside the workspace" in results[0] and "root:" not in results[0]
    assert "outside the workspace" in results[1]
    assert results[2] == f"wrote {len(SOLUTION)} characters to solution.py"
    assert results[3] == "exit status 0\n0.5\n"  # the terminal ran it in the workspace
    calls = llm_calls(state)  # every model call, with the upstream's ids
    assert len(calls) == 5 and all(c["completion_token_ids"] == [1, 2, 3] for c in calls)
    assert calls[0]["request"]["messages"][1]["content"].startswith("Implement the Python")
    assert fake.requests[0]["max_tokens"] == 512  # the reset's sampling, set by the proxy
    last = ending(state)
    assert last["info"]["harness"]["state"] == "exited"
    assert last["info"]["harness"]["name"] == "acp-agent" and last["reward"] == 1.0
    assert state["failure"] is None


def test_the_finder_says_why_the_acp_toolchain_is_missing(tmp_path: Path) -> None:
    missing = acp(tmp_path)
    assert not missing.available and "run scripts/bootstrap-harness.sh" in missing.reason
    assert CHAIN.target == "/opt/palaestra/acp" and CHAIN.ro_bind()[1] == CHAIN.target


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_the_reference_agent_starts_inside_without_network(backend_name: str) -> None:
    """The SDK imports from the read-only toolchain on the sandbox's python3 (the host's
    under bwrap, the image's under docker), and the agent's own module loads beside
    bash_agent.py, which it borrows its model call from."""
    backend = make_backend(backend_name)
    binds = (CHAIN.ro_bind(), (str(served.library().harness), PROGRAMS_TARGET))
    spec = SandboxSpec(memory_mb=512, pids=64, default_timeout_s=60.0, ro_binds=binds)
    check = (
        "import sys; sys.path.insert(0, '/opt/palaestra/harness'); import acp_agent, acp;"
        " print(acp.PROTOCOL_VERSION, acp_agent.ReferenceAgent.__mro__[1].__name__)"
    )
    env = {"PYTHONPATH": CHAIN.target, "PYTHONNOUSERSITE": "1"}
    try:
        async with await backend.create(spec) as box:
            ran = await box.exec(["python3", "-c", check], env=env)
            assert ran.exit_code == 0, ran
            assert ran.stdout.split() == ["1", "Agent"], ran
            touched = await box.exec(["touch", f"{CHAIN.target}/x"])
            assert touched.exit_code != 0  # read-only
    finally:
        await backend.aclose()
