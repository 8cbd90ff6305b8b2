"""Held-out draws (server/draws.py) on a real server over loopback: a rotation serves a new
set with no task or seed in common with the old one, draw 0 is the set servers always
served, retired draws are refused for evaluation, and no draw of a sealed split, current
or retired, ever reaches a train token.

The attacks: a train token asking for a retired task by ref (the ids are public), for the
current one, for the sealed split by name, by pack filter and by unfiltered sampling; an
eval token asking for a retired task; a non-admin rotating; rotating a pack with no
generated sealed split.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HELDOUT_SECRET, cli_env

from palaestra.server.heldout import ensure_secret
from palaestra.server.packs.loader import generator_seeds, load_pack
from palaestra.server.packs.manifest import read_manifest
from tests.servers import ServerProcess, server_fixture, wait_until

FIXTURE = Path(__file__).parent.parent / "fixtures" / "heldout-codes"
PACK = "tests/heldout-codes"
CLI = str(Path(sys.executable).parent / "palaestra")

server = server_fixture(
    packs={"heldout-codes": FIXTURE, "echo": FIXTURE.parents[2] / "packs" / "echo"}
)
scheduled = server_fixture(
    "function",
    packs={"heldout-codes": FIXTURE},
    settings={"heldout_rotate_every_days": 2.0 / 86400},  # every 2 s
)


def token(server: ServerProcess, scopes: list[str]) -> dict[str, str]:
    made = httpx.post(f"{server.url}/v1/tokens", json={"scopes": scopes}, headers=server.headers)
    assert made.status_code == 201, made.text
    return {"authorization": f"Bearer {made.json()['token']}"}


def heldout(server: ServerProcess, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The sealed split's listed tasks: id -> public fields."""
    reply = httpx.get(
        f"{server.url}/v1/tasks",
        params={"pack": PACK, "split": "heldout", "limit": 1000},
        headers=headers or server.headers,
    )
    assert reply.status_code == 200, reply.text
    return {t["id"]: t["public"] for t in reply.json()["tasks"]}


def split_draw(server: ServerProcess) -> int:
    info = httpx.get(f"{server.url}/v1/packs/{PACK}", headers=server.headers).json()
    return int(next(s["draw"] for s in info["splits"] if s["name"] == "heldout"))


def reset(server: ServerProcess, headers: dict[str, str], **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/episodes", json=body, headers=headers, timeout=60)


def rotate(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """`palaestra pack heldout rotate` as an operator runs it."""
    return subprocess.run(
        [CLI, "pack", "heldout", "rotate", PACK, "--url", server.url, *args],
        env=cli_env(PALAESTRA_TOKEN=server.token or ""),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_draw_zero_is_the_set_served_before_draws(server: ServerProcess) -> None:
    """No change for existing users: draw 0 is the set the secret always drew."""
    assert split_draw(server) == 0
    mine = load_pack(FIXTURE, ["echo"], secret=ensure_secret(HELDOUT_SECRET))
    before = {t.ref: t.public for t in mine.tasks.values() if t.split == "heldout"}
    assert heldout(server) == before
    assert set(before) == {f"{PACK}@1.0.0:codes-heldout-{i}" for i in range(12)}
    spec = read_manifest(FIXTURE).generators["codes"].splits["heldout"]
    secret = ensure_secret(HELDOUT_SECRET)
    assert generator_seeds(PACK, "codes", "heldout", spec, secret) == generator_seeds(
        PACK, "codes", "heldout", spec, secret, draw=0
    )
    started = reset(server, server.headers, task=next(iter(before)))
    assert started.status_code == 200, started.text
    assert started.json()["info"]["heldout_draw"] == 0


def test_rotation_serves_a_disjoint_set(server: ServerProcess) -> None:
    before = heldout(server)
    done = rotate(server)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "draw 1 served, draw 0 retired" in done.stdout
    after = heldout(server)
    assert len(after) == len(before) == 12
    assert not set(after) & set(before)  # no id in common
    assert all("-d1-" in ref for ref in after)
    assert not {p["instruction"] for p in after.values()} & {
        p["instruction"] for p in before.values()
    }
    assert split_draw(server) == 1
    shown = httpx.get(f"{server.url}/v1/packs/{PACK}/heldout", headers=server.headers).json()
    assert shown["splits"][0]["draw"] == 1 and shown["splits"][0]["tasks"] == 12
    # The seeds: none of draw 1 was one of draw 0 (nor of draw 2 one of either).
    spec = read_manifest(FIXTURE).generators["codes"].splits["heldout"]
    secret = ensure_secret(HELDOUT_SECRET)
    seeds = [set(generator_seeds(PACK, "codes", "heldout", spec, secret, d)) for d in range(3)]
    assert all(len(s) == 12 for s in seeds)
    assert not seeds[0] & seeds[1] and not seeds[2] & (seeds[0] | seeds[1])
    # The training split is untouched.
    train = httpx.get(
        f"{server.url}/v1/tasks", params={"pack": PACK, "split": "train"}, headers=server.headers
    ).json()
    assert {t["id"].rsplit(":", 1)[1] for t in train["tasks"]} == {
        t.id for t in load_pack(FIXTURE, ["echo"]).tasks.values() if t.split == "train"
    }


def test_retired_draw_is_refused_for_evaluation(server: ServerProcess) -> None:
    assert split_draw(server) >= 1
    evaluator = token(server, ["eval"])
    old = reset(server, evaluator, task=f"{PACK}@1.0.0:codes-heldout-3")
    assert old.status_code == 404, old.text
    assert old.json()["error"]["code"] == "draw_retired"
    assert reset(server, server.headers, task=f"{PACK}:codes-heldout-3").status_code == 404
    current = next(iter(heldout(server)))
    started = reset(server, evaluator, task=current)
    assert started.status_code == 200, started.text
    assert started.json()["info"]["heldout_draw"] == split_draw(server)
    # Sampling the sealed split by name draws the current draw only.
    for seed in range(20):
        drawn = reset(server, evaluator, pack=PACK, split="heldout", seed=seed)
        assert drawn.status_code == 200, drawn.text
        assert drawn.json()["info"]["task"] in heldout(server)


def test_no_draw_ever_reaches_a_train_token(server: ServerProcess) -> None:
    trainer = token(server, ["train"])
    current = next(iter(heldout(server)))
    retired = [f"{PACK}@1.0.0:codes-heldout-{i}" for i in range(12)]
    for ref in [*retired, current, current.replace("@1.0.0", "")]:
        reply = reset(server, trainer, task=ref)
        assert reply.status_code in (403, 404), (ref, reply.text)
        assert "episode_id" not in reply.text
    assert reset(server, trainer, pack=PACK, split="heldout").status_code == 403
    for seed in range(40):  # unfiltered and by pack: public splits only
        for body in ({}, {"pack": PACK}):
            reply = reset(server, trainer, seed=seed, **body)
            assert reply.status_code == 200, reply.text
            info = reply.json()["info"]
            assert info["split"] != "heldout" and "heldout_draw" not in info, info
            httpx.delete(f"{server.url}/v1/episodes/{reply.json()['episode_id']}", headers=trainer)
    # A rotation while the train token samples changes none of it.
    assert rotate(server).returncode == 0
    for seed in range(20):
        reply = reset(server, trainer, seed=seed, pack=PACK)
        assert reply.status_code == 200 and reply.json()["info"]["split"] == "train"
        httpx.delete(f"{server.url}/v1/episodes/{reply.json()['episode_id']}", headers=trainer)


def test_rotation_is_for_admins_and_generated_splits(server: ServerProcess) -> None:
    for scopes in (["eval"], ["train"], ["publish"]):
        reply = httpx.post(
            f"{server.url}/v1/packs/{PACK}/heldout/rotate", headers=token(server, scopes)
        )
        assert reply.status_code == 403, reply.text
    echo = httpx.post(
        f"{server.url}/v1/packs/palaestra/echo/heldout/rotate", headers=server.headers
    )
    assert echo.status_code == 400 and echo.json()["error"]["code"] == "not_rotatable"
    bad = httpx.post(
        f"{server.url}/v1/packs/{PACK}/heldout/rotate",
        json={"split": "train"},
        headers=server.headers,
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "not_rotatable"
    missing = httpx.post(f"{server.url}/v1/packs/no/such/heldout/rotate", headers=server.headers)
    assert missing.status_code == 404
    shown = subprocess.run(
        [CLI, "pack", "heldout", "show", PACK, "--url", server.url],
        env=cli_env(PALAESTRA_TOKEN=server.token or ""), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"heldout\s+│\s+{split_draw(server)}\s+│", shown.stdout), shown.stdout


def test_draws_survive_a_restart(server: ServerProcess) -> None:
    draw, listed = split_draw(server), heldout(server)
    assert draw >= 1
    server.stop()
    server.start()
    assert split_draw(server) == draw and heldout(server) == listed
    # With the server stopped, the CLI records the next draw in its store: served at start.
    server.stop()
    local = subprocess.run(
        [CLI, "pack", "heldout", "rotate", PACK, "--split", "heldout",
         "--data-dir", str(server.data_dir)],
        env=cli_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert f"draw {draw + 1} recorded" in " ".join(local.stdout.split())
    server.start()
    assert split_draw(server) == draw + 1 and not set(heldout(server)) & set(listed)
    old = reset(server, server.headers, task=f"{PACK}:codes-heldout-0")
    assert old.status_code == 404 and old.json()["error"]["code"] == "draw_retired"


def test_the_schedule_rotates(scheduled: ServerProcess) -> None:
    first = heldout(scheduled)
    wait_until(lambda: split_draw(scheduled) >= 1, base_s=30, what="no scheduled rotation")
    assert not set(heldout(scheduled)) & set(first)
    shown = httpx.get(f"{scheduled.url}/v1/packs/{PACK}/heldout", headers=scheduled.headers)
    assert shown.json()["splits"][0]["drawn_by"] == "schedule"


@pytest.mark.parametrize("draws", [{}, {(PACK, "heldout"): 0}])
def test_draw_zero_loads_as_before(draws: dict[tuple[str, str], int]) -> None:
    secret = ensure_secret(HELDOUT_SECRET)
    plain = load_pack(FIXTURE, ["echo"], secret=secret)
    drawn = load_pack(FIXTURE, ["echo"], secret=secret, draws=draws)
    assert {t.id: t.digest for t in plain.tasks.values()} == {
        t.id: t.digest for t in drawn.tasks.values()
    }
