"""Held-out generated tasks cannot be recomputed from public code and their ids.

Before: a sealed generated task's id was `<generator>-<seed>` (cad) or
`<domain>-<level>-<seed>` (finance) or `<dataset>.<level>.<item seed>` (reasoning), and its
seeds came from `random.Random("<pack>/<generator>/<split>")`: anyone with the public
generator code regenerated every held-out answer and hidden parameter. Now the seeds come
from the server's held-out secret (a 0600 file in its data dir) and the ids name no seed.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HELDOUT_SECRET

from palaestra.envs.cad.tasks import generate_task as cad_task
from palaestra.envs.finance.tasks import generate_task as finance_task
from palaestra.sdk.task import Task
from palaestra.server.app import create_app
from palaestra.server.config import REPO_PACKS, Settings
from palaestra.server.heldout import SECRET_FILE, ensure_secret
from palaestra.server.packs.loader import Pack, generator_seeds, load_pack
from palaestra.server.runtime import build_manager


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("heldout") / "packs"
    for name in ("cad", "finance"):
        shutil.copytree(REPO_PACKS / name, base / name)
    return base


@pytest.fixture(scope="module")
def server_packs(tmp_path_factory: pytest.TempPathFactory, packs: Path) -> dict[str, Pack]:
    return served(tmp_path_factory.mktemp("server") / "data", packs)


def served(data_dir: Path, packs: Path) -> dict[str, Pack]:
    """The packs a server on `data_dir` serves (its own secret, made at first start)."""
    settings = Settings(data_dir=data_dir, packs_dirs=[packs], heldout_secret_file=None)
    manager = build_manager(settings)
    return {p.name: p for p in manager.packs.all()}


def numbers_in(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def test_the_secret_is_made_once_private_and_never_served(tmp_path: Path, packs: Path) -> None:
    data = tmp_path / "data"
    served(data, packs)
    path = data / SECRET_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    secret = path.read_text().strip()
    assert len(bytes.fromhex(secret)) == 32
    served(data, packs)
    assert path.read_text().strip() == secret  # kept across restarts, never rewritten
    path.chmod(0o644)
    assert ensure_secret(path).hex() == secret and path.stat().st_mode & 0o777 == 0o600


async def test_no_route_serves_the_secret(tmp_path: Path, packs: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", packs_dirs=[packs], heldout_secret_file=None)
    manager = build_manager(settings)
    secret = (settings.data_dir / SECRET_FILE).read_text().strip()
    app = create_app(settings, manager=manager)
    app.state.manager = manager
    token = (settings.data_dir / "admin.token").read_text().strip()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://app",
        headers={"authorization": f"Bearer {token}"},
    ) as api:
        for path in ("/v1/packs", "/v1/packs/palaestra/cad", "/v1/tasks?limit=10000", "/readyz"):
            body = (await api.get(path)).text
            assert secret not in body and secret[:16] not in body, path


def test_held_out_cad_tasks_cannot_be_recomputed(server_packs: dict[str, Pack]) -> None:
    pack = server_packs["palaestra/cad"]
    assert pack.manifest is not None
    held = [t for t in pack.tasks.values() if t.split == "heldout"]
    assert len(held) == 12 * 30 and all(t.sealed for t in held)
    recomputed = []
    for task in held:
        gen = task.private["domain"]
        level = task.private["level"]
        assert task.id.startswith(f"{gen}-heldout-"), task.id
        # The attacker's guesses: every number in the id, and the public seed rule.
        spec = pack.manifest.generators[gen].splits["heldout"]
        guesses = numbers_in(task.id) + generator_seeds(pack.name, gen, "heldout", spec)[:5]
        if any(cad_task(gen, seed, level)["private"] == task.private for seed in guesses):
            recomputed.append(task.id)
    # A derivable seed would recompute every task; a domain's parameter grid is finite, so a
    # guess now and then lands on the same part by chance (seen: 1 of 360).
    assert len(recomputed) <= len(held) // 100, recomputed
    # Training tasks stay reproducible from their public seeds.
    train = next(t for t in pack.tasks.values() if t.split == "train")
    seed = int(train.id.rsplit("-", 1)[1])
    assert (
        cad_task(train.private["domain"], seed, train.private["level"])["private"] == train.private
    )


def test_held_out_finance_tasks_cannot_be_recomputed(server_packs: dict[str, Pack]) -> None:
    pack = server_packs["palaestra/finance"]
    assert pack.manifest is not None
    spec = pack.manifest.generators["reports"].splits["heldout"]
    public_seeds = set(generator_seeds(pack.name, "reports", "heldout", spec))
    held = [t for t in pack.tasks.values() if t.split == "heldout"]
    assert len(held) == 60
    for index, task in enumerate(sorted(held, key=lambda t: int(t.id.rsplit("-", 1)[1]))):
        seed = task.private["document"]["structure_seed"]
        assert task.id == f"reports-heldout-{index}" and str(seed) not in task.id
        assert seed not in public_seeds
        level = task.private["document"]["level"]
        for guess in numbers_in(task.id):
            assert finance_task(guess, index, level)["private"] != task.private


def test_held_out_sets_are_per_secret_and_stable() -> None:
    def split(pack: Pack, name: str) -> dict[str, str]:
        return {t.id: t.digest for t in pack.tasks.values() if t.split == name}

    one, two = os.urandom(32), os.urandom(32)
    first = load_pack(REPO_PACKS / "cad", secret=one)
    again = load_pack(REPO_PACKS / "cad", secret=one)
    other = load_pack(REPO_PACKS / "cad", secret=two)
    assert split(first, "heldout") == split(again, "heldout")  # a server keeps its set
    assert split(first, "heldout").keys() == split(other, "heldout").keys()  # same ids…
    common = set(split(first, "heldout").values()) & set(split(other, "heldout").values())
    assert len(common) <= len(split(first, "heldout")) // 10  # …other tasks (a few level-1
    # parts have small parameter spaces)
    assert split(first, "train") == split(other, "train")  # public splits: the same everywhere


def test_held_out_reasoning_tasks_cannot_be_recomputed() -> None:
    """The session's shared secret (tests/conftest.py) against the public seed rule."""
    root = REPO_PACKS / "reasoning-gym"
    secret = ensure_secret(HELDOUT_SECRET)
    mine = load_pack(root, secret=secret)
    public = load_pack(root)  # what anyone computes from the public code

    def held(pack: Pack) -> list[Task]:
        return [t for t in pack.tasks.values() if t.split == "heldout"]

    public_answers = {(t.domain, t.public["question"]): t.private["answer"] for t in held(public)}
    tasks = held(mine)
    assert len(tasks) > 300
    same = 0
    for task in tasks:
        item = task.private["item_seed"]
        assert str(item) not in task.id and re.fullmatch(r".+\.h\d+", task.id), task.id
        assert 2**30 <= item < 2**31
        same += (task.domain, task.public["question"]) in public_answers
    # A few datasets have tiny problem spaces (the same question from any seed): no more.
    assert same <= len(tasks) // 10, same
    by_id: dict[str, Any] = {t.id: t for t in held(public)}
    differ = sum(
        by_id[t.id].private["item_seed"] != t.private["item_seed"] for t in tasks if t.id in by_id
    )
    assert differ == sum(t.id in by_id for t in tasks)
