"""A wheel built from this tree, installed into a fresh venv inside a 0700 folder (as a root
user's home is), serves every built-in family, a harness episode and a generator publish
(issue 32: any location, any install).

The venv gets palaestra only from the wheel (`palaestra.__file__` is asserted inside it);
its dependencies come from this interpreter's site-packages through a .pth line, so the
test needs no network. A .pth line only appends that folder: the editable install's finder
there never runs, so nothing of the checkout is importable from the new venv. The server
runs from the new venv's `palaestra` with a fresh data dir and the current folder inside
the 0700 folder; packs, image recipes and sandbox programs must come from the wheel.

A normal user (root becomes uid 1000 with setpriv, tests/users.py) installs the same wheel
into a venv of their own, in a fresh 0700 folder of their home, from a system python of this
version (this interpreter may live under root's home), and serves from it with the data dir,
cache and current folder there: the server runs as that user, its bwrap sandboxes
unprivileged, and grades coding (oracle 1, wrong answer 0), terminal and a generator publish.

Bad input: the same wheel installed under umask 077 (its files closed to the sandbox uid)
is refused at `serve` start with the path and the fix, not a void episode later.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.sandbox.base import default_cache
from palaestra.sandbox.bwrap.host import is_root
from palaestra.server.packs.archive import pack_archive
from tests.conftest import HELDOUT_SECRET, ServerProcess, cli_env
from tests.harness_peers import SOLVE_2, TRAIN_TASK, finished, harness, started
from tests.peers.fake_model import FakeModel, bash_call, submit_call
from tests.users import as_user, closed_to_others, normal_user, why_not_root_and_user

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What a wheel is built from: the tree without the checkout's own state and the suite.
NOT_SOURCES = {".git", ".venv", "build", "dist", ".cache", ".palaestra", "tests", "bench",
               ".toolchains", "runs", "reports", ".mypy_cache", ".ruff_cache",
               ".pytest_cache"}  # fmt: skip
FAMILIES = ("coding", "reasoning", "letters", "echo", "terminal", "cad", "finance")
# finance-commentary is graded by a judge model: without a judge endpoint (Settings.judges)
# its episodes are void by design, so it is served (listed) but not played here.
GENERATOR = '''"""Words from seeds; imports palaestra inside the generator's sandbox."""
from palaestra.sdk.task import Task


def generate(seed, index, level):
    word = f"w{seed}-{Task.__name__}"
    return {"public": {"instruction": f"Say {word}"}, "private": {"answer": word}}
'''
PACK_TOML = """name = "test/wheelgen"
version = "1.0.0"
families = ["echo"]

[splits.train]
sealed = false

[generators.words]
module = "gen.py"
family = "echo"
domain = "words/echo"
splits.train = { seeds = [0, 1000], count = 2 }
"""


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """What a fresh clone does not hold: the top level's caches and outputs, and the
    byte-compiled modules a run of the suite writes everywhere."""
    skipped = {name for name in names if name == "__pycache__"}
    return skipped | (NOT_SOURCES if folder == str(ROOT) else set())


def build_wheel(out: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the tree (a build/ left in the checkout would
    leak stale files into the wheel)."""
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=_not_sources)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*pip, "-w", str(out), str(src)], check=True, capture_output=True)
    shutil.rmtree(src)
    (wheel,) = out.glob("palaestra-*.whl")
    return wheel


def install(
    wheel: Path,
    where: Path,
    umask: int = 0o022,
    *,
    prefix: Sequence[str] = (),
    base: str = sys.executable,
) -> Path:
    """A fresh venv at `where` with the wheel in it and this interpreter's site-packages
    (the dependencies) appended by a .pth line; returns its python. Every step runs under
    the command `prefix` (another user: tests/users.py), the venv made by and pip run from
    the python `base`."""

    def run(*argv: str | Path) -> str:
        done = subprocess.run([*prefix, *map(str, argv)], capture_output=True, text=True)
        assert done.returncode == 0, (argv, done.stdout + done.stderr)
        return done.stdout.strip()

    run(base, "-m", "venv", "--without-pip", where)
    python = where / "bin" / "python"
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    old = os.umask(umask)
    try:
        run(base, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
            "--no-cache-dir", "-q", wheel)  # fmt: skip
    finally:
        os.umask(old)
    pth = Path(site, "zz-deps.pth")  # after the install: pip must not see the checkout's
    run(python, "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        pth, sysconfig.get_paths()["purelib"] + "\n")  # fmt: skip
    return python


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("wheel-home")
    os.chmod(home, 0o700)  # a root user's home: closed to the sandbox uid
    yield home


@pytest.fixture(scope="module")
def wheel(private: Path) -> Path:
    return build_wheel(private / "dist")


def test_the_wheel_holds_packs_images_and_programs_and_nothing_of_the_suite(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for pack in sorted(p.name for p in (ROOT / "packs").iterdir() if p.is_dir()):
        here = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "packs" / pack).rglob("*")
                      if f.is_file() and "__pycache__" not in f.parts)  # fmt: skip
        shipped = sorted(n.removeprefix("palaestra/") for n in names
                         if n.startswith(f"palaestra/packs/{pack}/"))  # fmt: skip
        assert shipped == here, pack
    assert "palaestra/images/verifier/wheels.txt" in names
    assert "palaestra/server/harness/programs/bash_agent.py" in names
    assert "palaestra/server/packs/programs/generate.py" in names
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
    assert not [n for n in names if n.endswith((".pyc", ".egg-info"))]
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 1e6:.2f} MB, {len(names)} files")


def play_oracle(server: ServerProcess, task: str) -> dict[str, Any]:
    """One episode of `task` with the oracle policy (the CLI's `--policy oracle`)."""
    with server.client(timeout=600) as client:
        reset = client.reset(task, options={"oracle": True})
        step = None
        while step is None or not (step.terminated or step.truncated):
            step = client.step(reset.episode_id, {"tool": "oracle"})
        verdict = client.verify(reset.episode_id)
        client.close(reset.episode_id)
    return verdict.model_dump()


def first_task(server: ServerProcess, family: str) -> str:
    reply = httpx.get(f"{server.url}/v1/tasks", headers=server.headers, timeout=60,
                      params={"family": family, "split": "train", "limit": 1})  # fmt: skip
    assert reply.status_code == 200, reply.text
    (task,) = reply.json()["tasks"]
    return str(task["id"])


def publish_generator(server: ServerProcess, pack: Path) -> None:
    """Publish a generator pack (made at `pack`) whose generator imports palaestra in its
    sandbox; its two generated tasks must be listed."""
    pack.mkdir()
    (pack / "pack.toml").write_text(PACK_TOML)
    (pack / "gen.py").write_text(GENERATOR)
    headers = {**server.headers, "content-type": "application/gzip"}
    reply = httpx.post(f"{server.url}/v1/packs", content=pack_archive(pack),
                       headers=headers, timeout=300)  # fmt: skip
    assert reply.status_code == 201, reply.text
    tasks = httpx.get(f"{server.url}/v1/tasks", params={"pack": "test/wheelgen"},
                      headers=server.headers).json()["tasks"]  # fmt: skip
    assert len(tasks) == 2 and "Say w" in tasks[0]["public"]["instruction"]


def test_a_wheel_in_a_private_folder_serves_everything(private: Path, wheel: Path) -> None:
    python = install(wheel, private / "venv")
    where = subprocess.run(
        [str(python), "-c", "import palaestra; print(palaestra.__file__)"],
        check=True, capture_output=True, text=True, cwd=private,
    ).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(private / "venv"), where
    program = private / "venv" / "bin" / "palaestra"
    cache = os.environ.get("PALAESTRA_CACHE")  # the shared cache (images, generated tasks)
    env = cli_env(**({"PALAESTRA_CACHE": cache} if cache else {}))
    started_at = time.monotonic()
    server = ServerProcess(private / "data", env, program=program).start()
    ready_s = time.monotonic() - started_at
    try:
        assert server.token is not None
        # The first command, as a user types it, with the wheel's own CLI.
        run = subprocess.run(
            [str(program), "run", "openai/humaneval:HumanEval-1", "--policy", "oracle",
             "--url", server.url, "--token", server.token],
            capture_output=True, text=True, timeout=300, env=env, cwd=private,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert '"passed": true' in run.stdout, run.stdout
        packs = httpx.get(f"{server.url}/v1/packs", headers=server.headers).json()
        served = {p["name"] for p in packs}
        assert "palaestra/finance-commentary" in served and "openai/humaneval" in served
        for family in FAMILIES:
            verdict = play_oracle(server, first_task(server, family))
            assert verdict["status"] == "ok" and verdict["passed"], (family, verdict)
        # Harness mode: the built-in bash-agent, bound from the served copy.
        fake = FakeModel([bash_call(SOLVE_2), submit_call()])
        with fake.serve() as url:
            episode = started(server, server.token, TRAIN_TASK, harness(url))
            state = finished(server, server.token, episode)
        assert state["verdict"]["reward"] == 1.0, state
        publish_generator(server, private / "wheelgen")
    finally:
        server.stop()
    assert "Traceback" not in server.logs()
    print(f"wheel serve ready in {ready_s:.1f} s")


@pytest.mark.skipif(not is_root(), reason="as a user, bwrap reads what the user reads")
def test_an_install_the_sandboxes_cannot_read_is_refused_at_serve(
    private: Path, wheel: Path
) -> None:
    install(wheel, private / "closed-venv", umask=0o077)
    program = private / "closed-venv" / "bin" / "palaestra"
    serve = subprocess.run(
        [str(program), "serve", "--port", "9", "--data-dir", str(private / "closed-data")],
        capture_output=True, text=True, timeout=120, env=cli_env(), cwd=private,
    )  # fmt: skip
    assert serve.returncode == 2, serve.stdout + serve.stderr
    message = " ".join(serve.stderr.split())
    assert "sandbox_location" in message and "Traceback" not in message
    assert str(private / "closed-venv") in message  # the path
    assert "umask 022" in message and "chmod -R o+rX" in message  # the fix


def base_python(user: pwd.struct_passwd) -> str | None:
    """A python of this version that `user` can run: this interpreter's base (often out of
    their reach, e.g. under root's home) or the system's; with venv and pip."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (Path(sys.base_prefix, "bin", version), Path("/usr/bin", version)):
        if python.exists() and closed_to_others(python) is None:
            probe = subprocess.run([*as_user(user), str(python), "-c", "import venv, pip"],
                                   capture_output=True)  # fmt: skip
            if probe.returncode == 0:
                return str(python)
    return None


def owned_by(user: pwd.struct_passwd, *paths: Path) -> None:
    """Give `paths` (made by root) to `user`."""
    for path in paths:
        os.chown(path, user.pw_uid, user.pw_gid)


def test_a_wheel_installed_by_a_normal_user_serves_from_its_home(wheel: Path) -> None:
    """A normal user installs the wheel into a venv in a 0700 folder of their home and serves
    from it (data dir, cache and current folder there too): the server runs as that user,
    its sandboxes unprivileged, and grades a coding episode (the oracle 1, a wrong answer
    0), a terminal episode and a generator publish, every verdict `ok`."""
    if why := why_not_root_and_user():
        pytest.skip(why)
    user = normal_user()
    assert user is not None
    deps = Path(sysconfig.get_paths()["purelib"])
    if why := closed_to_others(deps):
        pytest.skip(f"the dependencies (this venv's site-packages) are private to root: {why}")
    base = base_python(user)
    if base is None:
        pytest.skip(f"no python{sys.version_info[0]}.{sys.version_info[1]} with venv and pip "
                    f"that {user.pw_name} can run")  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix="palaestra-wheel-", dir=user.pw_dir))  # 0700
    try:
        shutil.copy(wheel, home / wheel.name)  # the build folder is private to root
        shutil.copy(HELDOUT_SECRET, home / "heldout.secret")
        (home / "data").mkdir()
        shared = Path(os.environ.get("PALAESTRA_CACHE") or default_cache())
        # This secret's generated tasks (`generated/`) and reasoning/gym's (`packs/`, its
        # source's own cache): a warm start, not minutes of warming on a loaded machine.
        for part in ("generated", "packs"):
            if (shared / part).is_dir():
                shutil.copytree(shared / part, home / "cache" / part)
        owned_by(user, home, *home.rglob("*"))
        python = install(home / wheel.name, home / "venv", prefix=as_user(user), base=base)
        env = {
            "PALAESTRA_CACHE": str(home / "cache"),
            "PALAESTRA_HELDOUT_SECRET_FILE": str(home / "heldout.secret"),
            # what libraries keep (matplotlib's font list) stays in the folder too
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_CONFIG_HOME": str(home / "config"),
        }
        prefix = as_user(user, env, cwd=home)
        where = subprocess.run(
            [*prefix, str(python), "-c", "import palaestra; print(palaestra.__file__)"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        assert Path(where.strip()).is_relative_to(home / "venv"), where
        started_at = time.monotonic()
        server = ServerProcess(home / "data", program=home / "venv" / "bin" / "palaestra",
                               prefix=prefix).start()  # fmt: skip
        ready_s = time.monotonic() - started_at
        try:
            assert server.proc is not None
            assert os.stat(f"/proc/{server.proc.pid}").st_uid == user.pw_uid
            assert server.token is not None  # its admin token, written as the user
            verdict = play_oracle(server, "openai/humaneval:HumanEval-1")
            assert verdict["status"] == "ok" and verdict["reward"] == 1.0, verdict
            verdict = play_wrong(server, "openai/humaneval:HumanEval-1")
            assert verdict["status"] == "ok" and verdict["reward"] == 0.0, verdict
            verdict = play_oracle(server, first_task(server, "terminal"))
            assert verdict["status"] == "ok" and verdict["passed"], verdict
            publish_generator(server, home / "wheelgen")
        finally:
            server.stop()
        assert "Traceback" not in server.logs()
        print(f"{user.pw_name}'s wheel serve ready in {ready_s:.1f} s")
    finally:
        shutil.rmtree(home)


def play_wrong(server: ServerProcess, task: str) -> dict[str, Any]:
    """One coding episode whose solution.py defines the entry point to return None."""
    with server.client(timeout=600) as client:
        reset = client.reset(task)
        entry = reset.observation.data["entry_point"]
        source = f"def {entry}(*args, **kwargs):\n    return None\n"
        client.step(
            reset.episode_id,
            {"tool": "write_file", "arguments": {"path": "solution.py", "content": source}},
        )
        client.step(reset.episode_id, {"tool": "submit"})
        verdict = client.verify(reset.episode_id)
        client.close(reset.episode_id)
    return verdict.model_dump()
