"""The server's own files are out of every sandbox's reach (issue 14, item 1, sandbox side).

A data dir is made where operators put it -- the checkout's ``.palaestra``, the home of the
uid running the server, a tmp dir -- with the real server files (the SQLite store with a
token, ``admin.token``, a pack object), all made world-readable so that only the sandbox's
mounts keep them out. Sandbox code then hunts for them by path, by listing, by ``find`` and
through ``/proc`` (the server's environment, ``/proc/1``, ``/proc/<server pid>``), on bwrap,
the fork server and docker, with the server running as root and (bwrap, fork server) as a
normal user whose home holds the data dir. The sandbox's mount table must not hold the
data dir, the checkout, a home or the host's ``/tmp`` (its own runtime folder and the
palaestra cache, which hold its workspace, ``/etc`` copies and helper binaries, are fine).

Already true before issue 14 (no backend bound any of them): these tests guard it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from palaestra.sandbox.base import Backend, Sandbox
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sandbox.forkrun import PythonRun
from palaestra.sandbox.forkserver import ForkServerUnavailable, PythonForkServer
from palaestra.server.auth import ensure_admin_token
from palaestra.server.db import Database
from palaestra.server.store import Store
from tests.users import as_user, closed_to_others, normal_user, why_not_root_and_user

from .harness import REPO, Guard, new_marker, on_backends

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PROGRAMS = Path(__file__).parent / "programs"
ATTACK = (PROGRAMS / "server_files_attack.sh").read_text()
CACHE = Path(os.environ.get("PALAESTRA_CACHE") or Path.home() / ".cache" / "palaestra")


def make_data_dir(data: Path, secret: str) -> str:
    """The server's files in `data`, readable by anyone; returns the admin token."""
    data.mkdir(parents=True)
    store = Store(Database.open(data / "palaestra.sqlite3"))
    token = ensure_admin_token(data, store.db).read_text().strip()
    store.close()
    pack = data / "packs" / "sha256" / ("0" * 12)
    pack.mkdir(parents=True)
    (pack / "tasks.jsonl").write_text(json.dumps({"private": {"answer": secret}}) + "\n")
    for p in [data, *data.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return token


@pytest.fixture(params=["checkout", "home", "tmp"])
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    base = {"checkout": REPO, "home": Path.home(), "tmp": tmp_path}[request.param]
    data = base / f".palaestra-adversarial-{new_marker()}"
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)


def mounts(output: str) -> list[tuple[str, str]]:
    """(source root, mount point) of each mount, from the attack's mountinfo section."""
    table = output.split("mounts:\n", 1)[-1].split("end of mounts", 1)[0]
    return [(ln.split()[0], ln.split()[1]) for ln in table.splitlines() if len(ln.split()) == 2]


def forbidden_mounts(
    pairs: list[tuple[str, str]], data: Path, allowed: list[str], home: Path
) -> list[tuple[str, str]]:
    """Mounts whose source is the data dir, the checkout, a home or the host's /tmp."""

    def under(path: str, top: str) -> bool:
        return path == top or path.startswith(top.rstrip("/") + "/")

    bad = []
    for root, point in pairs:
        if any(under(root, a) for a in allowed):
            continue
        tops = [str(data), str(REPO), str(home), "/root", "/home", "/tmp"]
        if any(under(root, t) for t in tops):
            bad.append((root, point))
    return bad


def assert_unreachable(output: str, secrets_: list[str]) -> None:
    assert "READ " not in output, "the sandbox opened a server file"
    for s in secrets_:
        assert s not in output, f"a server secret reached the sandbox: {s[:12]}…"
    assert "SQLite format 3" not in output, "the sandbox read the SQLite store"


@pytest.mark.parametrize("backend_name", on_backends())
async def test_server_files_unreachable(
    backend_name: str,
    backend: Backend,
    box: Sandbox,
    guard: Guard,
    data_dir: Path,
) -> None:
    token = make_data_dir(data_dir, guard.secret)
    await box.write_file("attack.sh", ATTACK)
    argv = ["sh", "attack.sh", str(data_dir), str(os.getpid()), str(REPO)]
    r = await box.exec(argv, timeout=60, max_output=4 << 20)
    assert not r.truncated, r
    out = r.stdout + r.stderr
    assert r.exit_code == 1, f"the sandbox read a server file: {r}"
    assert_unreachable(out, [token, guard.secret, str(data_dir / "admin.token")])
    allowed = [str(CACHE)]
    if isinstance(backend, BwrapBackend):
        allowed.append(str(backend.runtime_dir))
    bad = forbidden_mounts(mounts(out), data_dir, allowed, Path.home())
    assert mounts(out) and not bad, f"host folders mounted in the sandbox: {bad}"
    await guard.check(out)


async def test_forkserver_cannot_reach_server_files(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"s3cret-{new_marker()}"
    monkeypatch.setenv("PALAESTRA_ADVERSARIAL_SECRET", secret)
    token = make_data_dir(data_dir, secret)
    forks = PythonForkServer()
    try:
        reader = (PROGRAMS / "nonroot_server.py").read_text()
        code = reader.split('READER = """', 1)[1].split('"""', 1)[0]
        stdin = f"{data_dir} {os.getpid()}".encode()
        job = PythonRun(code, stdin=stdin, timeout=20, max_output=1 << 20, memory_mb=256)
        r = await forks.run(job)
    except ForkServerUnavailable as exc:
        pytest.skip(f"fork server unavailable here: {exc}")
    finally:
        await forks.aclose()
    assert r.exit_code == 0, r
    assert r.stdout.startswith("[]"), f"the run read server files: {r.stdout[:300]}"
    assert_unreachable(r.stdout + r.stderr, [token, secret])
    assert str(data_dir) not in r.stdout.split("mounts:", 1)[1]  # not in its mount table


def test_server_as_a_normal_user_keeps_its_files() -> None:
    """The server runs as a normal user (bwrap unprivileged: the sandbox's host uid is the
    server's own, so only the mounts keep the files out), its data dir in that user's home."""
    if why := why_not_root_and_user():
        pytest.skip(why)
    user = normal_user()
    assert user is not None
    site = next(p for p in sys.path if p.endswith("site-packages") and "venv" in p)
    for needed in (PROGRAMS / "nonroot_server.py", Path(site)):
        if why := closed_to_others(needed):
            pytest.skip(f"the checkout is private to root here: {why}")
    secret = f"s3cret-{new_marker()}"
    argv = [*as_user(user), "/usr/bin/python3", str(PROGRAMS / "nonroot_server.py"), site]
    stdin = json.dumps({"attack": ATTACK, "secret": secret, "checkout": str(REPO)})
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=150, check=False, cwd="/"
    )
    if done.returncode != 0 and "ForkServerUnavailable" in done.stderr:
        pytest.skip(f"fork server unavailable as {user.pw_name}: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["uid"] == user.pw_uid
    data = Path(out["data"])
    assert data.parent.parent == Path(user.pw_dir)
    code, text = out["bwrap"]
    assert code == 1, f"the sandbox read a server file: {text[-2000:]}"
    assert_unreachable(text, [secret])
    runtime = f"/tmp/palaestra-{user.pw_uid}"
    bad = forbidden_mounts(mounts(text), data, [runtime], Path(user.pw_dir))
    assert mounts(text) and not bad, f"host folders mounted in the sandbox: {bad}"
    code, text = out["fork"]
    assert code == 0 and text.startswith("[]"), f"the run read server files: {text[:500]}"
    assert_unreachable(text, [secret])
    table = text.split("mounts:", 1)[1]
    assert str(data) not in table and runtime + "/sandboxes" not in table
