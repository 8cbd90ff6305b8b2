"""Cluster mode is authenticated (issue 34, invariant 7; server/cluster/rayauth.py).

Without Ray's token auth, any local process could join the cluster, ask a worker for its
channel key and act on every episode as an admin it made up (ATTACK, below). Here, on real
one-node clusters on 127.0.0.1: that attack fails on a local cluster palaestra starts, whose
token only the server's user can read; a cluster without authentication is refused with a
message naming what to set, unless the operator accepts it; a front without the cluster's
token, or with a wrong one, is refused at start; and a worker's episode channel answers
nothing to a wrong key (the way in that does not go through Ray).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from palaestra.sandbox.base import default_cache
from palaestra.server.cluster import rayauth
from palaestra.server.cluster.channel import ChannelClient, ChannelServer, WorkerUnreachable
from tests.conftest import BIN, ServerProcess, cli_env, make_settings
from tests.servers import scaled

pytest.importorskip("ray", reason="cluster mode needs ray (the bootstrap installs it)")

REPO = Path(__file__).resolve().parents[2]

# A one-node cluster in its own process (so its auth mode is its environment's alone).
CLUSTER = """\
import sys
from palaestra.server.cluster.connect import pin_loopback
pin_loopback()
from ray.cluster_utils import Cluster
head = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "temp_dir": sys.argv[1]}
cluster = Cluster(initialize_head=True, connect=False, head_node_args=head)
cluster.wait_for_nodes()
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


# A local process that joins the cluster, asks each worker for its channel key and closes the
# episode argv[2] as an admin it made up.
ATTACK = """\
import asyncio, sys
import ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
except Exception as exc:
    print("REFUSED", type(exc).__name__, flush=True)
    sys.exit(0)
print("JOINED", flush=True)
from palaestra.server.cluster.channel import ChannelClient
names = [a for a in ray.util.list_named_actors(all_namespaces=True)
         if a["name"].startswith("palaestra-worker-")]
infos = [ray.get(ray.get_actor(a["name"], namespace=a["namespace"]).info.remote())
         for a in names]
admin = {"name": "x", "scopes": ["admin"], "token_id": "x", "orgs": [], "quota": {}}
async def close_everywhere():
    for info in infos:
        channel = ChannelClient(info["host"], info["port"], bytes.fromhex(info["key"]))
        try:
            await channel.call("close", {"principal": admin, "id": sys.argv[2]})
            print("CLOSED", info["name"], flush=True)
        except Exception as exc:
            print("missed", type(exc).__name__, flush=True)
        await channel.aclose()
asyncio.run(close_everywhere())
"""


def tokenless_env(home: Path, **extra: str) -> dict[str, str]:
    """A process of this user that holds no Ray token (nor a ~/.ray/auth_token)."""
    env = {k: v for k, v in cli_env().items() if k not in rayauth.RAY_AUTH_VARS}
    loopback = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    return {**env, **loopback, "HOME": str(home), "RAY_AUTH_MODE": "disabled", **extra}


@contextmanager
def one_node_cluster(home: Path, token: Path | None) -> Iterator[str]:
    """A cluster's GCS address; with `token`, the cluster requires it."""
    temp = Path(tempfile.mkdtemp(prefix="pra-", dir="/tmp"))
    extra = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)} if token else {}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER, str(temp)],
        env=tokenless_env(home, **extra),
        cwd=home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        yield address
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def serve(args: list[str], env: dict[str, str], data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "palaestra"), "serve", "--data-dir", str(data), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(90),  # a front that starts anyway would run until killed here
    )


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.slow
def test_a_cluster_without_auth_is_refused_unless_the_operator_accepts_it(
    tmp_path: Path,
) -> None:
    with one_node_cluster(tmp_path, token=None) as address:
        assert rayauth.probe(address) == "open"  # what any local process gets from it
        run = serve(["--ray", address], tokenless_env(tmp_path), tmp_path / "data")
        assert run.returncode == 2, run.stderr[-3000:]
        message = " ".join(run.stderr.split())
        assert "(ray_unauthenticated)" in message
        assert f"the Ray cluster at {address} runs without token authentication" in message
        for setting in ("RAY_AUTH_MODE=token", "PALAESTRA_RAY_ALLOW_UNAUTHENTICATED=true"):
            assert setting in message, message
        assert "Traceback" not in run.stderr
        accepted = make_settings(
            data_dir=tmp_path / "data", ray=address, ray_allow_unauthenticated=True
        )
        assert rayauth.require_auth(accepted, address) is False  # accepted, and said so


@pytest.mark.slow
def test_a_front_without_the_clusters_token_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret" / "auth_token"
    rayauth.ensure_token(secret, own_folder=True)
    wrong = tmp_path / "wrong" / "auth_token"
    rayauth.ensure_token(wrong, own_folder=True)
    with one_node_cluster(tmp_path, token=secret) as address:
        assert rayauth.probe(address) == "closed"
        none = serve(["--ray", address], tokenless_env(tmp_path), tmp_path / "a")
        assert none.returncode == 2, none.stderr[-3000:]
        message = " ".join(none.stderr.split())
        assert "requires a token and palaestra has none" in message, message
        assert "PALAESTRA_RAY_TOKEN_FILE" in message
        env = tokenless_env(tmp_path, PALAESTRA_RAY_TOKEN_FILE=str(wrong))
        refused = serve(["--ray", address], env, tmp_path / "b")
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "refuses palaestra's token" in " ".join(refused.stderr.split())


@pytest.mark.slow
def test_a_local_process_without_the_token_cannot_join_a_local_cluster_or_act_on_episodes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    env = tokenless_env(Path.home(), PALAESTRA_IDLE_TTL_S="600")  # the usual cache folder
    server = ServerProcess(
        data,
        env,
        ["--ray", "local:1", "--packs", str(REPO / "packs" / "echo"), "--log-level", "info"],
    )
    # ServerProcess adds this process's environment: take its Ray token variables out again
    server.env = {k: v for k, v in server.env.items() if k not in rayauth.RAY_AUTH_VARS}
    server.env["RAY_AUTH_MODE"] = "disabled"  # what the server must override for its cluster
    try:
        server.start()
        started = [
            line for line in server.logs().splitlines() if "started a local Ray cluster" in line
        ]
        assert started, server.logs()[-3000:]
        address = started[0].split(" at ")[-1].split('"')[0].strip()
        body = {"pack": "palaestra/echo", "split": "train"}
        reply = httpx.post(server.url + "/v1/episodes", headers=server.headers, json=body)
        assert reply.status_code == 200, reply.text
        episode = reply.json()["episode_id"]
        assert reply.json()["info"]["worker"].startswith("palaestra-worker-")
        wrong = tmp_path / "wrong_token"
        wrong.write_text("0" * 64)
        attackers = {  # at once: each ray.init gives up only after ~20 s
            what: subprocess.Popen(
                [sys.executable, "-c", ATTACK, address, episode],
                env=tokenless_env(tmp_path, **extra),
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for what, extra in {
                "no token": {},
                "a wrong token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(wrong)},
            }.items()
        }
        outputs: dict[str, tuple[str, str]] = {}
        try:
            for what, attacker in attackers.items():
                outputs[what] = attacker.communicate(timeout=scaled(60))
        finally:
            for attacker in attackers.values():
                attacker.kill()
                attacker.wait()
        for what, (out, err) in outputs.items():
            assert "JOINED" not in out and "CLOSED" not in out, (what, out, err[-2000:])
            assert out.startswith("REFUSED"), (what, out, err[-2000:])
        state = httpx.get(f"{server.url}/v1/episodes/{episode}", headers=server.headers)
        assert state.json()["status"] == "active", state.text  # untouched
        token = data / "ray" / "auth_token"  # only the server's user reads the token, secrets
        assert mode(token) == 0o600 and mode(token.parent) == 0o700
        assert len(token.read_text().strip()) >= 32
        workers = default_cache() / "workers"
        assert mode(workers) == 0o700
        for secret in workers.glob("palaestra-worker-*/heldout.secret"):
            assert mode(secret) == 0o600 and mode(secret.parent) == 0o700
    finally:
        server.stop()


async def test_a_workers_channel_answers_nothing_to_a_wrong_key() -> None:
    """The way in that does not go through Ray: the channel port, without the worker's key."""
    calls: list[str] = []

    async def handler(method: str, args: dict[str, object]) -> bytes:
        calls.append(method)
        return b"null"

    key = os.urandom(32)
    server = ChannelServer(handler, key)
    port = await server.start("127.0.0.1")
    try:
        thief = ChannelClient("127.0.0.1", port, bytes(32), timeout_s=5)
        with pytest.raises(WorkerUnreachable):
            await asyncio.wait_for(thief.call("close", {"id": "any"}), 10)
        await thief.aclose()
        owner = ChannelClient("127.0.0.1", port, key, timeout_s=5)
        assert await owner.call("close", {"id": "any"}) == b"null"
        await owner.aclose()
        assert calls == ["close"]  # the wrong key's call never reached the handler
    finally:
        await server.close()
