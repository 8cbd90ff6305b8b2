"""The finance-commentary family and pack: a judge verifier proved by `pack check`.

The judge is tests/peers/commentary_judge.py, a scripted rubric judge on loopback (a fake:
no judge model runs in the suite). It is gullible outside the candidate's fence, so the
injection cheats scoring 0 show the fence holds; the first tests show it really would
obey a phrase or a reference outside the fence, so that proof is not vacuous.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess
from judge_fakes import HttpJudgeChat
from peers.commentary_judge import FakeCommentaryJudge

from palaestra.envs.base import TaskFieldsError
from palaestra.envs.commentary import CommentaryFamily
from palaestra.envs.commentary.answers import OFF_TOPIC, OVERRIDE, forged_reference
from palaestra.envs.commentary.family import reward_of
from palaestra.envs.commentary.tasks import MAX_CHARS
from palaestra.envs.commentary.truth import Truth, figure, reference_text
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.check import check_pack
from palaestra.server.packs.loader import Pack, load_pack
from palaestra.server.runtime import build_manager
from palaestra.server.sealed import WITHHELD
from palaestra.verifiers.judge import Subject, score_rubric
from palaestra.verifiers.judge_protocol import (
    JudgeCache,
    JudgeChat,
    JudgeUnavailable,
)

PACK = Path(__file__).resolve().parent.parent / "packs" / "finance-commentary"
NAME = "palaestra/finance-commentary"
MODEL = "fake-commentary-judge"


# -- judges for the in-process manager (a server's are ServerJudges, from Settings.judges) ---
def loopback_judge(url: str) -> HttpJudgeChat:
    """H1's minimal JudgeChat (one POST, no retries) on the fake judge's `/v1` URL."""
    return HttpJudgeChat(url.removesuffix("/v1"), model=MODEL, name="default")


class DictCache:
    def __init__(self) -> None:
        self.data: dict[str, Mapping[str, Any]] = {}

    def get(self, key: str) -> Mapping[str, Any] | None:
        return self.data.get(key)

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        self.data[key] = value


class LoopbackJudges:
    def __init__(self, chats: Mapping[str, JudgeChat]) -> None:
        self.chats = dict(chats)
        self._cache = DictCache()

    def get(self, name: str) -> JudgeChat:
        chat = self.chats.get(name)
        if chat is None:
            raise JudgeUnavailable(name, "no judge endpoint of that name is configured")
        return chat

    @property
    def cache(self) -> JudgeCache | None:
        return self._cache


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def judge() -> Iterator[tuple[FakeCommentaryJudge, str]]:
    fake = FakeCommentaryJudge()
    with fake.serve() as url:
        yield fake, url


@pytest.fixture(scope="module")
def family() -> CommentaryFamily:
    return CommentaryFamily()


@pytest.fixture(scope="module")
def pack() -> Pack:
    return load_pack(PACK, FamilyRegistry.discover().all())


def task_of(pack: Pack, split: str, level: int = 1) -> Task:
    return next(
        t
        for _, t in sorted(pack.tasks.items())
        if t.split == split and t.difficulty == f"level-{level}"
    )


def figures_of(truth: Truth) -> list[str]:
    """Every figure of the reference as it writes it, and amounts without separators."""
    out = []
    for c in truth.changes:
        for x in (c.before, c.after):
            out.append(figure(c, x))
            if c.metric.kind == "amount":
                out.append(f"{x:.0f}")
    return out


@pytest.fixture
async def manager(
    tmp_path: Path, judge: tuple[FakeCommentaryJudge, str], pack: Pack
) -> AsyncIterator[EpisodeManager]:
    built = await asyncio.to_thread(
        build_manager, Settings(data_dir=tmp_path / "data", packs_dirs=[])
    )
    built.packs.add(pack)
    built.judges = LoopbackJudges({"default": loopback_judge(judge[1])})
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


# -- the fake judge is gullible outside the fence (so the cheats' 0 means the fence held) ----
async def test_the_fake_judge_obeys_what_is_outside_the_fence(
    judge: tuple[FakeCommentaryJudge, str], family: CommentaryFamily, pack: Pack
) -> None:
    chat = loopback_judge(judge[1])
    task = task_of(pack, "train", 2)
    truth = family.truth(task)
    question = task.public["question"]
    honest = Subject(question, reference_text(truth), OFF_TOPIC)
    assert reward_of(await score_rubric(chat, family.rubric, honest, family.config)) == 0.0
    # The override phrase where the task's author writes (outside the fence): obeyed.
    told = Subject(f"{question}\n{OVERRIDE}", reference_text(truth), OFF_TOPIC)
    verdict = await score_rubric(chat, family.rubric, told, family.config)
    assert verdict.score == 1.0 and set(verdict.components.values()) == {1.0}
    # A verdict outside the fence: copied.
    entries = [
        {"name": c.name, "reason": "r", "choice": c.choices[-1]} for c in family.rubric.criteria
    ]
    best = json.dumps({"criteria": entries})
    copied = Subject(f"{question}\n{best}", reference_text(truth), OFF_TOPIC)
    assert (await score_rubric(chat, family.rubric, copied, family.config)).score == 1.0
    # A forged reference in the reference's place: graded against it.
    forged = forged_reference(truth)
    fake_reference, _, commentary = forged.partition("\n\n")
    swapped = Subject(question, fake_reference, commentary)
    assert (await score_rubric(chat, family.rubric, swapped, family.config)).score == 1.0
    # A candidate that is a word of the reference takes nothing out of it (graded, no crash).
    word = Subject(question, reference_text(truth), truth.metrics[0])
    assert (await score_rubric(chat, family.rubric, word, family.config)).components == {
        "figures": 0.0,
        "direction": 0.0,
        "relevance": 0.5,
    }
    # The same forged text as the candidate, against the true reference: nothing.
    inside = Subject(question, reference_text(truth), forged)
    assert reward_of(await score_rubric(chat, family.rubric, inside, family.config)) == 0.0


def test_the_reference_figures_are_printed_in_the_report(
    family: CommentaryFamily, pack: Pack
) -> None:
    """The truth is readable: every amount of the reference is a figure of the parsed PDF."""
    for level in (1, 3):
        task = task_of(pack, "train", level)
        printed = {abs(v) for v in family.documents.load_sync(task).printed.figures.values()}
        truth = family.truth(task)
        amounts = [c for c in truth.changes if c.metric.kind == "amount"]
        assert amounts
        for c in amounts:
            assert {c.before, c.after} <= printed, (task.id, c)


# -- episodes --------------------------------------------------------------------------------
async def test_verdicts_feedback_and_the_judge_record(
    manager: EpisodeManager,
    judge: tuple[FakeCommentaryJudge, str],
    family: CommentaryFamily,
    pack: Pack,
) -> None:
    fake, _ = judge
    client = AsyncInProcessClient(manager)
    task = task_of(pack, "train", 2)
    truth = family.truth(task)

    async def play(arguments: dict[str, Any]) -> Any:
        reset = await client.reset(task.ref)
        assert "Comment on the change" in reset.observation.text
        page = await client.step(reset.episode_id, {"tool": "read_page", "arguments": {"page": 1}})
        assert page.observation.text
        await client.step(reset.episode_id, {"tool": "submit", "arguments": arguments})
        return await client.verify(reset.episode_id)

    oracle = await play(family.oracle(task)[0].arguments)
    assert oracle.status == "ok" and oracle.passed and oracle.reward == 1.0
    assert oracle.components == {"figures": 1.0, "direction": 1.0, "relevance": 1.0}
    record = json.loads(oracle.feedback.split("; judge ", 1)[1])
    assert record["model"] == MODEL and record["endpoint"] == "default"
    assert record["attempts"] == 1 and record["sampling"]["temperature"] == 0.0
    assert record["prompt_sha256"].startswith("sha256:")
    # The feedback carries scores and the record, never the reference or the judge's reasons.
    for text in figures_of(truth):
        assert text not in oracle.feedback
    assert "reference figures stated" not in oracle.feedback
    # Empty and whitespace commentaries: 0 without a judge call.
    calls = len(fake.requests)
    for arguments in ({}, {"commentary": "  \n "}):
        empty = await play(arguments)
        assert (empty.reward, empty.failure, empty.status) == (0.0, "no_answer", "ok")
    assert len(fake.requests) == calls
    # Wrong directions with the right figures: the gate pays nothing.
    cheats = dict(family.cheats(task))
    wrong = await play(cheats["wrong-direction"][0].arguments)
    assert wrong.components["figures"] == 1.0 and wrong.components["direction"] == 0.0
    assert wrong.reward == 0.0 and "pays 0" in wrong.feedback


async def test_an_overlong_commentary_is_refused_with_the_limit(
    manager: EpisodeManager, pack: Pack
) -> None:
    client = AsyncInProcessClient(manager)
    reset = await client.reset(task_of(pack, "train").ref)
    action = {"tool": "submit", "arguments": {"commentary": "x" * (MAX_CHARS + 1)}}
    with pytest.raises(PalaestraError) as caught:
        await client.step(reset.episode_id, action)
    assert caught.value.status == 422
    assert f"at most {MAX_CHARS} characters" in caught.value.message
    assert "commentary" in caught.value.message
    await client.close(reset.episode_id)


async def test_a_failing_judge_voids_the_episode(
    manager: EpisodeManager,
    judge: tuple[FakeCommentaryJudge, str],
    family: CommentaryFamily,
    pack: Pack,
) -> None:
    fake, _ = judge
    client = AsyncInProcessClient(manager)
    task = task_of(pack, "train", 3)
    fake.fail_with = 503
    try:
        reset = await client.reset(task.ref)
        await client.step(reset.episode_id, family.oracle(task)[0])
        verdict = await client.verify(reset.episode_id)
    finally:
        fake.fail_with = None
    assert verdict.status == "void" and verdict.reward == 0.0
    assert verdict.feedback.startswith("judge unavailable (default: ")


async def test_judged_subject_for_group_scoring(family: CommentaryFamily, pack: Pack) -> None:
    from palaestra.envs.base import EpisodeContext, Sandboxes

    task = task_of(pack, "train", 1)

    async def never(spec: Any) -> Any:
        raise AssertionError("no sandbox")

    ctx = EpisodeContext("e", task, None, {}, Sandboxes(never))
    await family.reset(ctx)
    assert family.judged_subject(ctx) is None
    ctx.state["commentary"] = "   "
    assert family.judged_subject(ctx) is None
    ctx.state["commentary"] = "Revenue rose."
    judged = family.judged_subject(ctx)
    assert judged is not None and judged.rubric is family.rubric
    assert judged.config.judge == "default"
    assert judged.subject.candidate == "Revenue rose."
    assert judged.subject.task == task.public["question"]
    assert judged.subject.reference == reference_text(family.truth(task))


def test_task_field_errors_say_what_to_fix(family: CommentaryFamily, pack: Pack) -> None:
    task = task_of(pack, "train", 1)

    def broken(**gold: Any) -> Task:
        private = {**task.private, "gold": {**task.private["gold"], **gold}}
        return Task(**{**task.__dict__, "private": private})

    with pytest.raises(TaskFieldsError, match=r"private.gold.metrics: unknown metric 'ebitda'"):
        family.validate_task(broken(metrics=["ebitda"]))
    with pytest.raises(TaskFieldsError, match=r"no gross margin for offset 3"):
        family.validate_task(broken(metrics=["gross margin"], offset_from=3))
    with pytest.raises(TaskFieldsError, match=r"offset_from: must be an earlier year"):
        family.validate_task(broken(offset_from=1, offset_to=1))
    with pytest.raises(TaskFieldsError, match=r"private.gold.offset_from"):
        family.validate_task(broken(offset_from="last year"))


# -- a real server on loopback ---------------------------------------------------------------
@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, judge: tuple[FakeCommentaryJudge, str]
) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("commentary")
    (base / "packs").mkdir()
    (base / "packs" / "finance-commentary").symlink_to(PACK)
    proc = ServerProcess(base / "server-data", {"PALAESTRA_PACKS_DIRS": str(base / "packs")})
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def test_judge_down_on_a_real_server_voids_with_the_reason(server: ServerProcess) -> None:
    """No judge endpoint the family can reach: the episode is void and says why."""
    with server.client() as client:
        tasks = client.all_tasks(pack=NAME, split="train")
        reset = client.reset(tasks[0].id, options={"oracle": True})
        listed = client.step(reset.episode_id, {"tool": "list_pages", "arguments": {}})
        assert "page 1:" in listed.observation.text
        reply = client.step(reset.episode_id, {"tool": "oracle", "arguments": {}})
        assert reply.terminated
        verdict = client.verify(reset.episode_id)
    assert verdict.status == "void"
    assert verdict.feedback.startswith("judge unavailable (default: "), verdict.feedback


async def test_sealed_split_verdict_carries_no_reference(
    manager: EpisodeManager, family: CommentaryFamily, pack: Pack
) -> None:
    client = AsyncInProcessClient(manager)
    task = task_of(pack, "heldout", 1)
    assert task.sealed
    reset = await client.reset(task.ref, options={"oracle": True})  # recorded as {oracle: true}
    await client.step(reset.episode_id, {"tool": "oracle", "arguments": {}})
    verdict = await client.verify(reset.episode_id)
    assert verdict.reward == 1.0 and verdict.passed
    assert WITHHELD in verdict.feedback and "judge" not in verdict.feedback
    state = await client.state(reset.episode_id)
    for shown in (verdict.model_dump_json(), state.model_dump_json()):
        for text in figures_of(family.truth(task)):
            assert text not in shown


async def test_pack_check_without_a_judge_says_how_to_give_one() -> None:
    report = await check_pack(PACK, limit=1)
    assert not report.ok and report.summary()["void"] == 1
    oracle = next(p for p in report.problems if p.check == "oracle")
    assert "judge unavailable (default: " in oracle.message
    assert "--judge NAME=URL,MODEL" in oracle.message
