"""SIGTERM to `palaestra serve`: stop accepting, let running steps finish up to
`shutdown_grace_s`, end every other episode `void` ("server shut down"), flush the store
and leave no sandbox process or cgroup behind.

Before: uvicorn waited for every running request without a deadline, so one step that
ran long (a sleeping agent program) held a terminating server for as long as it liked.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerProcess

from palaestra.sandbox import cgroups

TASK = "openai/humaneval:HumanEval-1"
GRACE_S = 3


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (sandboxes, jails, helpers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {"PALAESTRA_SHUTDOWN_GRACE_S": str(GRACE_S), "PALAESTRA_POOL_SIZE": "0"}
    proc = ServerProcess(tmp_path / "data", extra_env=env).start()
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)


def test_sigterm_drains_steps_voids_the_rest_and_leaves_nothing(server: ServerProcess) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    http = httpx.Client(base_url=server.url, headers=server.headers, timeout=120)
    ids = [http.post("/v1/episodes", json={"task": TASK}).json()["episode_id"] for _ in range(3)]
    quick, slow, idle = ids
    replies: dict[str, Any] = {}

    def step(eid: str, code: str) -> None:
        try:
            action = {"tool": "run_python", "arguments": {"code": code, "timeout": 60}}
            with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as c:
                replies[eid] = c.post(f"/v1/episodes/{eid}/step", json={"action": action})
        except httpx.HTTPError as exc:
            replies[eid] = exc

    threads = [
        threading.Thread(target=step, args=(quick, "import time; time.sleep(1.5); print('done')")),
        threading.Thread(target=step, args=(slow, "import time; time.sleep(50); print('late')")),
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # both steps are running in their sandboxes
    sandboxes = descendants(pid)
    assert sandboxes, "the running steps should have sandbox processes"
    jails = cgroups.detect(pid)[0]
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.HTTPError):  # no longer accepting
        httpx.get(f"{server.url}/healthz", timeout=2)
    server.proc.wait(timeout=GRACE_S + 30)
    took = time.monotonic() - sent
    for thread in threads:
        thread.join(timeout=10)
    assert took < GRACE_S + 20, f"the server took {took:.1f} s to stop"

    # The quick step finished inside the grace period and its caller got the reply.
    reply = replies[quick]
    assert isinstance(reply, httpx.Response) and reply.status_code == 200, reply
    assert "done" in reply.json()["observation"]["text"]
    # The slow one was cut off; never a success that did not happen.
    late = replies[slow]
    assert not (isinstance(late, httpx.Response) and late.status_code == 200), late.text

    db = sqlite3.connect(server.data_dir / "palaestra.sqlite3")
    rows = dict(
        (row[0], row[1:])
        for row in db.execute("SELECT id, status, void_reason, step_count FROM episodes")
    )
    for eid in ids:
        status, reason, _ = rows[eid]
        assert status == "void" and reason == "server shut down", (eid, rows[eid])
    assert rows[quick][2] == 1
    steps = db.execute(
        "SELECT COUNT(*) FROM step_records s JOIN episodes e ON e.number = s.episode WHERE e.id=?",
        (quick,),
    ).fetchone()
    assert steps[0] == 1, "the finished step was not flushed to the store"
    assert idle in rows

    # Nothing is left: no sandbox process, no cgroup of this server.
    deadline = time.monotonic() + 5
    while any(alive(p) for p in sandboxes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in sandboxes if alive(p)], "sandbox processes outlived the server"
    if jails is not None:
        left = [d for d in jails.server_dirs() if d.exists()]
        assert not left, f"cgroups left behind: {left}"
    mounts = Path("/proc/self/mounts").read_text()
    assert str(server.data_dir) not in mounts
    http.close()
