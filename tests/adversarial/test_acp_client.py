"""palaestra's ACP client (server/harness/programs/acp_client.py) against a hostile ACP agent
(tests/peers/acp_hostile_agent.py), both inside a real sandbox (bwrap, docker) as a harness
episode runs them: every fs request outside the workspace (an absolute path, `..`, a symlink the
agent made, /proc, the server's files, the harness's programs) and a terminal whose cwd is
outside are refused with a JSON-RPC error and leave nothing behind; each way of breaking
the protocol ends the session with exit 3 and the client's account, which the server reads
as the agent's `harness_protocol` failure (server/harness/acp.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from adversarial.harness import BACKENDS, REPO, make_backend
from palaestra.sandbox.base import ExecResult, Sandbox, SandboxSpec
from palaestra.server import served
from palaestra.server.harness.acp import PROTOCOL_CLASS, outcome
from palaestra.server.harness.registry import PROGRAMS_TARGET

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one sandbox a backend
PEERS = str(REPO / "tests" / "peers")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def box(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    backend = make_backend(request.param)
    binds = ((str(served.library().harness), PROGRAMS_TARGET), (PEERS, "/opt/peers"))
    spec = SandboxSpec(memory_mb=512, pids=64, default_timeout_s=60.0, ro_binds=binds)
    try:
        async with await backend.create(spec) as sandbox:
            await sandbox.write_file(".palaestra-harness/instruction.md", "attack")
            yield sandbox
    finally:
        await backend.aclose()


async def drive(
    box: Sandbox, mode: str, timeout: float | None = None
) -> tuple[ExecResult, dict[str, Any]]:
    await box.exec(["sh", "-c", "rm -rf ./* .[!.]*"], cwd=box.spec.workdir)  # a fresh workspace
    await box.write_file(".palaestra-harness/instruction.md", "attack")
    argv = ["python3", f"{PROGRAMS_TARGET}/acp_client.py",
            "--instruction-file", f"{box.spec.workdir}/.palaestra-harness/instruction.md",
            "--workspace", box.spec.workdir, "--",
            "python3", "/opt/peers/acp_hostile_agent.py", mode]  # fmt: skip
    server_file = str(served.library().harness / "acp_client.py")  # the host's copy
    env = {"ACP_SERVER_FILE": server_file}
    result = await box.exec(argv, env=env, cwd=box.spec.workdir, timeout=timeout)
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("palaestra-acp: "), result
    return result, json.loads(last.removeprefix("palaestra-acp: "))


async def test_requests_outside_the_workspace_are_refused(box: Sandbox) -> None:
    result, end = await drive(box, "attack")
    assert result.exit_code == 0 and end["end"] == "stop", result
    answers = json.loads(await box.read_file("attack-answers.json"))
    refused = {
        "etc_passwd", "dotdot", "relative", "symlink_read", "symlink_dir_write", "symlink_write",
        "proc_environ", "server_files", "write_tmp", "write_harness", "nul", "terminal_cwd",
    }  # fmt: skip
    for name in refused:
        error = answers[name].get("error")
        assert error is not None and error["code"] == -32602, (name, answers[name])
        assert "result" not in answers[name]
        assert "root:" not in json.dumps(answers[name])  # nothing of /etc/passwd came back
    assert "outside the workspace" in answers["symlink_read"]["error"]["message"]
    assert "outside the workspace" in answers["server_files"]["error"]["message"]
    assert "not a regular file" in answers["fifo"]["error"]["message"]  # never blocks on it
    assert answers["not_a_method"]["error"]["code"] == -32601
    assert answers["params_list"]["error"]["code"] == -32602
    assert answers["inside_write"]["result"] is None
    assert answers["inside_read"]["result"] == {"content": "fine"}
    # Nothing was written through the links or outside; /etc/passwd is untouched.
    assert (await box.exec(["test", "-e", "/tmp/acp-escape"])).exit_code != 0
    assert (await box.exec(["test", "-e", "/tmp/x"])).exit_code != 0
    assert (await box.exec(["grep", "-q", "owned", "/etc/passwd"])).exit_code != 0
    assert len(end["refused"]) == 15 and end["messages"]["fs/read_text_file"] == 10
    assert outcome(result) is not None and outcome(result).failure is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mode", "detail"),
    [
        ("garbage", "not JSON"),
        ("array", "not a JSON object"),
        ("stray", "a response to no request"),
        ("huge", "longer than"),
        ("version", "protocol version 99"),
    ],
)
async def test_a_broken_protocol_is_the_agents_typed_failure(
    box: Sandbox, mode: str, detail: str
) -> None:
    result, end = await drive(box, mode)
    assert result.exit_code == 3 and end["end"] == "protocol_error", result
    assert detail in end["detail"], end
    own = outcome(result)
    assert own is not None and own.failure is not None
    assert own.failure.kind == "agent_crash" and own.failure.failure_class == PROTOCOL_CLASS
    assert not own.failure.infrastructure  # scores 0, never void
    assert result.duration_s < 10  # the agent is stopped at once, not waited on


@pytest.mark.parametrize(("mode", "code", "why"), [("exit", 4, "exited"), ("error", 5, "error")])
async def test_an_agent_that_quits_or_fails_its_turn(
    box: Sandbox, mode: str, code: int, why: str
) -> None:
    result, _ = await drive(box, mode)
    assert result.exit_code == code, result
    own = outcome(result)
    assert own is not None and own.failure is None and why in own.reason, own


async def test_no_account_means_the_plain_exit() -> None:
    """A client killed before its last line: the runner's "exited with code N"."""
    assert outcome(ExecResult(exit_code=137, stdout="palaestra-acp: {bro", stderr="")) is None
    assert outcome(ExecResult(exit_code=1, stdout="", stderr="")) is None


async def test_a_flood_of_messages_costs_the_client_no_memory(box: Sandbox) -> None:
    """Notifications of 20,000 distinct made-up methods are counted as one "other"; 1,000
    requests sent at once are each answered (an error: no such terminal)."""
    result, end = await drive(box, "flood")
    assert result.exit_code == 0 and end["end"] == "stop", result
    assert end["messages"] == {"other": 20_000, "terminal/output": 1_000}, end["messages"]
    assert len(end["refused"]) == 20  # the last ones only


async def test_every_odd_request_is_answered(box: Sandbox) -> None:
    """Params of odd types or values (a list or object for a terminal id, a number for env,
    a NUL in a command, its args or an env name) and a terminal killed by a signal Python has
    no name for: each request is answered (the client's handler raised TypeError or
    ValueError, answered nothing, and the agent waited on it until the wall limit)."""
    result, end = await drive(box, "odd", timeout=20)
    assert result.exit_code == 0 and end["end"] == "stop", result
    answers = json.loads(await box.read_file("odd-answers.json"))
    for name in ("list_id", "object_id", "env_number", "env_nul", "command_nul", "args_nul"):
        error = answers[name].get("error")
        assert error is not None and error["code"] == -32602, (name, answers[name])
    assert answers["rt_signal_exit"]["result"] == {"exitCode": None, "signal": "SIGRTMIN+1"}
    assert result.duration_s < 10
