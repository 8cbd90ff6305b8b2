"""The collector's pre-filter and group rewards, with a scripted policy on an embedded server:
drops are kept as 0s and closed unverified, a seeded share is audited and the agreement with
the full verifier is what the trajectories say; group rewards replace the verifiers' own
(kept beside them), and a judge that is down drops the group, counted."""

from __future__ import annotations

import itertools
import json
import math
import re
import string
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from conftest import make_settings
from group_peers import (
    BIRCH,
    JUDGE,
    RUBRIC,
    DownJudge,
    JudgedEcho,
    Judges,
    judge_server,
)
from judge_fakes import FakeJudge, HttpJudgeChat

from palaestra.sdk.models import EpisodeStatus
from palaestra.sdk.train.collector import CollectorConfig, RolloutCollector
from palaestra.sdk.train.formats import JSONToolFormat
from palaestra.sdk.train.prefilter import CallablePreFilter, PreFilterGate
from palaestra.sdk.train.tokenizers import CharTokenizer
from palaestra.sdk.train.types import Generation, SamplingParams, Trajectory
from palaestra.server.config import REPO_PACKS
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.verifiers.judge import JudgeConfig
from palaestra.verifiers.judge_prefilter import JudgePreFilter

on_module_loop = pytest.mark.asyncio(loop_scope="module")
TOK = CharTokenizer(string.printable)
FMT = JSONToolFormat(TOK)
QUALITY = {"hcrib": 3.0, "hcrix": 2.0, "zzzzz": 1.0}


class ScriptedPolicy:
    """A policy that submits the next of `answers` each episode (a named fake backend: the
    token ids it returns are the ones it 'sampled', so the collector's checks hold)."""

    token_exact = True
    weight_version = 0

    def __init__(self, answers: Sequence[str]) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        answer = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        text = json.dumps({"tool": "submit", "arguments": {"answer": answer}}) + "\n"
        ids = TOK.encode(text)
        return Generation(ids, [-0.1] * len(ids), "stop", 0)


def reversal_model(task: str, text: str) -> float:
    """A toy reward model: 1 for the word reversed, 0.6 for its letters in another order
    (the full verifier says 0: the pre-filter keeps what it should drop), else 0."""
    found = re.search(r"'(\w+)'", task)
    assert found, task
    target = found[1][::-1]
    if text == target:
        return 1.0
    return 0.6 if sorted(text) == sorted(target) else 0.0


def answer_of(trajectory: Trajectory) -> str:
    text = TOK.decode(trajectory.completion_ids)
    return str(json.loads(text.splitlines()[0])["arguments"]["answer"])


@dataclass
class Stack:
    manager: EpisodeManager
    client: AsyncInProcessClient
    judges: Judges
    fake: FakeJudge
    judge: HttpJudgeChat


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    data = tmp_path_factory.mktemp("prefilter") / "data"
    manager = build_manager(make_settings(data_dir=data, packs_dirs=[REPO_PACKS / "echo"]))
    manager.families.add(JudgedEcho())
    with judge_server(QUALITY) as (fake, judge):
        judges = Judges(judge)
        manager.judges = judges
        await manager.start()
        try:
            yield Stack(manager, AsyncInProcessClient(manager), judges, fake, judge)
        finally:
            await manager.shutdown()


def collector(stack: Stack, answers: Sequence[str], **config: Any) -> RolloutCollector:
    cfg = CollectorConfig(group_size=4, max_turns=2, sampling=SamplingParams(max_tokens=64))
    for key, value in config.items():
        setattr(cfg, key, value)
    return RolloutCollector(stack.client, ScriptedPolicy(answers), FMT, [BIRCH], cfg, seed=7)


@on_module_loop
async def test_prefilter_drops_audits_and_keeps_every_trajectory(stack: Stack) -> None:
    rm = CallablePreFilter(reversal_model)
    run = collector(
        stack,
        ["hcrib", "bcrih", "zzzzz", ""],
        prefilter=rm,
        drop_below=0.3,
        audit_rate=0.5,
        pass_reward=0.5,
    )
    groups = await run.collect(6)
    await run.drain()
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(groups) == 6 and len(trajectories) == 24  # every trajectory kept
    audited = compared = agreed = 0
    for traj in trajectories:
        answer = answer_of(traj)
        assert traj.prefiltered == (answer in ("zzzzz", "")), answer
        assert traj.prefilter_score == reversal_model("'birch'", answer)
        state = await stack.manager.state(traj.episode_id)
        if traj.prefiltered:
            assert traj.reward == 0.0
            if traj.verifier_reward is None:  # closed without verifying
                assert state.status is EpisodeStatus.CLOSED and state.verdict is None
            else:  # audited: verified anyway, trained as the drop it was
                assert state.verdict is not None and state.verdict.reward == traj.verifier_reward
                audited += 1
                compared += 1
                agreed += traj.verifier_reward < 0.5
        else:
            assert state.verdict is not None and traj.reward == state.verdict.reward
            compared += 1
            agreed += traj.reward >= 0.5
    report = run.prefilter_report
    assert report is not None
    dropped = sum(t.prefiltered for t in trajectories)
    assert report.scored == 24 and report.dropped == dropped == 12
    assert report.dropped_share == pytest.approx(0.5)
    assert 0 < report.audited == audited < dropped
    assert report.skipped == dropped - audited
    assert report.compared == compared and report.agreement == pytest.approx(agreed / compared)
    assert report.agreement is not None and report.agreement < 1.0  # "bcrih" was kept wrongly
    summary = report.as_dict()
    assert summary["prefilter_dropped_share"] == report.dropped_share
    assert summary["prefilter_agreement"] == report.agreement


def test_audits_are_seeded() -> None:
    keys = [("t", 1, g, s) for g in range(20) for s in range(4)]
    rm = CallablePreFilter(lambda task, text: 0.0)
    first = PreFilterGate(rm, drop_below=0.5, audit_rate=0.3, seed=1)
    again = PreFilterGate(rm, drop_below=0.5, audit_rate=0.3, seed=1)
    other = PreFilterGate(rm, drop_below=0.5, audit_rate=0.3, seed=2)
    picks = [first._audited(k) for k in keys]
    assert picks == [again._audited(k) for k in keys]
    assert picks != [other._audited(k) for k in keys]
    assert 0.15 < sum(picks) / len(picks) < 0.45


@on_module_loop
async def test_group_rewards_replace_the_verifiers_and_a_down_judge_drops(stack: Stack) -> None:
    run = collector(stack, ["hcrib", "hcrix", "zzzzz"], group_size=3, group_scorer="tournament")
    groups = await run.collect(3)
    assert len(groups) == 3 and run.stats["groups_judged"] == 3, run.stats
    for group in groups:
        by_quality = sorted(group.trajectories, key=lambda t: QUALITY[answer_of(t)])
        for worse, better in itertools.pairwise(by_quality):
            if QUALITY[answer_of(worse)] < QUALITY[answer_of(better)]:
                assert worse.reward < better.reward
        for traj in group.trajectories:
            state = await stack.manager.state(traj.episode_id)
            assert state.group_reward is not None and state.verdict is not None
            assert traj.reward == state.group_reward.reward
            assert traj.verifier_reward == state.verdict.reward
    stack.judges.chat = DownJudge()
    try:
        assert await run.collect(2) == []
    finally:
        stack.judges.chat = stack.judge
    assert run.stats["groups_dropped:judge_unavailable"] == 2


@on_module_loop
async def test_prefiltered_episodes_stay_out_of_the_group(stack: Stack) -> None:
    rm = CallablePreFilter(reversal_model)
    run = collector(
        stack,
        ["hcrib", "zzzzz", "hcrix", "hcrib"],
        prefilter=rm,
        drop_below=0.3,
        group_scorer="ranking",
    )
    groups = await run.collect(2)
    assert len(groups) == 2
    for traj in (t for g in groups for t in g.trajectories):
        state = await stack.manager.state(traj.episode_id)
        if traj.prefiltered:
            assert traj.reward == 0.0 and state.group_reward is None
        else:
            assert state.group_reward is not None and traj.reward == state.group_reward.reward


@on_module_loop
async def test_judge_prefilter_sees_the_public_task_only(stack: Stack) -> None:
    task = "Submit the word 'birch' in reverse order of its letters."
    prefilter = JudgePreFilter(stack.judge, RUBRIC, JudgeConfig(judge=JUDGE))
    assert await prefilter.score(task, "hcrib") > await prefilter.score(task, "zzzzz")
    wrong = stack.fake.prompts[-1]
    assert "zzzzz" in wrong and "hcrib" not in wrong  # no reference reaches the judge
    down = JudgePreFilter(DownJudge(), RUBRIC, JudgeConfig(judge=JUDGE))
    assert await down.score(task, "zzzzz") == math.inf and down.unavailable == 1  # kept
