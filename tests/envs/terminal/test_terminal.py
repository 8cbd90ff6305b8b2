"""The terminal family end to end: a real server on loopback, real bwrap sandboxes, the
tiny pack tests/fixtures/terminal-pack (three tasks: a text task with setup.sh, a
repository repair with FAIL_TO_PASS / PASS_TO_PASS, a sealed data task)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs import cheats as generic
from palaestra.envs import repo_cheats
from palaestra.envs.terminal import TerminalFamily, cheats
from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import Action, StepResponse
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.runtime import build_manager
from palaestra.verifiers.terminal import files_tar, verify_workspace
from tests.hosts import local_host
from tests.servers import server_fixture

PACK = Path(__file__).parents[2] / "fixtures" / "terminal-pack"
NAME = "test/terminal-mini"
WORDS = f"{NAME}:word-count"
REPO = f"{NAME}:fix-calc"

OK, WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")


server = server_fixture("module", packs={"terminal-pack": PACK}, copy_packs=True)


@pytest.fixture
def http(server: ServerProcess) -> Iterator[HTTPClient]:
    with server.client(timeout=120) as client:
        yield client


def bash(client: HTTPClient, eid: str, command: str, **kw: Any) -> StepResponse:
    return client.step(eid, Action(tool="bash", arguments={"command": command, **kw}))


def call(client: HTTPClient, eid: str, tool: str, **arguments: Any) -> StepResponse:
    return client.step(eid, Action(tool=tool, arguments=arguments))


def play(client: HTTPClient, task: str, actions: list[Action]) -> StepResponse:
    eid = client.reset(task).episode_id
    reply = None
    for action in actions:
        reply = client.step(eid, action)
        if reply.terminated or reply.truncated:
            break
    assert reply is not None and reply.terminated
    return reply


def test_tools_limits_and_metrics(http: HTTPClient) -> None:
    reset = http.reset(WORDS, options={"max_output_bytes": 4096})
    eid = reset.episode_id
    assert [t.name for t in reset.tools] == [
        "bash", "read_file", "write_file", "edit_file", "list_dir", "submit",
    ]  # fmt: skip
    assert reset.limits.max_output_bytes == 4096
    assert reset.limits.max_step_s == 600 and reset.limits.max_episode_output_bytes
    assert "/work" in reset.observation.text and "Count the words" in reset.observation.text

    # setup.sh ran at reset and is gone; the shell keeps cwd and variables
    listing = call(http, eid, "list_dir")
    assert [e["name"] for e in listing.observation.data["entries"]] == ["notes.txt"]
    first = bash(http, eid, "mkdir -p sub && cd sub && export GREETING=hi")
    assert first.observation.data["cwd"] == "/work/sub"
    again = bash(http, eid, 'echo "$GREETING from $(pwd)"; exit_code_probe=1; false')
    assert again.observation.data["output"] == "hi from /work/sub\n"
    assert again.observation.data["exit_code"] == 1
    assert "[exit code: 1 · cwd: /work/sub]" in again.observation.text

    # file tools: paths relative to the workdir, whatever the shell's cwd
    call(http, eid, "write_file", path="notes/a.txt", content="one two\none two\n")
    read = call(http, eid, "read_file", path="notes/a.txt", offset=4, length=3)
    assert read.observation.text.startswith("two")
    assert read.observation.data["truncated"] and "offset=7" in read.observation.text
    twice = call(http, eid, "edit_file", path="notes/a.txt", old="one", new="1")
    assert "matches 2 places" in twice.observation.text
    missing = call(http, eid, "edit_file", path="notes/a.txt", old="three", new="3")
    assert "was not found" in missing.observation.text
    done = call(http, eid, "edit_file", path="notes/a.txt", old="one", new="1", replace_all=True)
    assert done.observation.data["replacements"] == 2
    assert call(http, eid, "read_file", path="notes/a.txt").observation.text == "1 two\n1 two\n"
    absent = call(http, eid, "read_file", path="nope.txt")
    assert absent.observation.text.startswith("error: cannot read /work/nope.txt")
    with pytest.raises(Exception) as refused:  # a malformed call: 422, the episode goes on
        call(http, eid, "edit_file", path="notes/a.txt")
    assert getattr(refused.value, "status", None) == 422

    state = http.state(eid)
    m = state.metrics
    assert m.steps == 10 and m.tool_calls == 11 and m.invalid_actions == 1
    # failures: `false`, edit x2 (2 and 0 matches), the missing file, the 422
    assert m.tool_failures == 5
    assert m.tool_success_rate == pytest.approx(6 / 11, abs=1e-6)
    assert m.output_bytes > 0 and m.timed_out == 0

    bash(http, eid, "cd /work && wc -w < notes.txt > count.txt")
    final = call(http, eid, "submit")
    assert final.terminated and final.reward == 1.0
    assert final.info["metrics"]["steps"] == 12
    stored = http.state(eid)
    assert stored.status.value == "done" and stored.metrics.steps == 12


def test_commands_that_hang_flood_or_kill_the_shell(http: HTTPClient) -> None:
    reset = http.reset(WORDS, options={"max_output_bytes": 2048})
    eid = reset.episode_id
    bash(http, eid, "cd /tmp && export KEEP=1")

    hang = bash(http, eid, "sleep 1000", timeout=1)
    assert hang.observation.data["timed_out"] and "[timed out after 1 s" in hang.observation.text
    assert not hang.terminated and hang.observation.data["cwd"] == "/tmp"  # shell survived

    flood = bash(http, eid, "yes flood | head -c 5000000; echo tail-end")
    data = flood.observation.data
    assert data["truncated"] and "[output truncated" in flood.observation.text
    assert data["output"].startswith("flood") and data["output"].rstrip().endswith("tail-end")
    assert data["output_bytes"] <= 2048 + 256

    for killer in ("exit 3", "kill -9 $$", "exec true"):
        dead = bash(http, eid, killer)
        assert dead.observation.data["shell_ended"], killer
        assert "[the shell ended during this command" in dead.observation.text
        assert not dead.terminated
        alive = bash(http, eid, 'echo "alive ${KEEP:-reset} $(pwd)"')
        assert alive.observation.data["output"] == "alive reset /work\n", killer
        bash(http, eid, "cd /tmp && export KEEP=1")

    spin = bash(http, eid, "while :; do :; done", timeout=1)  # a builtin loop: the shell dies
    assert spin.observation.data["timed_out"] and not spin.terminated
    assert bash(http, eid, "echo ok").observation.data["output"] == "ok\n"

    final = call(http, eid, "submit")
    assert final.reward == 0.0 and final.info["status"] == "done"
    assert final.info["metrics"]["timed_out"] == 2


def test_fake_pass_and_result_files_change_nothing(http: HTTPClient) -> None:
    """Printing PASS, writing reward files and an exit-0 test.sh wherever a verifier might
    look, planting pytest.py: the tests still judge the (unsolved) workdir."""
    script = cheats.PRINT_PASS + cheats.WRITE_RESULT + cheats.SHADOW_PYTEST
    reply = play(
        http, WORDS, [Action(tool="bash", arguments={"command": script}), Action(tool="submit")]
    )
    assert reply.reward == 0.0 and reply.info["verdict"]["status"] == "ok"
    assert "count.txt is missing" in reply.info["verdict"]["feedback"]


def test_repository_repair_sets(http: HTTPClient) -> None:
    stub = Task(
        id="fix-calc",
        family="terminal",
        domain="d",
        split="train",
        pack=NAME,
        version="0.1.0",
        public={},
        private={"fail_to_pass": ["x"], "solution": {"solve.sh": "true"}},
    )
    names = [n for n, _ in TerminalFamily().cheats(stub)]
    assert {"edit-tests", "conftest-hook", "shadow-pytest"} <= set(names)

    # half a fix: mul right, div still wrong -> FAIL_TO_PASS half done, reward 0
    half = play(
        http,
        REPO,
        [
            Action(
                tool="edit_file",
                arguments={
                    "path": "calc.py",
                    "old": "def mul(a, b):\n    return a + b",
                    "new": "def mul(a, b):\n    return a * b",
                },
            ),
            Action(tool="submit"),
        ],
    )
    verdict = half.info["verdict"]
    assert half.reward == 0.0
    assert verdict["components"] == {"fail_to_pass": 0.5, "pass_to_pass": 1.0}


@pytest.mark.slow
@pytest.mark.timeout(900)  # 41 episodes; a loaded 2-core machine needs more than 300 s
def test_pack_check_on_bwrap(tmp_path: Path) -> None:
    """oracle 1 (and the same on a rerun), null 0, and every known cheat -- printing PASS,
    writing a reward / exit-0 test.sh wherever a verifier might look, planting pytest.py,
    editing the tests, a conftest hook, and the generic ones (startup files, pytest config,
    PATH shadowing, results anywhere, background processes, symlinks, exit on import) --
    scores <= 0.1 (non-void) on every task; `pack check --json` writes it all per task."""
    out = tmp_path / "check.json"
    result = CliRunner().invoke(
        app, ["pack", "check", str(PACK), "--concurrency", "3", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "per task" in result.output and "cheat startup-files: max 0.00" in result.output
    report = json.loads(out.read_text())
    assert report["ok"] and report["problems"] == []
    # 3 tasks x (oracle, rerun, null) + 3 terminal cheats and the library's shell classes
    # each + 2 more and the repository cheats on the repository task + boot-forge on the
    # two test-script tasks
    n = len(generic.NAMES)
    episodes = 3 * 3 + 3 * (3 + n) + 2 + len(repo_cheats.NAMES) + 2
    assert report["checked"] == 3 and report["episodes"] == episodes
    assert [r["task"] for r in report["results"]] == ["csv-sum", "fix-calc", "word-count"]
    for row in report["results"]:
        assert row["oracle"] == row["rerun"] == 1.0 and row["null"] == 0.0, row
        assert set(generic.NAMES) <= set(row["cheats"]), row
    assert set(report["cheats"]) >= set(generic.NAMES)
    assert all(c["max"] <= 0.1 for c in report["cheats"].values()), report["cheats"]
    assert report["worst_cheat"]["max"] <= 0.1


async def test_dead_sandbox_voids_the_episode(tmp_path: Path) -> None:
    shutil.copytree(PACK, tmp_path / "packs" / "terminal-pack")
    settings = Settings(data_dir=tmp_path / "data", packs_dirs=[tmp_path / "packs"], pool_size=0)
    manager = build_manager(settings)
    await manager.start()
    try:
        client = AsyncInProcessClient(manager)
        reset = await client.reset(WORDS)
        episode = local_host(manager)._live[reset.episode_id]
        assert episode.ctx.sandboxes.episode is not None
        await episode.ctx.sandboxes.episode.close()  # the sandbox dies under the episode
        reply = await client.step(
            reset.episode_id, Action(tool="bash", arguments={"command": "echo hi"})
        )
        assert reply.terminated and reply.info["status"] == "void"
        assert reply.info["verdict"]["status"] == "void"
        state = await client.state(reset.episode_id)
        assert state.status.value == "void" and state.metrics.tool_failures == 1
    finally:
        await manager.shutdown()


async def test_reward_file_and_exit_codes() -> None:
    """test.sh's exit status decides; a reward.txt in $VERIFIER_LOGS overrides it only for
    a task that declares `reward_file` (Harbor); a malformed one scores 0. An undeclared
    reward file changes nothing. Run directly against the verifier in a bwrap sandbox."""
    backend = BwrapBackend()
    workspace = files_tar({"answer.txt": "42\n"})
    cases = {  # script: (reward when declared, reward when not)
        'grep -qx 42 answer.txt && echo "$VERIFIER_DIR" | grep -q "^/tmp/verifier$"': (1.0, 1.0),
        "grep -qx 41 answer.txt": (0.0, 0.0),
        'echo 0.25 > "$VERIFIER_LOGS/reward.txt"; exit 1': (0.25, 0.0),
        'echo 1 > "$VERIFIER_LOGS/reward.txt"; exit 1': (1.0, 0.0),
        'echo lots > "$VERIFIER_LOGS/reward.txt"; exit 0': (0.0, 1.0),
        'ln -s /etc/hostname "$VERIFIER_LOGS/reward.txt"; exit 1': (0.0, 0.0),
    }
    try:
        for script, wants in cases.items():
            for declared, want in zip((True, False), wants, strict=True):
                async with await backend.create(SandboxSpec(workspace_mb=16)) as box:
                    run = await verify_workspace(
                        box,
                        workspace,
                        workdir="/work",
                        verifier={"test.sh": f"#!/bin/bash\n{script}\n"},
                        environment={},
                        reward_file=declared,
                    )
                assert run.reward == want, (script, declared, run.feedback())
    finally:
        await backend.aclose()
