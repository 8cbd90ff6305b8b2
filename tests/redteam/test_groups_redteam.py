"""Attacks on POST /v1/groups/verify: another tenant's ids mixed into a group, an eval
token, a sealed task's reasons and reference, a huge body, a group judged again reordered
or concurrently, an episode re-judged in a new group to shop for a better reward."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import make_settings
from group_peers import BIRCH, SEALED, DownJudge, JudgedEcho, Judges, judge_server
from judge_fakes import HttpJudgeChat

from palaestra.server.config import REPO_PACKS
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from tests.redteam.tenants import Tenant, tenant

QUALITY = {"hcrib": 3.0, "hcrix": 2.0, "zzzzz": 1.0, "elppa": 3.0, "elppx": 1.0}
PATH = "/v1/groups/verify"


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    settings = make_settings(data_dir=tmp_path / "data", packs_dirs=[REPO_PACKS / "echo"])
    built = build_manager(settings)
    built.families.add(JudgedEcho())
    with judge_server(QUALITY) as (_, chat):
        built.judges = Judges(chat)
        await built.start()
        try:
            yield built
        finally:
            await built.shutdown()


def judge_of(manager: EpisodeManager) -> HttpJudgeChat:
    assert isinstance(manager.judges, Judges) and isinstance(manager.judges.chat, HttpJudgeChat)
    return manager.judges.chat


async def submitted(who: Tenant, answer: str, task: str = BIRCH) -> str:
    eid = await who.start(task=task)
    body = {"action": {"tool": "submit", "arguments": {"answer": answer}}}
    reply = await who.http.post(f"/v1/episodes/{eid}/step", json=body)
    assert reply.status_code == 200 and reply.json()["terminated"], reply.text
    return eid


async def group(who: Tenant, ids: list[str], scorer: str = "tournament") -> httpx.Response:
    return await who.http.post(PATH, json={"episode_ids": ids, "scorer": scorer})


async def test_another_tenants_ids_mixed_in_are_404_like_unknown(manager: EpisodeManager) -> None:
    alice, bob = tenant(manager, ["train"]), tenant(manager, ["train"])
    mine = [await submitted(alice, "hcrib"), await submitted(alice, "zzzzz")]
    theirs = await submitted(bob, "hcrix")
    foreign = await group(alice, [*mine, theirs])
    unknown = await group(alice, [*mine, "0" * 32])
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json()["error"]["message"].replace(theirs, "X") == unknown.json()["error"][
        "message"
    ].replace("0" * 32, "X")
    # In any position: ownership is checked for every id before anything else is said.
    first = await group(alice, [theirs, *mine])
    assert first.status_code == 404 and judge_of(manager).calls == 0
    # Bob's episode was not touched: he judges it in a group of his own.
    own = await group(bob, [theirs, await submitted(bob, "zzzzz")])
    assert own.status_code == 200, own.text


async def test_eval_tokens_and_sealed_tasks(manager: EpisodeManager) -> None:
    trainer, evaluator = tenant(manager, ["train"]), tenant(manager, ["eval"])
    publisher = tenant(manager, ["publish"])
    trained = [await submitted(trainer, "hcrib"), await submitted(trainer, "zzzzz")]
    assert (await group(evaluator, trained)).status_code == 404  # not its episodes
    assert (await group(publisher, trained)).status_code == 403  # no episode scope at all
    sealed = [await submitted(evaluator, a, SEALED) for a in ("elppa", "elppx")]
    assert (await group(trainer, sealed)).status_code == 404
    # The judge down on a sealed task: the reason (which could quote it) is withheld.
    judges = manager.judges
    assert isinstance(judges, Judges)
    working, judges.chat = judges.chat, DownJudge("upstream echoed the reference elppa")
    down = await group(evaluator, sealed)
    assert down.status_code == 503 and "elppa" not in down.text, down.text
    judges.chat = working
    reply = await group(evaluator, sealed, "ranking")
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    assert body["judge"] == {} and set(body["rewards"]) == set(sealed)
    assert body["rewards"][sealed[0]] > body["rewards"][sealed[1]]
    assert "elppa" not in reply.text and "reason" not in reply.text
    again = await group(evaluator, sealed[::-1], "ranking")  # the stored result: sealed too
    assert again.json()["judge"] == {} and again.json()["rewards"] == body["rewards"]
    state = await evaluator.http.get(f"/v1/episodes/{sealed[1]}")
    assert state.json()["group_reward"]["reward"] == body["rewards"][sealed[1]]
    assert "elppa" not in state.text  # nor the reference, through the state


async def test_huge_and_malformed_bodies(manager: EpisodeManager) -> None:
    who = tenant(manager, ["train"])
    limit = manager.settings.max_body_bytes
    huge = await who.http.post(
        PATH, content=b'{"episode_ids": ["' + b"a" * limit + b'"], "scorer": "ranking"}'
    )
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "too_large"
    many = await group(who, [f"e{i}" for i in range(20_000)])
    assert many.status_code == 422 and "1024" in many.json()["error"]["message"]
    over = await group(who, [f"e{i}" for i in range(manager.settings.max_group_size + 1)])
    assert over.status_code == 422, over.text
    assert str(manager.settings.max_group_size) in over.json()["error"]["message"]
    deep = await who.http.post(PATH, content=b'{"episode_ids": ' + b"[" * 500 + b"]" * 500 + b"}")
    assert deep.status_code == 422


async def test_reordered_repeated_and_concurrent_calls_judge_once(
    manager: EpisodeManager,
) -> None:
    who = tenant(manager, ["train"])
    control = [await submitted(who, a) for a in ("hcrib", "hcrix", "zzzzz")]
    assert (await group(who, control)).status_code == 200
    one_judging = judge_of(manager).calls  # what judging a group of three costs
    ids = [await submitted(who, a) for a in ("hcrib", "hcrix", "zzzzz")]
    orders = [ids, ids[::-1], [ids[1], ids[2], ids[0]]]
    replies = await asyncio.gather(*(group(who, order) for order in orders))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    calls = judge_of(manager).calls
    assert calls == 2 * one_judging  # three calls at once, one judging
    rewards = [r.json()["rewards"] for r in replies]
    assert rewards[0] == rewards[1] == rewards[2]
    assert [r.json()["stored"] for r in replies].count(False) == 1
    later = await group(who, orders[2])
    assert later.json()["stored"] and judge_of(manager).calls == calls
    # Shopping for a better reward: the worst answer again, with weaker company.
    weaker = await submitted(who, "zzzzz")
    shop = await group(who, [ids[2], weaker])
    assert shop.status_code == 409 and shop.json()["error"]["code"] == "group_taken"
    assert ids[2] in shop.json()["error"]["message"]
