"""Attacks on the OpenEnv door's Task API (server/doors/openenv_tasks.py): what a token can
learn of a sealed split, ranges and indices past the edges, other environments and packs,
bad bodies, and the Task API's way of selecting a task (`reset(split=…, index=…)`).

The real app over a started manager, in process; the packs are echo (a sealed `heldout`
split) and one of 10 001 tasks, so the bound on an answer is reached for real."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from conftest import make_settings

from palaestra.server.app import create_app
from palaestra.server.auth import Quota, create_token
from palaestra.server.config import REPO_PACKS
from palaestra.server.doors.ors import MAX_TASKS
from palaestra.server.runtime import build_manager

ECHO = "/openenv/palaestra/echo"
MANY = "/openenv/acme/many"
BIG = MAX_TASKS + 1
SEALED_WORDS = ("'apple'", "'fjord'")  # echo's sealed heldout split: their instructions
SEALED_ANSWERS = ("elppa", "drojf")  # their private answers: never served to anyone
TRAIN = ["say-birch", "say-cobalt", "say-delta", "say-ember"]  # echo's train split begins
TRAIN += ["say-garnet", "say-harbor", "say-iris", "say-juniper"]


def many_pack(root: Path) -> Path:
    """A pack with BIG public tasks and one sealed one (echo tasks, compact form)."""
    pack = root / "many"
    pack.mkdir()
    (pack / "pack.toml").write_text(
        'name = "acme/many"\nversion = "1.0.0"\nfamilies = ["echo"]\n\n'
        "[splits.train]\nsealed = false\n\n[splits.heldout]\nsealed = true\n"
    )

    def task(i: int, split: str, word: str) -> str:
        public = {"instruction": f"Submit the word '{word}' in reverse order of its letters."}
        return json.dumps(
            {
                "id": f"t{i}",
                "family": "echo",
                "domain": "echo/say",
                "split": split,
                "public": public,
                "private": {"answer": word[::-1]},
            }
        )

    lines = [task(i, "train", f"w{i}") for i in range(BIG)]
    lines.append(task(BIG, "heldout", "hidden-word-zq"))
    (pack / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return pack


Tokens = dict[str, httpx.AsyncClient]


@pytest.fixture
async def clients(tmp_path: Path) -> AsyncIterator[Tokens]:
    """A client for a train token, an eval token and no token, over one app."""
    packs = tmp_path / "packs"
    shutil.copytree(REPO_PACKS / "echo", packs / "echo")
    many_pack(packs)
    built = build_manager(
        make_settings(data_dir=tmp_path / "data", packs_dirs=[packs / "echo", packs / "many"])
    )
    await built.start()
    app = create_app(built.settings, manager=built)
    app.state.manager = built

    def client(scope: str | None) -> httpx.AsyncClient:
        headers = {}
        if scope is not None:
            name = f"{scope}-{uuid.uuid4().hex[:6]}"
            token, _ = create_token(built.store.db, [scope], name=name, quota=Quota())
            headers["authorization"] = f"Bearer {token}"
        transport = httpx.ASGITransport(app=app)
        return httpx.AsyncClient(transport=transport, base_url="http://app", headers=headers)

    made = {"train": client("train"), "eval": client("eval"), "anonymous": client(None)}
    try:
        yield made
    finally:
        for each in made.values():
            await each.aclose()
        await built.shutdown()


async def sealed_answers(http: httpx.AsyncClient, env: str = "echo") -> list[httpx.Response]:
    """Every Task API route's answer about echo's sealed split."""
    base = f"{ECHO}/{env}"
    return [
        await http.post(f"{base}/tasks", json={"split": "heldout"}),
        await http.post(f"{base}/task", json={"split": "heldout", "index": 0}),
        await http.post(f"{base}/task_range", json={"split": "heldout"}),
        await http.post(f"{base}/task_range", json={"split": "heldout", "start": -1}),
    ]


async def test_a_train_token_sees_a_sealed_splits_references_only(clients: Tokens) -> None:
    splits = await clients["train"].get(f"{ECHO}/echo/splits")
    assert splits.status_code == 200, splits.text
    heldout = next(s for s in splits.json() if s["name"] == "heldout")
    assert heldout["sealed"] is True and heldout["type"] == "test" and heldout["num_tasks"] == 2
    for env in ("echo", "harbor_env"):  # HarborEnv's name for the same environment
        for reply in await sealed_answers(clients["train"], env):
            assert reply.status_code == 200, reply.text
            assert not any(w in reply.text for w in SEALED_WORDS + SEALED_ANSWERS), reply.text
            listed = reply.json().get("tasks") or [reply.json()["task"]]
            assert listed and all(t["sealed"] and "public" not in t for t in listed), reply.text
            assert {t["task_name"] for t in listed} <= {"say-apple", "say-fjord"}


async def test_an_eval_token_sees_public_fields_never_private_ones(clients: Tokens) -> None:
    for reply in await sealed_answers(clients["eval"]):
        assert reply.status_code == 200, reply.text
        assert any(w in reply.text for w in SEALED_WORDS)  # public fields: the contract's view
        assert not any(a in reply.text for a in SEALED_ANSWERS) and "private" not in reply.text
    many = await clients["eval"].post(f"{MANY}/many/task", json={"split": "heldout", "index": 0})
    assert "hidden-word-zq" in many.text and "qz-drow-neddih" not in many.text


async def test_no_token_and_a_bad_token_are_refused(clients: Tokens) -> None:
    for path, body in (
        (f"{ECHO}/list_environments", None),
        (f"{ECHO}/echo/splits", None),
        (f"{ECHO}/echo/num_tasks", {"split": "train"}),
        (f"{ECHO}/echo/task", {"split": "train", "index": 0}),
    ):
        http = clients["anonymous"]
        reply = await (http.get(path) if body is None else http.post(path, json=body))
        assert reply.status_code == 401, (path, reply.text)
        assert reply.headers["www-authenticate"].startswith("Bearer")
    bad = await clients["anonymous"].get(
        f"{ECHO}/echo/splits", headers={"authorization": "Bearer not-a-token"}
    )
    assert bad.status_code == 401 and "detail" in bad.json()


async def test_indices_past_the_edges(clients: Tokens) -> None:
    http = clients["train"]
    for index in (-1, -(10**30), 8, 10**30):  # echo's train split has 8 tasks
        reply = await http.post(f"{ECHO}/echo/task", json={"split": "train", "index": index})
        assert reply.status_code == 400, (index, reply.text)
        assert "Invalid task index" in reply.json()["detail"] and "0..7" in reply.json()["detail"]
    for index in ("zero", 1.5, None, [0]):
        reply = await http.post(f"{ECHO}/echo/task", json={"split": "train", "index": index})
        assert reply.status_code == 400 and "index" in reply.json()["detail"], reply.text


async def test_ranges_are_python_slices_clamped_to_the_split(clients: Tokens) -> None:
    http = clients["train"]

    async def names(**bounds: int | None) -> list[str]:
        reply = await http.post(f"{ECHO}/echo/task_range", json={"split": "train", **bounds})
        assert reply.status_code == 200, reply.text
        return [t["task_name"] for t in reply.json()["tasks"]]

    assert await names() == TRAIN
    assert await names(start=-1) == TRAIN[-1:]
    assert await names(start=-(10**30), stop=10**30) == TRAIN
    assert await names(start=10**30) == [] and await names(start=1, stop=0) == []
    assert await names(start=2, stop=-5) == TRAIN[2:-5]
    first = await http.post(f"{ECHO}/echo/task_range", json={"split": "train", "start": 1})
    assert first.json()["tasks"][0]["index"] == 1  # indices are the split's, not the page's


async def test_a_range_over_the_bound_is_refused_and_tasks_is_a_preview(clients: Tokens) -> None:
    http = clients["train"]
    count = await http.post(f"{MANY}/many/num_tasks", json={"split": "train"})
    assert count.json() == {"num_tasks": BIG}
    whole = await http.post(f"{MANY}/many/task_range", json={"split": "train"})
    assert whole.status_code == 400 and "pages" in whole.json()["detail"], whole.text
    last = await http.post(f"{MANY}/many/task_range", json={"split": "train", "start": 1})
    assert (
        len(last.json()["tasks"]) == MAX_TASKS and last.json()["tasks"][-1]["task_name"] == "t10000"
    )
    preview = await http.post(f"{MANY}/many/tasks", json={"split": "train"})
    assert len(preview.json()["tasks"]) == MAX_TASKS and preview.json()["env_name"] == "many"


async def test_other_environments_packs_and_splits(clients: Tokens) -> None:
    http = clients["eval"]
    other = await http.post(f"{ECHO}/many/tasks", json={"split": "train"})  # another pack's name
    assert other.status_code == 404 and "unknown environment" in other.json()["detail"]
    missing = await http.get("/openenv/acme/nothing/nothing/splits")
    assert missing.status_code == 404, missing.text
    split = await http.post(f"{ECHO}/echo/tasks", json={"split": "../many/train"})
    assert split.status_code == 400 and "has no split" in split.json()["detail"]
    listed = await http.post(f"{ECHO}/echo/tasks", json={"split": "train"})
    assert all(t["task_id"].startswith("palaestra/echo@") for t in listed.json()["tasks"])
    upper = await http.get(f"{ECHO}/ECHO/splits")  # OpenEnv's names match in any case
    assert upper.status_code == 200
    assert (await http.get(f"{ECHO}/list_environments")).json() == ["echo"]
    pinned = "/openenv/palaestra/echo@0.1.0"  # a pinned version: indices that stay put
    assert (await http.get(f"{pinned}/list_environments")).json() == ["echo"]
    task = await http.post(f"{pinned}/echo/task", json={"split": "train", "index": 0})
    assert task.json()["task"]["task_id"] == "palaestra/echo@0.1.0:say-birch", task.text
    missing_version = await http.get("/openenv/palaestra/echo@9.9.9/echo/splits")
    assert missing_version.status_code == 404, missing_version.text


async def test_bad_bodies(clients: Tokens) -> None:
    http = clients["train"]
    for body in (b"{not json", b"[1]", b'{"split": "train", "turbo": 1}', b"{}", b'"x"'):
        reply = await http.post(f"{ECHO}/echo/num_tasks", content=body)
        assert reply.status_code == 400, (body, reply.text)
        assert reply.json()["code"] == "bad_request"
    deep = await http.post(f"{ECHO}/echo/task", content=b'{"split": ' + b"[" * 100_000)
    assert 400 <= deep.status_code < 500, deep.text  # vetted before the route: never a 500


async def test_reset_by_index(clients: Tokens) -> None:
    train, evaluator = clients["train"], clients["eval"]
    picked = await train.post(f"{ECHO}/reset", json={"split": "train", "index": 1})
    assert picked.status_code == 200, picked.text
    episode = picked.json()["metadata"]["episode_id"]
    state = await train.get(f"{ECHO}/state", params={"episode_id": episode})
    assert state.json()["task"].endswith(":say-cobalt")
    pinned = await train.post(
        "/openenv/palaestra/echo@0.1.0/reset", json={"split": "train", "index": 2}
    )
    assert pinned.status_code == 200, pinned.text
    for task in ("palaestra/echo@9.9.9:say-birch", "acme/many@1.0.0:t1"):  # not this door's
        other = await train.post("/openenv/palaestra/echo@0.1.0/reset", json={"task": task})
        assert other.status_code == 400 and "not in pack" in other.json()["detail"], other.text
    sealed = await train.post(f"{ECHO}/reset", json={"split": "heldout", "index": 0})
    assert sealed.status_code == 403, sealed.text  # a train token never starts a sealed task
    opened = await evaluator.post(f"{ECHO}/reset", json={"split": "heldout", "index": 0})
    assert opened.status_code == 200, opened.text
    for body, words in (
        ({"index": 0}, "needs the split"),
        ({"split": "train", "index": 8}, "Invalid task index"),
        ({"split": "train", "index": -1}, "Invalid task index"),
        ({"split": "train", "index": "0"}, "must be an integer"),
        ({"split": "train", "index": True}, "must be an integer"),
        ({"split": "nope", "index": 0}, "has no split"),
        ({"split": "train", "index": 0, "task": "say-birch"}, "not both"),
    ):
        reply = await train.post(f"{ECHO}/reset", json=body)
        assert reply.status_code == 400 and words in reply.json()["detail"], (body, reply.text)


async def test_the_ors_door_counts_and_serves_a_split_past_its_listing_bound(
    clients: Tokens,
) -> None:
    """ORS's task routes on the same pack: num_tasks counted only the first MAX_TASKS and
    an index past them was refused; a listing past the bound is refused naming task_range,
    never cut short."""
    http = clients["train"]
    key = {"x-api-key": http.headers["authorization"].removeprefix("Bearer ")}
    count = await http.post("/acme/many/num_tasks", json={"split": "train"}, headers=key)
    assert count.json() == {"num_tasks": BIG}, count.text
    last = await http.post(
        "/acme/many/task", json={"split": "train", "index": BIG - 1}, headers=key
    )
    assert last.json()["task"]["id"].endswith(":t10000"), last.text
    tail = await http.post(
        "/acme/many/task_range", json={"split": "train", "start": -2}, headers=key
    )
    assert [t["id"].rsplit(":", 1)[-1] for t in tail.json()["tasks"]] == ["t9999", "t10000"]
    whole = await http.post("/acme/many/tasks", json={"split": "train"}, headers=key)
    assert whole.status_code == 400 and "task_range" in whole.text, whole.text
    past = await http.post("/acme/many/task", json={"split": "train", "index": BIG}, headers=key)
    assert past.status_code == 400 and "outside" in past.text, past.text
