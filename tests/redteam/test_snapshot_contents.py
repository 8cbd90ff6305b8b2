"""Hostile workspace contents against fork, checkpoint/resume and regrade
(server/fork.py, server/checkpoint.py, server/regrade.py): what the agent leaves in its
workdir travels through the host when an episode is copied, snapshotted or regraded.

- links out of the workspace (absolute, `../..`, to /proc/self and to the data dir), a
  fifo, a hard link and a name with a newline: a checkpoint keeps them, a resume gives
  them back as they were (a venv's absolute `python` link is ordinary; its episode must
  not go void), and no host path outside the sandbox is written or read through them;
- a fork copies the same tree without following a link, and the child sees its parent's
  links as links;
- a workspace no copy can hold (sparse files past the cap, a tree past the depth limit,
  hard links to one file) is the agent's 4xx for a checkpoint and a fork alike: nothing
  stored, no sandbox left, the episode goes on.

Real bwrap sandboxes, the real app over real managers restarted on one data dir (ASGI)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import docker_skip_reason, make_settings

from palaestra.sandbox.docker import BASE_IMAGE
from tests.redteam.tenants import Tenant
from tests.server.test_checkpoint import HE, Servers, post, step

DOCKER_SKIP = docker_skip_reason(BASE_IMAGE)

# Made by the agent: every kind of entry a host copy must not follow or choke on.
HOSTILE = r"""
import os
os.makedirs("d/e", exist_ok=True)
open("d/e/f.txt", "w").write("inner")
os.symlink("/etc", "abs_etc")
os.symlink("/usr/bin/python3", "py")  # as a venv has
os.symlink("../../../../../../../../tmp", "up_tmp")
os.symlink("/proc/self/root", "proc_root")
os.symlink("{data}", "data_dir")
os.symlink("d/e/f.txt", "inner_link")
os.mkfifo("pipe")
os.link("d/e/f.txt", "hard")
open("new\nline", "w").write("nl")
print("made")
"""

PROBE = r"""
import os
try:
    print(os.listdir("data_dir"))
except OSError:
    print("unreachable")
"""

CHECK = r"""
import os, json, stat
out = {}
for n in sorted(os.listdir(".")):
    st = os.lstat(n)
    out[n] = os.readlink(n) if stat.S_ISLNK(st.st_mode) else stat.S_IFMT(st.st_mode)
print(json.dumps(out))
"""


def run(code: str) -> dict[str, Any]:
    return {"tool": "run_python", "arguments": {"code": code}}


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    made = Servers(make_settings(data_dir=tmp_path / "data"))
    await made.start()
    yield made
    await made.stop()
    for t in made.tenants:
        await t.http.aclose()


async def listing(t: Tenant, eid: str) -> dict[str, Any]:
    text = (await step(t, eid, run(CHECK)))["observation"]["text"]
    line = next(x for x in text.splitlines() if x.startswith("{"))
    loaded: dict[str, Any] = json.loads(line)
    return loaded


def links(entries: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in entries.items() if isinstance(v, str)}


async def hostile(servers: Servers, me: Tenant) -> str:
    eid = await me.start(task=HE)
    code = HOSTILE.replace("{data}", str(servers.settings.data_dir))
    assert "made" in (await step(me, eid, run(code)))["observation"]["text"]
    return eid


async def test_links_out_of_the_workspace_survive_a_resume(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eid = await hostile(servers, me)
    before = await listing(me, eid)
    assert (await post(me, eid, "checkpoint")).status_code == 200
    await servers.stop()
    await servers.start()
    reply = await post(me, eid, "resume")
    assert reply.status_code == 200, reply.text
    after = await listing(me, eid)
    assert links(after) == links(before)  # every link as it was, none followed
    assert set(after) == set(before) - {"pipe"}  # a fifo is not kept, as a download skips it


async def test_a_checkpoint_of_hostile_entries_writes_nothing_outside(
    servers: Servers, tmp_path: Path
) -> None:
    me = servers.tenant(["train"])
    eid = await hostile(servers, me)
    outside = sorted(p for p in tmp_path.rglob("*") if "snapshots" not in p.parts)
    reply = await post(me, eid, "checkpoint")
    assert reply.status_code == 200, reply.text
    # The snapshot is one tar file; nothing else on the host changed through a link.
    now = sorted(p for p in tmp_path.rglob("*") if "snapshots" not in p.parts)
    assert set(now) - set(outside) <= {tmp_path / "data" / "tmp"}  # the spool folder
    assert not (tmp_path / "data" / "data_dir").exists()
    await servers.stop()
    await servers.start()
    assert (await post(me, eid, "resume")).status_code == 200
    # Resumed, the links still lead nowhere the agent could not go before: the data dir is
    # not in the sandbox, so its store and snapshots are out of reach.
    text = (await step(me, eid, run(PROBE)))["observation"]["text"]
    assert "unreachable" in text and "snapshots" not in text and "palaestra.db" not in text


async def test_a_fork_copies_hostile_entries_as_they_are(servers: Servers) -> None:
    me = servers.tenant(["train"])
    eid = await hostile(servers, me)
    before = await listing(me, eid)
    reply = await post(me, eid, "fork")
    assert reply.status_code == 200, reply.text
    child = reply.json()["episode_id"]
    after = await listing(me, child)
    assert links(after) == links(before)
    assert "pipe" not in after  # a fifo is not copied, as a download skips it
    # The hard link is a file of its own in the child: writing it leaves the parent's be.
    await step(me, child, run("open('hard', 'w').write('changed')"))
    text = (await step(me, eid, run("print(open('d/e/f.txt').read())")))["observation"]["text"]
    assert "inner" in text and "changed" not in text


GIANTS = {
    "sparse": (  # 200 files as large as the file-size limit lets one be
        "import resource\nlimit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]\n"
        "for i in range(200):\n"
        "    open(f'giant{i}', 'wb').truncate(min(limit, 1 << 40) if limit > 0 else 1 << 40)"
    ),
    "deep": "import os\nfor i in range(300):\n    os.mkdir('d'); os.chdir('d')",
    "hardlinks": (
        "import os\nopen('h', 'wb').write(os.urandom(1 << 20))\n"
        "for i in range(2000):\n    os.link('h', f'h{i}')"
    ),
}


@pytest.mark.parametrize("what", sorted(GIANTS))
async def test_an_uncopyable_workspace_is_the_agents_4xx(servers: Servers, what: str) -> None:
    """A checkpoint or fork of a workspace no copy can hold (a sparse terabyte, a tree past
    the depth limit, hard links to one file) is a 4xx naming the agent's fault; nothing is
    stored, no sandbox is left, and the episode goes on."""
    assert servers.manager is not None
    host = servers.manager.host
    me = servers.tenant(["train"])
    eid = await me.start(task=HE)
    assert "exit code: 0" in (await step(me, eid, run(GIANTS[what])))["observation"]["text"]
    before = host.sandboxes.live_count  # type: ignore[attr-defined]
    for route in ("checkpoint", "fork"):
        reply = await post(me, eid, route)
        assert 400 <= reply.status_code < 500, (route, reply.status_code, reply.text)
        assert reply.json()["error"]["code"]
    assert host.sandboxes.live_count == before  # type: ignore[attr-defined]
    root = servers.settings.data_dir / "snapshots" / "sha256"
    assert not root.is_dir() or not [p for p in root.rglob("*") if p.is_file()]
    assert (await step(me, eid, run("print(40 + 2)")))["observation"]["text"].strip().endswith("42")


@pytest.mark.slow
@pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
async def test_hostile_entries_on_docker(tmp_path: Path) -> None:
    """On docker a fork and a resume give the links back as they were, too (a relative one
    climbing out of the workdir made the fork a 503 and the resume void)."""
    made = Servers(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await made.start()
    try:
        me = made.tenant(["train"])
        eid = await hostile(made, me)
        entries = await listing(me, eid)
        before = links(entries)
        assert before["py"] == "/usr/bin/python3" and before["proc_root"] == "/proc/self/root"
        # A relative link climbing above the workdir, which the engine refuses to unpack,
        # comes back as the absolute path it resolves to in the container (it was a 503).
        before["up_tmp"] = "/tmp"
        reply = await post(me, eid, "fork")
        assert reply.status_code == 200, reply.text
        child = await listing(me, reply.json()["episode_id"])
        assert links(child) == before
        assert set(child) == set(entries) - {"pipe"}, set(entries) ^ set(child)
        assert (await post(me, eid, "checkpoint")).status_code == 200
        await made.stop()
        await made.start()
        resumed = await post(me, eid, "resume")
        assert resumed.status_code == 200, resumed.text
        assert links(await listing(me, eid)) == before
        text = (await step(me, eid, run(PROBE)))["observation"]["text"]
        assert "unreachable" in text and "snapshots" not in text
    finally:
        await made.stop()
        for t in made.tenants:
            await t.http.aclose()


@pytest.mark.slow
@pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
async def test_a_hard_linked_file_survives_a_docker_fork(tmp_path: Path) -> None:
    """docker's download skipped the engine's hard-link members: a file's second name was
    lost from a fork, a resume and a kept final state (bwrap copies it as its own file)."""
    made = Servers(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await made.start()
    try:
        me = made.tenant(["train"])
        eid = await me.start(task=HE)
        await step(
            me, eid, run("import os\nopen('a.txt', 'w').write('x')\nos.link('a.txt', 'b.txt')")
        )
        reply = await post(me, eid, "fork")
        assert reply.status_code == 200, reply.text
        child = reply.json()["episode_id"]
        assert {"a.txt", "b.txt"} <= set(await listing(me, child))
        text = (await step(me, child, run("print(open('b.txt').read() + '!')")))["observation"]
        assert "x!" in text["text"]
    finally:
        await made.stop()
        for t in made.tenants:
            await t.http.aclose()
