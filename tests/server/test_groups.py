"""Group rewards over a real server on loopback: tournament and ranking rewards that order
better answers higher, stored once and answered again without a judge call, readable in the
episode's state; every refusal in the contract's error shape; the store on both engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from conftest import make_settings
from group_peers import (
    BIRCH,
    COBALT,
    LETTERS,
    VOID_ANSWER,
    JudgedEcho,
    Judges,
    client_of,
    ended,
    judge_server,
    judging,
    serve,
)
from judge_fakes import FakeJudge, HttpJudgeChat, Status

from palaestra.sdk.errors import ConflictError, InvalidActionError, NotFoundError, UnavailableError
from palaestra.sdk.http import AsyncHTTPClient, HTTPClient
from palaestra.server.config import REPO_PACKS
from palaestra.server.db import Database, IntegrityError
from palaestra.server.groups import group_digest
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.server.store import Store
from tests.hosts import local_host

on_module_loop = pytest.mark.asyncio(loop_scope="module")
# Better answers to "birch" reversed score higher (the scripted judge's quality).
QUALITY = {"hcrib": 3.0, "hcrix": 2.0, "zzzzz": 1.0}
MAX_GROUP = 4


@dataclass
class Stack:
    manager: EpisodeManager
    url: str
    judges: Judges
    fake: FakeJudge
    judge: HttpJudgeChat
    train: AsyncHTTPClient
    other: AsyncHTTPClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    data = tmp_path_factory.mktemp("groups") / "data"
    settings = make_settings(
        data_dir=data,
        packs_dirs=[REPO_PACKS / "echo", REPO_PACKS / "letters"],
        max_group_size=MAX_GROUP,
    )
    manager = build_manager(settings)
    manager.families.add(JudgedEcho())
    with judge_server(QUALITY) as (fake, judge):
        judges = Judges(judge)
        manager.judges = judges
        async with serve(manager) as url:
            train = client_of(manager, url, ["train"])
            other = client_of(manager, url, ["train"])
            try:
                yield Stack(manager, url, judges, fake, judge, train, other)
            finally:
                await train.aclose()
                await other.aclose()


async def group_of(stack: Stack, *answers: str, task: str = BIRCH) -> list[str]:
    return [await ended(stack.train, task, answer) for answer in answers]


@on_module_loop
@pytest.mark.parametrize("scorer", ["tournament", "ranking"])
async def test_group_rewards_order_better_answers_and_are_stored_once(
    stack: Stack, scorer: str
) -> None:
    ids = await group_of(stack, "zzzzz", "hcrib", "hcrix")
    calls = stack.judge.calls
    reply = await stack.train.verify_group(ids, scorer)  # type: ignore[arg-type]
    assert stack.judge.calls > calls and not reply.stored
    worst, best, middle = (reply.rewards[i] for i in ids)
    assert all(0.0 <= r <= 1.0 for r in reply.rewards.values())
    assert best > middle > worst
    assert reply.scorer == scorer and reply.judge["records"]
    assert reply.group_digest.startswith("sha256:")
    # Again, reordered: the stored result, no judge call.
    calls = stack.judge.calls
    again = await stack.train.verify_group(ids[::-1], scorer)  # type: ignore[arg-type]
    assert stack.judge.calls == calls and again.stored
    assert again.rewards == reply.rewards and again.group_digest == reply.group_digest
    # Each episode's state carries its group reward beside its own verdict.
    for eid in ids:
        state = await stack.train.state(eid)
        assert state.group_reward is not None and state.verdict is not None
        assert state.group_reward.reward == reply.rewards[eid]
        assert state.group_reward.group_digest == reply.group_digest
        assert state.group_reward.scorer == scorer


@on_module_loop
async def test_closing_an_ended_episode_does_not_stop_its_group(stack: Stack) -> None:
    ids = await group_of(stack, "hcrib", "zzzzz")
    for eid in ids:
        await stack.train.close(eid)  # the collector closes in the background
    reply = await stack.train.verify_group(ids, "tournament")
    assert reply.rewards[ids[0]] > reply.rewards[ids[1]]


@on_module_loop
async def test_refusals(stack: Stack) -> None:
    mine = await group_of(stack, "hcrib", "zzzzz")
    theirs = await ended(stack.other, BIRCH, "hcrib")
    calls = stack.judge.calls
    # Another token's episode answers as an unknown id does (the same 404).
    with pytest.raises(NotFoundError) as foreign:
        await stack.train.verify_group([*mine, theirs], "tournament")
    with pytest.raises(NotFoundError) as unknown:
        await stack.train.verify_group([*mine, "f" * 32], "tournament")
    assert foreign.value.message.replace(theirs, "X") == unknown.value.message.replace(
        "f" * 32, "X"
    )
    # A live episode, a void one, one closed unverified: 409 naming it.
    live = (await stack.train.reset(BIRCH)).episode_id
    with pytest.raises(ConflictError, match=live) as active:
        await stack.train.verify_group([*mine, live], "tournament")
    assert active.value.code == "episode_active"
    void = (await stack.train.reset(BIRCH)).episode_id
    step = await stack.train.step(void, {"tool": "submit", "arguments": {"answer": VOID_ANSWER}})
    assert step.info["status"] == "void"
    with pytest.raises(ConflictError, match=void) as voided:
        await stack.train.verify_group([*mine, void], "ranking")
    assert voided.value.code == "episode_void"
    await stack.train.close(live)
    with pytest.raises(ConflictError, match=live) as closed:
        await stack.train.verify_group([*mine, live], "ranking")
    assert closed.value.code == "episode_unverified"
    # Mixed tasks, duplicates, too many, a family that cannot be judged: 422.
    cobalt = await ended(stack.train, COBALT, "tlaboc")
    with pytest.raises(InvalidActionError, match="one task") as mixed:
        await stack.train.verify_group([*mine, cobalt], "tournament")
    assert mixed.value.code == "mixed_tasks"
    with pytest.raises(InvalidActionError) as twice:
        await stack.train.verify_group([mine[0], mine[0]], "tournament")
    assert twice.value.code == "duplicate_episodes"
    many = await group_of(stack, *["hcrib"] * (MAX_GROUP - 1))
    with pytest.raises(InvalidActionError, match=f"at most {MAX_GROUP}") as large:
        await stack.train.verify_group([*mine, *many], "tournament")
    assert large.value.code == "group_too_large"
    letters = []
    for _ in range(2):
        started = await stack.train.reset(LETTERS)
        await stack.train.step(started.episode_id, {"tool": "submit", "arguments": {"answer": "b"}})
        letters.append(started.episode_id)
    with pytest.raises(InvalidActionError, match="'letters'") as family:
        await stack.train.verify_group(letters, "tournament")
    assert family.value.code == "not_judgeable"
    assert stack.judge.calls == calls  # none of these reached the judge
    # A body the route's model refuses: one id, an unknown scorer.
    async with httpx.AsyncClient(base_url=stack.url) as raw:
        headers = {
            "authorization": "Bearer "
            + stack.manager.settings.data_dir.joinpath("admin.token").read_text().strip()
        }
        for body in (
            {"episode_ids": [mine[0]], "scorer": "tournament"},
            {"episode_ids": mine, "scorer": "vibes"},
        ):
            bad = await raw.post("/v1/groups/verify", json=body, headers=headers)
            assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


@on_module_loop
async def test_judge_down_is_503_and_stores_nothing(stack: Stack) -> None:
    ids = await group_of(stack, "hcrib", "hcrix")
    stack.fake.script(default=Status(502))
    try:
        with pytest.raises(UnavailableError, match="HTTP 502") as error:
            await stack.train.verify_group(ids, "ranking")
        assert error.value.code == "judge_unavailable" and error.value.retryable
        assert stack.fake.requests  # it was asked
        assert (await stack.train.state(ids[0])).group_reward is None
    finally:
        stack.fake.script(default=judging(QUALITY))
    reply = await stack.train.verify_group(ids, "ranking")  # judged now, not a stored failure
    assert not reply.stored and reply.rewards[ids[0]] > reply.rewards[ids[1]]


@on_module_loop
async def test_an_episode_gets_one_group_reward(stack: Stack) -> None:
    a, b, c = await group_of(stack, "hcrib", "hcrix", "zzzzz")
    await stack.train.verify_group([a, b], "tournament")
    with pytest.raises(ConflictError, match=b) as taken:
        await stack.train.verify_group([b, c], "tournament")  # b again, in a new group
    assert taken.value.code == "group_taken"
    with pytest.raises(ConflictError) as other_scorer:
        await stack.train.verify_group([a, b], "ranking")
    assert other_scorer.value.code == "group_taken"


@on_module_loop
async def test_an_episode_the_server_no_longer_holds(stack: Stack) -> None:
    judged = await group_of(stack, "hcrib", "zzzzz")
    first = await stack.train.verify_group(judged, "tournament")
    fresh = await group_of(stack, "hcrib", "zzzzz")
    local_host(stack.manager)._ended.clear()  # as after ENDED_CACHE more episodes, or a restart
    with pytest.raises(ConflictError, match="no longer holds") as gone:
        await stack.train.verify_group(fresh, "tournament")
    assert gone.value.code == "episode_not_held"
    # A judged group is answered from the store, and the state reads it from there too.
    again = await stack.train.verify_group(judged, "tournament")
    assert again.stored and again.rewards == first.rewards
    state = await stack.train.state(judged[0])
    assert state.group_reward is not None
    assert state.group_reward.reward == first.rewards[judged[0]]


@on_module_loop
async def test_in_process_and_blocking_clients(stack: Stack) -> None:
    client = AsyncInProcessClient(stack.manager)
    ids = [await ended(client, BIRCH, answer) for answer in ("zzzzz", "hcrib")]
    reply = await client.verify_group(ids, "ranking")
    assert reply.rewards[ids[1]] > reply.rewards[ids[0]]
    token = stack.manager.settings.data_dir.joinpath("admin.token").read_text().strip()
    with HTTPClient(stack.url, token=token) as blocking:  # in a thread: the server is here
        again = await asyncio.to_thread(blocking.verify_group, ids[::-1], "ranking")
    assert again.stored and again.rewards == reply.rewards


@on_module_loop
async def test_cluster_mode_is_refused(stack: Stack) -> None:
    ids = await group_of(stack, "hcrib", "zzzzz")
    settings = stack.manager.settings
    stack.manager.settings = settings.model_copy(update={"ray": "auto"})
    try:
        with pytest.raises(InvalidActionError, match="cluster mode") as refused:
            await stack.train.verify_group(ids, "ranking")
    finally:
        stack.manager.settings = settings
    assert refused.value.code == "unsupported_in_cluster"


def test_group_store_round_trip(store_url: str, tmp_path: Path) -> None:
    """put_group / group_result / groups_of and the state's join, on SQLite and PostgreSQL."""
    from server.test_store_engines import state

    store = Store(Database.open(store_url))
    try:
        for key in ("g1", "g2", "g3"):
            store.create_episode(state(key, "done"), "sha256:d", False, owner="tok")
        store.flush()
        digest = group_digest("ranking", ["g2", "g1"])
        assert digest == group_digest("ranking", ["g1", "g2"])
        asyncio.run(
            store.put_group(
                digest, "t", "ranking", "ranking", "tok", '{"x": 1}', {"g1": 0.25, "g2": 1}
            )
        )
        assert store.reads.group_result(digest) == '{"x": 1}'
        assert store.reads.groups_of(("g1", "g2", "g3")) == {"g1": digest, "g2": digest}
        loaded = store.reads.load_episode("g1")
        assert loaded is not None and loaded.group_reward is not None
        assert loaded.group_reward.reward == 0.25 and loaded.group_reward.method == "ranking"
        other = group_digest("ranking", ["g2", "g3"])
        with pytest.raises(IntegrityError):  # g2 is in a group already: nothing of it stored
            asyncio.run(
                store.put_group(other, "t", "ranking", "ranking", "tok", "{}", {"g3": 0.5, "g2": 0})
            )
        assert store.reads.group_result(other) is None and store.reads.groups_of(("g3",)) == {}
    finally:
        store.close()
