"""A publish token's generator pack runs its generators only in a sandbox: a generator that
reads the server's files, opens sockets, loops, floods its output, grows without bound or
forks without end is contained, and the publish fails (4xx, the contract's error shape)
naming the generator, the split and the cause; nothing is installed and the server serves
on. A sealed split's failure quotes nothing the generator raised."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import make_settings

from palaestra.server.config import Settings
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.archive import pack_archive
from tests.hosts import local_host

from .publishers import client, error, publish

REPO_ROOT = Path(__file__).resolve().parents[2]
TASK = 'return {"public": {"instruction": "x"}, "private": {"answer": "x"}}'


def generator_pack(root: Path, name: str, body: str, *, sealed: bool = False) -> bytes:
    """A pack `test/<name>` whose one generator `g` runs `body` as `generate`'s body."""
    root.mkdir(parents=True)
    split = "heldout" if sealed else "train"
    (root / "pack.toml").write_text(
        f'name = "test/{name}"\nversion = "1.0.0"\nfamilies = ["echo"]\n\n'
        f"[splits.{split}]\nsealed = {json.dumps(sealed)}\n\n"
        '[generators.g]\nmodule = "gen.py"\nfamily = "echo"\ndomain = "hostile/g"\n'
        f"[generators.g.splits.{split}]\nseeds = [0, 100]\ncount = 2\n"
    )
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    (root / "gen.py").write_text(
        f"import os, socket, sys, time\n\n\ndef generate(seed, index, level):\n{indented}\n"
    )
    return pack_archive(root)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """conftest's `manager` on tight generation limits, so each attack ends in seconds."""
    return make_settings(
        data_dir=tmp_path / "data",
        generate_timeout_s=3.0,
        generate_memory_mb=256,
        generate_max_output_mb=1,
        generate_pids=32,
    )


def host_paths(data: Path) -> list[str]:
    """What a generator must never see: host secrets, the server's data dir, other packs."""
    return [
        "/etc/shadow",
        "/root/.bashrc",
        str(data / "heldout.secret"),
        str(data / "admin.token"),
        str(data / "packs"),
        str(REPO_ROOT / "packs" / "echo" / "pack.toml"),
        str(REPO_ROOT / "server" / "config.py"),
        str(REPO_ROOT / "pyproject.toml"),
    ]


def reader(data: Path) -> str:
    return f"""
found = []
for path in {host_paths(data)!r}:
    try:
        found.append(os.listdir(path) if os.path.isdir(path) else open(path).read(64))
    except OSError:
        pass
found += [k for k in os.environ if k.startswith("PALAESTRA") or k == "GENTEST_CANARY"]
if found:
    return {{"public": {{"instruction": repr(found)}}, "private": {{"answer": "x"}}}}
raise LookupError("nothing of the host was readable")
"""


SOCKETS = """
for family, address in ((socket.AF_INET, ("127.0.0.1", 22)), (socket.AF_INET, ("1.1.1.1", 53)),
                        (socket.AF_INET6, ("::1", 22)), (socket.AF_UNIX, "/run/docker.sock")):
    try:
        socket.socket(family, socket.SOCK_STREAM).connect(address)
    except OSError:
        continue
    return {"public": {"instruction": f"reached {address}"}, "private": {"answer": "x"}}
raise ConnectionError("no way out")
"""

FORKS = (
    """
for _ in range(2000):
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
"""
    + TASK
)

CASES = {
    "loops": ("while True:\n    pass", "timed out after 3 s (generate_timeout_s)"),
    "floods": ("sys.stderr.write('x' * (3 << 20))\n" + TASK, "printed more than 1 MB"),
    "giant": (
        'return {"public": {"instruction": "x" * (3 << 20)}, "private": {"answer": "x"}}',
        "printed more than 1 MB",
    ),
    "hog": ("blob = bytearray(2 << 30)\n" + TASK, "ran out of memory (256 MB"),
    "forks": (FORKS, "raised BlockingIOError"),
    "sockets": (SOCKETS, "raised ConnectionError: no way out"),
}


async def test_hostile_generators_are_contained(manager: EpisodeManager, tmp_path: Path) -> None:
    os.environ["GENTEST_CANARY"] = "the server's environment"
    cases = {**CASES, "reads": (reader(manager.settings.data_dir), "raised LookupError")}
    try:
        async with client(manager, ["publish"], orgs=("test",)) as http:
            for name, (body, cause) in cases.items():
                reply = await publish(http, generator_pack(tmp_path / name, name, body))
                status, code, message = error(reply)
                assert (status, code) == (400, "generator_failed"), (name, reply.text)
                assert "generators.g, split train" in message and cause in message, message
                assert (await http.get(f"/v1/packs/test/{name}")).status_code == 404
            assert (await http.get("/healthz")).status_code == 200
    finally:
        del os.environ["GENTEST_CANARY"]
    store = manager.settings.data_dir / "packs"
    assert not list((store / "sha256").iterdir()) and not (store / "generated").exists()
    assert local_host(manager).sandboxes.live_count == 0


async def test_a_sealed_split_failure_quotes_nothing(
    manager: EpisodeManager, tmp_path: Path
) -> None:
    body = 'raise ValueError(f"SEALED-{seed}")'
    async with client(manager, ["publish"], orgs=("test",)) as http:
        reply = await publish(http, generator_pack(tmp_path / "s", "sealed", body, sealed=True))
    status, code, message = error(reply)
    assert (status, code) == (400, "generator_failed")
    assert "split heldout" in message and "raised ValueError" in message
    assert "SEALED" not in message
