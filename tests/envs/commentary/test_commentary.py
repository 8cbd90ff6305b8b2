"""The finance-commentary family and pack: a judge verifier proved by `pack check`.

The judge is tests/peers/commentary_judge.py, a scripted rubric judge on loopback (a fake:
no judge model runs in the suite). It is gullible outside the candidate's fence, so the
injection cheats scoring 0 show the fence holds; the first tests show it really would
obey a phrase or a reference outside the fence, so that proof is not vacuous.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess
from judge_fakes import HttpJudgeChat
from peers.commentary_judge import FakeCommentaryJudge
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.base import TaskFieldsError
from palaestra.envs.commentary import CommentaryFamily
from palaestra.envs.commentary.answers import OFF_TOPIC, OVERRIDE, forged_reference
from palaestra.envs.commentary.family import reward_of
from palaestra.envs.commentary.tasks import MAX_CHARS
from palaestra.envs.commentary.truth import Truth, figure, reference_text
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import Verdict
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packcheck import check_pack
from palaestra.server.packs.loader import Pack, inspect_pack, load_pack
from palaestra.server.runtime import build_manager
from palaestra.server.sealed import WITHHELD, sealed_feedback
from palaestra.verifiers.judge import Subject, score_rubric
from tests.servers import server_fixture

PACK = Path(__file__).resolve().parents[3] / "packs" / "finance-commentary"
NAME = "palaestra/finance-commentary"
MODEL = "fake-commentary-judge"


def endpoint(url: str) -> dict[str, Any]:
    """The `judges.default` setting for the fake judge at `url`: no retries, short limits."""
    return {"url": url, "model": MODEL, "max_retries": 0, "deadline_s": 10, "timeout_s": 5}


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
    settings = Settings(
        data_dir=tmp_path / "data", packs_dirs=[], judges={"default": endpoint(judge[1])}
    )
    built = await asyncio.to_thread(build_manager, settings)  # ServerJudges from the settings
    built.packs.add(pack)
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


# -- the fake judge is gullible outside the fence (so the cheats' 0 means the fence held) ----
async def test_the_fake_judge_obeys_what_is_outside_the_fence(
    judge: tuple[FakeCommentaryJudge, str], family: CommentaryFamily, pack: Pack
) -> None:
    chat = HttpJudgeChat(judge[1].removesuffix("/v1"), model=MODEL, name="default")
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


async def test_judged_subject_for_group_scoring(family: CommentaryFamily, pack: Pack) -> None:
    from palaestra.envs.base import EpisodeContext, Sandboxes

    task = task_of(pack, "train", 1)

    async def never(spec: Any) -> Any:
        raise AssertionError("no sandbox")

    ctx = EpisodeContext("e", task, None, {}, Sandboxes(never))
    await family.reset(ctx)
    assert family.judged_subject(ctx) is None
    ctx.state.commentary = "   "
    assert family.judged_subject(ctx) is None
    ctx.state.commentary = "Revenue rose."
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
        return dataclasses.replace(task, private=private)

    with pytest.raises(TaskFieldsError, match=r"private.gold.metrics: unknown metric 'ebitda'"):
        family.validate_task(broken(metrics=["ebitda"]))
    with pytest.raises(TaskFieldsError, match=r"no gross margin for offset 3"):
        family.validate_task(broken(metrics=["gross margin"], offset_from=3))
    with pytest.raises(TaskFieldsError, match=r"offset_from: must be an earlier year"):
        family.validate_task(broken(offset_from=1, offset_to=1))
    with pytest.raises(TaskFieldsError, match=r"private.gold.offset_from"):
        family.validate_task(broken(offset_from="last year"))


def test_a_pack_with_a_bad_task_is_refused_naming_it(tmp_path: Path, pack: Pack) -> None:
    """The loader runs the family's checks: the problem names the task and the field."""
    task = task_of(pack, "train", 1)
    bad = {"id": "bad-1", "family": task.family, "domain": task.domain, "split": "train"}
    bad |= {"public": task.public, "private": {**task.private, "gold": {"metrics": ["x"]}}}
    root = tmp_path / "pack"
    root.mkdir()
    (root / "pack.toml").write_text(
        'name = "acme/commentary"\nversion = "0.1.0"\n'
        'families = ["finance-commentary"]\n[splits.train]\n'
    )
    (root / "tasks.jsonl").write_text(json.dumps(bad) + "\n")
    loaded, problems = inspect_pack(root, FamilyRegistry.discover().all())
    assert loaded is not None and not loaded.tasks and len(problems) == 1
    assert "bad-1" in problems[0] and "finance-commentary" in problems[0]
    assert "private.gold.offset_from: Field required" in problems[0]


# -- a real server on loopback ---------------------------------------------------------------
def judged_by_the_fake(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The fake judge (the `judge` fixture) as the server's `default` endpoint."""
    url: str = request.getfixturevalue("judge")[1]
    return {"judges": {"default": endpoint(url)}}


# `palaestra serve` with this pack and the fake judge as its `default` endpoint.
server = server_fixture("module", packs={"finance-commentary": PACK}, settings=judged_by_the_fake)


def play_oracle(client: HTTPClient, task_id: str) -> Verdict:
    """Reset, read, submit the oracle's commentary (recorded as {oracle: true}), verify."""
    reset = client.reset(task_id, options={"oracle": True})
    assert "Comment on the change" in reset.observation.text
    listed = client.step(reset.episode_id, {"tool": "list_pages", "arguments": {}})
    assert "page 1:" in listed.observation.text
    page = client.step(reset.episode_id, {"tool": "read_page", "arguments": {"page": 2}})
    assert page.observation.text
    assert client.step(reset.episode_id, {"tool": "oracle", "arguments": {}}).terminated
    return client.verify(reset.episode_id)


def test_episodes_on_a_real_server(
    server: ServerProcess, judge: tuple[FakeCommentaryJudge, str]
) -> None:
    """Judge up: the oracle's reward; judge down: void with the reason; sealed: no words."""
    fake, _ = judge
    with server.client() as client:
        public = client.all_tasks(pack=NAME, split="train")
        sealed = client.all_tasks(pack=NAME, split="heldout")
        up = play_oracle(client, public[0].id)
        assert up.status == "ok" and up.passed and up.reward == 1.0
        record = json.loads(up.feedback.split("; judge ", 1)[1])
        assert record["model"] == MODEL and record["endpoint"] == "default"
        held = play_oracle(client, sealed[0].id)
        fake.fail_with = 503
        try:
            down = play_oracle(client, public[1].id)
        finally:
            fake.fail_with = None
    assert down.status == "void" and down.reward == 0.0
    assert down.feedback.startswith("judge unavailable (default: "), down.feedback
    # A sealed verdict: the reward and the criteria's scores, no word of the verifier's.
    assert held.status == "ok" and held.reward == 1.0 and held.passed
    assert held.feedback == sealed_feedback(held)
    assert held.components == {"figures": 1.0, "direction": 1.0, "relevance": 1.0}


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


def test_pack_check_passes_with_the_fake_judge(judge: tuple[FakeCommentaryJudge, str]) -> None:
    """`palaestra pack check --judge default=URL,MODEL`: oracle ≥ 0.9, null 0, cheats ≤ 0.1."""
    fake, url = judge
    before = len(fake.requests)
    result = CliRunner().invoke(
        app,
        ["pack", "check", str(PACK), "--judge", f"default={url},{MODEL}", "--json", "-"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["checked"] == report["tasks"] == 9
    assert {r["split"] for r in report["results"]} == {"train", "heldout"}
    cheats = {name for name, _ in CommentaryFamily().cheats(task_of(load_pack(PACK), "train"))}
    assert len(cheats) == 11 and len({c for c in cheats if c.startswith("injection-")}) == 5
    for row in report["results"]:
        assert row["oracle"] >= 0.9 and row["rerun"] == row["oracle"], row
        assert row["null"] == 0.0 and not row["void"], row
        assert set(row["cheats"]) == cheats, row
        assert all(r is not None and r <= 0.1 for r in row["cheats"].values()), row
        assert row["cheats"]["off-topic"] == 0.0
    # One judge call per oracle and per cheat with text; the rerun is the cache's, and an
    # empty or whitespace commentary asks no judge.
    assert len(fake.requests) - before == 9 * (1 + len(cheats) - 1)


def test_pack_check_refuses_a_malformed_judge_option() -> None:
    for value, says in (
        ("default", "write NAME=URL,MODEL"),
        ("default=ftp://x/v1,m", "no endpoint URL"),
    ):
        result = CliRunner().invoke(app, ["pack", "check", str(PACK), "--judge", value])
        assert result.exit_code == 2 and says in result.output, result.output


def test_group_rewards_rank_the_commentaries(
    server: ServerProcess, family: CommentaryFamily, pack: Pack
) -> None:
    """POST /v1/groups/verify over the family's judged subjects: right > partial > off-topic."""
    task = task_of(pack, "train", 2)  # public seeds: the server's task is this one
    right = family.oracle(task)[0].arguments["commentary"]
    partial = right.split(". ", 1)[0] + "."  # the first metric only
    with server.client() as client:
        for scorer in ("ranking", "tournament"):
            ids = []
            for text in (right, partial, OFF_TOPIC):
                reset = client.reset(task.ref)
                action = {"tool": "submit", "arguments": {"commentary": text}}
                assert client.step(reset.episode_id, action).terminated
                ids.append(reset.episode_id)
            group = client.verify_group(ids, scorer)
            rewards = [group.rewards[i] for i in ids]
            assert rewards == [1.0, 0.5, 0.0], (scorer, rewards)
            assert group.judge and not group.stored
