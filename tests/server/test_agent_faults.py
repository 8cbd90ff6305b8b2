"""Agent fault = reward 0, never void (DESIGN §3, docs/reference/episodes.md "Agent faults").

Whatever the agent's actions can leave or do -- no solution file, a directory, symlink,
fifo or socket in its place, a sparse giant, a tree too deep, code that hangs, crashes or
does not load -- ends the episode `ok` with reward 0 and a failure class in the verdict,
and never counts toward quarantine. Real episodes: bwrap for every route, docker for the
file-type ones (skipped without an engine).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import docker_skip_reason, make_settings

from palaestra.envs.coding.family import task_solution
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sandbox.docker.sandbox import memory_fault
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import FAILURE_CLASSES, Action
from palaestra.server.config import Settings
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack
from palaestra.server.runtime import build_manager

OK, WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")
HE0 = "openai/humaneval:HumanEval-0"
BASE_IMAGE = "palaestra/base:bookworm"

# Python run in the agent's sandbox (cwd /work) to leave something odd as solution.py.
ODD_SOLUTIONS = {
    "directory": ("import os; os.mkdir('solution.py')", "not_regular_file"),
    "symlink-out": ("import os; os.symlink('/etc/passwd', 'solution.py')", "not_regular_file"),
    "symlink-in": (
        "import os; open('real.py', 'w').write('x = 1'); os.symlink('real.py', 'solution.py')",
        "not_regular_file",
    ),
    "symlink-device": ("import os; os.symlink('/dev/zero', 'solution.py')", "not_regular_file"),
    "fifo": ("import os; os.mkfifo('solution.py')", "not_regular_file"),
    "socket": (
        "import socket; socket.socket(socket.AF_UNIX).bind('solution.py')",
        "not_regular_file",
    ),
    "sparse-giant": (
        "import os; os.truncate(open('solution.py', 'w').name, 30 << 20)",
        "too_large",
    ),
}
DOCKER_ODD = ("directory", "symlink-out", "fifo", "socket", "sparse-giant")

# solution.py sources that fail as a whole, and their class.
BAD_CODE = {
    "syntax-error": ("def has_close_elements(:\n", "load_error"),
    "no-such-function": ("def something_else():\n    return 1\n", "load_error"),
    "hangs": (
        "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n",
        "timeout",
    ),
    "exits-at-import": ("import os\nos._exit(0)\n", "load_error"),
}


def _settings(tmp_path: Path, **extra: Any) -> Settings:
    return make_settings(data_dir=tmp_path / "data", **extra)


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    built = build_manager(_settings(tmp_path, sampler_void_limit=2))
    built.packs.add(load_pack(_terminal_pack(tmp_path / "term")))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


def _terminal_pack(root: Path) -> Path:
    """One terminal task: it passes when out.txt holds "done"."""
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        'name = "test/faults"\nversion = "0.1.0"\ndescription = "faults"\n'
        'license = "MIT"\nfamilies = ["terminal"]\n\n[splits.train]\n'
    )
    task = {
        "id": "done",
        "family": "terminal",
        "domain": "faults/done",
        "split": "train",
        "difficulty": "easy",
        "public": {"instruction": "write done to out.txt"},
        "private": {
            "verifier": {"test.sh": "#!/bin/bash\ngrep -qx done out.txt\n"},
            "solution": {"solve.sh": "echo done > out.txt\n"},
        },
    }
    (root / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    return root


async def _play(manager: EpisodeManager, task: str, actions: list[Action]) -> dict[str, Any]:
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(task)).episode_id
    reply = None
    for action in actions:
        reply = await client.step(eid, action.model_dump())
    assert reply is not None and reply.terminated
    assert reply.info["status"] == "done", reply.info  # never void
    verdict: dict[str, Any] = reply.info["verdict"]
    assert verdict["status"] == "ok" and verdict["reward"] == 0.0 == reply.reward, verdict
    assert verdict["passed"] is False
    return verdict


def _python(code: str) -> Action:
    return Action(tool="run_python", arguments={"code": code})


def _bash(command: str, timeout: float = 60) -> Action:
    return Action(tool="bash", arguments={"command": command, "timeout": timeout})


SUBMIT = Action(tool="submit")


# -- coding: the solution file ---------------------------------------------------------------


async def test_no_solution_file_is_missing_file(manager: EpisodeManager) -> None:
    verdict = await _play(manager, HE0, [SUBMIT])
    assert verdict["failure"] == "missing_file"


@pytest.mark.parametrize("kind", sorted(ODD_SOLUTIONS))
async def test_odd_solution_file_is_zero_with_its_class(manager: EpisodeManager, kind: str) -> None:
    code, failure = ODD_SOLUTIONS[kind]
    verdict = await _play(manager, HE0, [_python(code), SUBMIT])
    assert verdict["failure"] == failure, verdict
    assert failure in FAILURE_CLASSES


@pytest.mark.parametrize("kind", sorted(BAD_CODE))
async def test_code_that_fails_as_a_whole_is_zero_with_its_class(
    manager: EpisodeManager, kind: str
) -> None:
    source, failure = BAD_CODE[kind]
    write = Action(tool="write_file", arguments={"path": "solution.py", "content": source})
    verdict = await _play(manager, HE0, [write, SUBMIT])
    assert verdict["failure"] == failure, verdict


async def test_run_tests_on_a_directory_is_a_422_and_the_episode_goes_on(
    manager: EpisodeManager,
) -> None:
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(HE0)).episode_id
    await client.step(eid, _python("import os; os.mkdir('solution.py')").model_dump())
    with pytest.raises(InvalidActionError, match=r"solution\.py"):
        await client.step(eid, {"tool": "run_tests"})
    await client.step(eid, _python("import os; os.rmdir('solution.py')").model_dump())
    task = manager.packs.resolve(HE0)
    source = task_solution(task)
    await client.step(
        eid, {"tool": "write_file", "arguments": {"path": "solution.py", "content": source}}
    )
    final = await client.step(eid, {"tool": "submit"})
    assert final.reward == 1.0 and final.info["verdict"]["failure"] is None


async def test_run_tests_on_a_sparse_giant_is_a_422(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(HE0)).episode_id
    await client.step(eid, _python(ODD_SOLUTIONS["sparse-giant"][0]).model_dump())
    with pytest.raises(InvalidActionError, match="over"):
        await client.step(eid, {"tool": "run_tests"})
    final = await client.step(eid, SUBMIT.model_dump())
    assert final.info["verdict"]["failure"] == "too_large"


async def test_agent_faults_never_quarantine(manager: EpisodeManager) -> None:
    for kind in ("directory", "fifo", "sparse-giant"):  # void_limit is 2 here
        await _play(manager, HE0, [_python(ODD_SOLUTIONS[kind][0]), SUBMIT])
    task = manager.packs.resolve(HE0)
    assert manager.sampler.quarantined_count() == 0
    assert manager.sampler.quarantine_note(task.ref) is None


# -- terminal: the whole workspace -------------------------------------------------------------


DEEP = "d=$PWD; for i in $(seq 200); do mkdir a && cd a; done; echo done > $d/out.txt"
SPARSE = "for i in $(seq 40); do truncate -s 200M f$i; done; echo done > out.txt"


async def test_terminal_tree_too_deep_is_zero(manager: EpisodeManager) -> None:
    verdict = await _play(manager, "test/faults:done", [_bash(DEEP), SUBMIT])
    assert verdict["failure"] == "too_deep", verdict


async def test_terminal_sparse_files_over_the_workspace_are_zero(manager: EpisodeManager) -> None:
    # 40 x 200 MiB apparent in a 256 MiB workspace: read in full, 8 GiB in the server.
    verdict = await _play(manager, "test/faults:done", [_bash(SPARSE), SUBMIT])
    assert verdict["failure"] == "too_large", verdict


async def test_terminal_odd_files_beside_a_right_answer_still_pass(
    manager: EpisodeManager,
) -> None:
    odd = (
        "mkfifo pipe && ln -s /etc/passwd link && ln -s /dev/zero zero && "
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" && "
        "for i in $(seq 100); do mkdir -p x/$i; done && echo done > out.txt"
    )
    client = AsyncInProcessClient(manager)
    eid = (await client.reset("test/faults:done")).episode_id
    await client.step(eid, _bash(odd).model_dump())
    final = await client.step(eid, SUBMIT.model_dump())
    assert final.info["verdict"]["status"] == "ok" and final.reward == 1.0, final.info


# -- the same file types on docker -------------------------------------------------------------


@pytest.fixture
async def docker_manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    reason = docker_skip_reason(BASE_IMAGE)
    if reason:
        pytest.skip(reason)
    built = build_manager(_settings(tmp_path, sandbox="docker"))
    built.packs.add(load_pack(_terminal_pack(tmp_path / "term")))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("kind", DOCKER_ODD)
async def test_docker_odd_solution_file_is_zero_with_its_class(
    docker_manager: EpisodeManager, kind: str
) -> None:
    code, failure = ODD_SOLUTIONS[kind]
    verdict = await _play(docker_manager, HE0, [_python(code), SUBMIT])
    assert verdict["failure"] == failure, verdict


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["too_deep", "too_large"])
async def test_docker_terminal_workspace_faults_are_zero(
    docker_manager: EpisodeManager, kind: str
) -> None:
    command = {"too_deep": DEEP, "too_large": SPARSE}[kind]
    verdict = await _play(docker_manager, "test/faults:done", [_bash(command), SUBMIT])
    assert verdict["failure"] == kind, verdict


# -- the agent's own sandbox state: full disk, fork bombs, odd names (issue 31, inv. 6) ---------

# Fill the workspace with real files until it is full (one file is capped by RLIMIT_FSIZE).
FILL_PY = (
    "import itertools\nfor i in itertools.count():\n    try:\n"
    "        open(f'big{i}', 'wb').write(b'0' * (8 << 20))\n"
    "    except OSError as e:\n        print(i, e)\n        break\n"
)
FILL_SH = "for i in $(seq 400); do head -c 8M /dev/zero > big$i 2>/dev/null || break; done; true"
# Files that take more room copied than in place: hard links, a sparse file.
HARD_LINKS = "echo done > out.txt; head -c 100M /dev/zero > a; ln a b; head -c 60M /dev/zero > c"
SPARSE_COPY = "echo done > out.txt; head -c 200M /dev/zero > a; truncate -s 60M s"
# A fork bomb left running in the background: the sandbox's pids limit stays full.
FORK_BOMB = (
    "echo done > out.txt; nohup setsid sh -c 'while :; do sleep 1000 & done' "
    ">/dev/null 2>&1 & sleep 3"
)
ODD_STATES = {
    "odd-names": "touch $'new\\nline' $'\\xff\\xfe' -- -rf --help $(printf 'x%.0s' $(seq 255))",
    "chmod-000-files": "chmod 000 out.txt; mkdir d; chmod 000 d",
    "chmod-000-workdir": "chmod 000 .",
    "symlink-loops": "ln -s a b; ln -s b a; ln -s . self; ln -s / root; ln -s /proc/self/fd fd",
    "holder-in-background": "(nohup sleep 1000 > held.txt 2>&1 &); exec 3>held2.txt",
    "many-small-files": "mkdir m && cd m && seq 20000 | xargs touch && cd ..",
}


async def _play_on(
    manager: EpisodeManager, task: str, actions: list[Action]
) -> tuple[dict[str, Any], list[str]]:
    """Play `actions` to the end: the final verdict (never void, never a 5xx) and the
    codes of the steps refused with a 422 (an agent fault in a step: the episode goes on)."""
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(task)).episode_id
    reply, refused = None, []
    for action in actions:
        try:
            reply = await client.step(eid, action.model_dump())
        except InvalidActionError as exc:
            refused.append(exc.code)
    assert reply is not None and reply.terminated
    assert reply.info["status"] == "done", reply.info  # never void
    verdict: dict[str, Any] = reply.info["verdict"]
    assert verdict["status"] == "ok" and verdict["reward"] == reply.reward, verdict
    return verdict, refused


WRITE_SOLUTION = Action(tool="write_file", arguments={"path": "solution.py", "content": "x = 1"})
TERMINAL_TOOLS = [
    _bash("echo hi; ls"),
    Action(tool="write_file", arguments={"path": "x.txt", "content": "hi"}),
    Action(tool="read_file", arguments={"path": "out.txt"}),
    Action(tool="list_dir", arguments={}),
    Action(tool="edit_file", arguments={"path": "out.txt", "old": "done", "new": "done"}),
]


async def _coding_full_workspace(manager: EpisodeManager) -> None:
    verdict, refused = await _play_on(
        manager, HE0, [_python(FILL_PY), WRITE_SOLUTION, Action(tool="run_tests"), SUBMIT]
    )
    assert refused == ["workspace_full"], refused  # write_file: a 422, not a void
    assert verdict["reward"] == 0.0


async def test_coding_write_into_a_full_workspace_is_a_422_never_void(
    manager: EpisodeManager,
) -> None:
    await _coding_full_workspace(manager)


@pytest.mark.parametrize("command", [HARD_LINKS, SPARSE_COPY], ids=["hard-links", "sparse"])
async def test_terminal_workspace_over_its_size_when_copied_is_workspace_full(
    manager: EpisodeManager, command: str
) -> None:
    verdict, _ = await _play_on(manager, "test/faults:done", [_bash(command), SUBMIT])
    assert verdict["reward"] == 0.0 and verdict["failure"] == "workspace_full", verdict
    assert "workspace_full" in FAILURE_CLASSES


async def test_terminal_tools_on_a_full_workspace_never_void(manager: EpisodeManager) -> None:
    fill = _bash("echo done > out.txt; " + FILL_SH)
    verdict, refused = await _play_on(manager, "test/faults:done", [fill, *TERMINAL_TOOLS, SUBMIT])
    assert set(refused) <= {"workspace_full"}, refused
    assert verdict["reward"] == 1.0, verdict  # the work was right: a full disk is no fault


async def test_terminal_fork_bomb_left_running_never_voids(manager: EpisodeManager) -> None:
    """Every tool after it: a 422 `process_limit` at worst; the verdict is the work's."""
    verdict, refused = await _play_on(
        manager, "test/faults:done", [_bash(FORK_BOMB), *TERMINAL_TOOLS, SUBMIT]
    )
    assert set(refused) <= {"process_limit"}, refused
    assert verdict["reward"] == 1.0 and verdict["failure"] is None, verdict
    assert "process_limit" in FAILURE_CLASSES


async def test_coding_fork_bomb_never_voids(manager: EpisodeManager) -> None:
    bomb = _python(
        "import subprocess, time\nsubprocess.Popen(['/bin/sh', '-c', 'while :; do sleep 1000 &"
        " done'], start_new_session=True)\ntime.sleep(3)"
    )
    verdict, refused = await _play_on(
        manager, HE0, [bomb, _python("print(1)"), WRITE_SOLUTION, Action(tool="run_tests"), SUBMIT]
    )
    assert set(refused) <= {"process_limit"}, refused
    assert verdict["reward"] == 0.0 and verdict["failure"] == "load_error", verdict


@pytest.mark.parametrize("kind", sorted(ODD_STATES))
async def test_terminal_odd_workspace_states_keep_a_right_answer(
    manager: EpisodeManager, kind: str
) -> None:
    command = "echo done > out.txt; " + ODD_STATES[kind] + "; true"
    verdict, refused = await _play_on(manager, "test/faults:done", [_bash(command), SUBMIT])
    assert not refused and verdict["reward"] == 1.0, verdict


# -- the same on docker ------------------------------------------------------------------------


@pytest.mark.slow
async def test_docker_coding_write_into_a_full_workspace_is_a_422_never_void(
    docker_manager: EpisodeManager,
) -> None:
    await _coding_full_workspace(docker_manager)


@pytest.mark.slow
@pytest.mark.parametrize("command", [HARD_LINKS, SPARSE_COPY], ids=["hard-links", "sparse"])
async def test_docker_terminal_workspace_over_its_size_when_copied_never_voids(
    docker_manager: EpisodeManager, command: str
) -> None:
    verdict, _ = await _play_on(docker_manager, "test/faults:done", [_bash(command), SUBMIT])
    assert verdict["reward"] in (0.0, 1.0)
    assert verdict["reward"] == 1.0 or verdict["failure"] == "workspace_full", verdict


@pytest.mark.slow
async def test_docker_terminal_fork_bomb_left_running_never_voids(
    docker_manager: EpisodeManager,
) -> None:
    verdict, refused = await _play_on(
        docker_manager, "test/faults:done", [_bash(FORK_BOMB), *TERMINAL_TOOLS, SUBMIT]
    )
    assert set(refused) <= {"process_limit"}, refused
    assert verdict["reward"] == 1.0, verdict


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(ODD_STATES))
async def test_docker_terminal_odd_workspace_states_keep_a_right_answer(
    docker_manager: EpisodeManager, kind: str
) -> None:
    command = "echo done > out.txt; " + ODD_STATES[kind] + "; true"
    verdict, refused = await _play_on(docker_manager, "test/faults:done", [_bash(command), SUBMIT])
    assert not refused and verdict["reward"] == 1.0, verdict


# Fill folders with files, then with empty files until no inode is left (on docker the
# workspace and /tmp are tmpfs: their pages and inodes are the container's memory, which no
# OOM kill frees).
FILL = (
    "echo done > out.txt; for d in {folders}; do for i in $(seq 40); do "
    "head -c 8M /dev/zero > $d/fill$i 2>/dev/null || break; done; "
    "mkdir -p $d/n && (cd $d/n && timeout 20 sh -c 'seq 600000 | xargs touch' 2>/dev/null); "
    "done; true"
)


@pytest.mark.slow
@pytest.mark.parametrize("folders", ["/tmp", ". /tmp"], ids=["tmp", "workspace-and-tmp"])
async def test_docker_memory_filled_by_the_agents_files_keeps_its_work(
    docker_manager: EpisodeManager, folders: str
) -> None:
    """The workspace-exhaustion cheat voided docker episodes: /tmp's inodes were unbounded,
    so files and inodes filled the container's memory; runc could not start the next exec
    ("read init-p: connection reset": void), or the container was OOM-killed and restarted,
    which remounts its tmpfs workspace empty (the agent's answer lost). Now both folders are
    bounded well inside the memory limit: a full /tmp keeps the answer; a full workspace is
    0 with its class where its copy for the tests is over the size (never void)."""
    command = FILL.format(folders=folders)
    actions = [_bash(command), *TERMINAL_TOOLS, SUBMIT]
    verdict, refused = await _play_on(docker_manager, "test/faults:done", actions)
    assert set(refused) <= {"workspace_full"}, refused
    if folders == "/tmp":
        assert verdict["reward"] == 1.0, (verdict["feedback"], refused)
    else:
        assert verdict["reward"] == 1.0 or verdict["failure"] in ("too_large", "workspace_full")


def test_a_container_whose_memory_is_full_is_the_agents_fault() -> None:
    """The diagnosis after an exec could not start: memory (less idle cache) at 90 % of the
    limit is the agent's (`oom`), named by what holds it; cgroup v1 and v2 shapes."""
    mib = 1 << 20
    v2 = {"usage": 1000 * mib, "limit": 1024 * mib, "stats": {"shmem": 700 * mib}}
    fault = memory_fault(v2, 1024)
    assert fault is not None and fault.failure == "oom" and "files in /tmp" in str(fault)
    v1 = {"usage": 1010 * mib, "limit": 1024 * mib, "stats": {"total_shmem": 10 * mib}}
    fault = memory_fault(v1, 1024)
    assert fault is not None and "its processes" in str(fault)
    cached = {"usage": 1000 * mib, "limit": 1024 * mib, "stats": {"inactive_file": 400 * mib}}
    assert memory_fault(cached, 1024) is None  # page cache is reclaimable: not full
    assert memory_fault({}, 1024) is None  # no stats: nothing to blame
