"""The `reasoning` family and the reasoning/gym pack: reasoning-gym's datasets, its scores.

Our verdicts must equal reasoning-gym's own `score_answer` on its own entries; the oracle
scores 1 and the null agent 0 through the real episode path; held-out seeds never overlap
training seeds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from palaestra.envs.reasoning import canon, constraints, guard, gym
from palaestra.envs.reasoning.family import ReasoningFamily, score_task
from palaestra.sdk.evaluation.runner import run_eval
from palaestra.sdk.models import TaskInfo
from palaestra.sdk.policies.base import NullPolicy, OraclePolicy
from palaestra.sdk.task import Task
from palaestra.server.families import FamilyRegistry
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack

PACK = "reasoning/gym"
BIN = Path(sys.executable).parent
NOT_REPRODUCIBLE: set[str] = set()  # filled by their_scores; expected {codeio, ...}
# Their own scorers give these a high score for the question sent back; the guard refuses it.
CHEAT_PRONE = {
    "reasoning/game_of_life_halting",
    "reasoning/basic_arithmetic",
    "reasoning/sokoban",
}


@pytest.fixture(scope="module")
def pack_tasks() -> list[Task]:
    pack = load_pack(Path(__file__).resolve().parents[3] / "packs" / "reasoning-gym")
    assert pack.name == PACK
    return sorted(pack.tasks.values(), key=lambda t: t.id)


def by_domain(tasks: list[Task]) -> dict[str, list[Task]]:
    out: dict[str, list[Task]] = {}
    for task in tasks:
        out.setdefault(task.domain, []).append(task)
    return out


def their_scores(task: Task, answers: list[str]) -> list[float]:
    """reasoning-gym's own score: a fresh dataset object, its own entry, its own scorer."""
    import reasoning_gym

    p = task.private
    config = gym.config_for(p["dataset"], p["level"], p["seed"], p["size"])
    dataset = reasoning_gym.create_dataset(p["dataset"], **config)
    entry = dataset[p["index"]]
    if (entry["question"], entry["answer"]) != (task.public["question"], p["answer"]):
        # Not reproducible (codeio): the stored entry is what was served and is scored.
        NOT_REPRODUCIBLE.add(p["dataset"])
        entry = {
            "question": task.public["question"],
            "answer": p["answer"],
            "metadata": p["metadata"],
        }
    assert entry["answer"] == p["answer"]
    scores = []
    for a in answers:
        try:
            scores.append(float(dataset.score_answer(answer=a, entry=entry)))
        except Exception:  # their scorer raised on this answer: ours gives 0
            scores.append(0.0)
    return scores


def test_pack_has_at_least_100_domains(pack_tasks: list[Task]) -> None:
    domains = by_domain(pack_tasks)
    assert len(domains) >= 100, len(domains)
    assert all(d.startswith("reasoning/") for d in domains)
    assert {t.family for t in pack_tasks} == {"reasoning"}
    assert {t.difficulty for t in pack_tasks} <= {"easy", "medium", "hard", "default"}
    for domain, tasks in domains.items():
        assert {t.split for t in tasks} == {"train", "heldout"}, domain
        assert all(t.private["dataset"] == domain.split("/", 1)[1] for t in tasks)


def test_heldout_seeds_never_in_training(pack_tasks: list[Task]) -> None:
    train = [t for t in pack_tasks if t.split == "train"]
    heldout = [t for t in pack_tasks if t.split == "heldout"]
    assert heldout and train
    assert all(t.sealed for t in heldout) and not any(t.sealed for t in train)
    for task in pack_tasks:
        p = task.private
        assert p["item_seed"] == p["seed"] + p["index"] and 0 <= p["index"] < p["size"]
    # Per dataset and level, the seed ranges the two splits draw from are disjoint.
    assert max(t.private["item_seed"] for t in train) < 2**30
    assert min(t.private["item_seed"] for t in heldout) >= 2**30
    for tasks in by_domain(pack_tasks).values():
        train_q = {t.public["question"] for t in tasks if t.split == "train"}
        assert not any(t.public["question"] in train_q for t in tasks if t.split == "heldout")


@pytest.mark.slow
def test_scores_equal_reasoning_gyms_own(pack_tasks: list[Task]) -> None:
    """Every domain, a train and a held-out entry: oracle, wrong, near-miss, empty answers.

    Ours is reasoning-gym's own score, except where the degenerate-answer guard refuses the
    answer (a piece of the expected answer, a fixed label, a number that is not the answer),
    the canonical form refuses it (several labels, not a label, not finite) or it breaks the
    puzzle's rules: then it is 0. The answer itself is never refused."""
    checked, refused = 0, 0
    for domain, tasks in sorted(by_domain(pack_tasks).items()):
        sample = [next(t for t in tasks if t.split == s) for s in ("train", "heldout")]
        for task in sample:
            answer = str(task.private["answer"])
            question = task.public["question"]
            candidates = [answer, "0", "wrong answer", answer[:-1], answer + " 1", ""]
            for candidate, theirs in zip(candidates, their_scores(task, candidates), strict=True):
                ours, feedback = score_task(task, candidate)
                dataset = task.private["dataset"]
                form = canon.canonical(dataset, candidate, answer)
                if form.refused is not None:  # a form no scorer sees (canon.py): 0
                    expected, why = 0.0, form.refused
                elif form.text != candidate:  # another form of the candidate: scored as it
                    expected, why = score_task(task, form.text)[0], None
                else:
                    theirs = min(1.0, max(0.0, theirs))
                    if 0 < theirs < 1 and constraints.breaks(
                        dataset, candidate, task.private["metadata"]
                    ):
                        theirs = 0.0  # breaks the puzzle's rules: no partial credit
                    expected, why = guard.guarded(dataset, theirs, candidate, question, answer)
                if candidate == answer:
                    assert why is None, (domain, task.id, candidate, why)
                refused += why is not None and theirs > 0
                assert ours == pytest.approx(expected, abs=1e-12), (domain, task.id, candidate)
                if ours < 1.0 and len(answer) >= 4:
                    assert answer not in feedback
                checked += 1
            assert score_task(task, answer)[0] == 1.0, (domain, task.id)
    assert checked >= 100 * 2 * 6
    assert refused < checked / 10, refused  # the guard is narrow: most pairs agree as they are
    assert len(NOT_REPRODUCIBLE) <= 10, NOT_REPRODUCIBLE


async def test_oracle_and_null_through_episodes(manager: EpisodeManager) -> None:
    """Two tasks of every domain (one per split) through the episode manager."""
    client = AsyncInProcessClient(manager)
    chosen: list[TaskInfo] = []
    # The server's own tasks: its held-out split is drawn with its secret (the module's
    # `pack_tasks`, loaded without one, hold the public held-out draw).
    served = list(manager.packs.select(pack="reasoning/gym"))
    for tasks in by_domain(served).values():
        for split in ("train", "heldout"):
            chosen.append(next(t for t in tasks if t.split == split).info())
    oracle = await run_eval(client, OraclePolicy(), chosen, concurrency=8)
    bad = [(a.task, a.status, a.reward, a.error) for a in oracle if not a.passed]
    assert not bad, bad
    assert all(a.reward == 1.0 and a.components == {"score": 1.0} for a in oracle)
    null = await run_eval(client, NullPolicy(), chosen, concurrency=8)
    assert all(a.status == "ok" and a.reward == 0.0 and not a.passed for a in null), [
        (a.task, a.status, a.reward) for a in null if a.reward != 0.0 or a.status != "ok"
    ]


async def test_episode_observation_tools_and_feedback(
    manager: EpisodeManager, pack_tasks: list[Task]
) -> None:
    task = next(t for t in pack_tasks if t.domain == "reasoning/basic_arithmetic")
    client = AsyncInProcessClient(manager)
    reset = await client.reset(task.ref)
    assert reset.observation.text == task.public["question"]
    assert {t.name for t in reset.tools} == {"think", "submit"}
    step = await client.step(reset.episode_id, {"tool": "think", "arguments": {"note": "hmm"}})
    assert not step.terminated
    final = await client.step(
        reset.episode_id, {"tool": "submit", "arguments": {"answer": "not a number"}}
    )
    assert final.terminated and final.reward == 0.0
    verdict = final.info["verdict"]
    assert verdict["status"] == "ok" and not verdict["passed"]
    assert verdict["verifier"]["name"] == "reasoning-gym"
    assert task.private["answer"] not in verdict["feedback"]


@pytest.mark.parametrize(
    "dataset",
    ["string_insertion", "n_queens", "puzzle24", "simple_integration", "polynomial_multiplication"],
)
def test_scorers_never_run_the_answer(pack_tasks: list[Task], dataset: str, tmp_path: Path) -> None:
    """Scorers that eval() or sympy-parse the answer get a literal/arithmetic-only parser."""
    task = next(t for t in pack_tasks if t.private["dataset"] == dataset)
    marker = tmp_path / "pwned"
    for evil in [
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
        f"[__import__('pathlib').Path({str(marker)!r}).touch()]",
        "9**9**9**9",
        "(9**99)**99",
    ]:
        reward, _ = score_task(task, evil)
        assert reward <= 0.05 and not marker.exists(), (dataset, evil)


def test_family_is_registered() -> None:
    registry = FamilyRegistry.discover()
    assert "reasoning" in registry
    family = registry.get("reasoning")
    assert isinstance(family, ReasoningFamily)
    result = subprocess.run(
        [str(BIN / "palaestra"), "families"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "reasoning" in result.stdout


def test_cheats_score_low(pack_tasks: list[Task]) -> None:
    """Every cheat of the family (the question sent back, the empty answer and the whole
    degenerate set) on a task of every domain, the three whose own scorers pay for the
    question sent back included."""
    family = ReasoningFamily()
    worst: dict[str, Any] = {}
    domains = by_domain(pack_tasks)
    assert set(domains) >= CHEAT_PRONE
    for domain, tasks in domains.items():
        task = tasks[0]
        for name, actions in family.cheats(task):
            reward, _ = score_task(task, actions[0].arguments.get("answer"))
            if reward > 0.1:
                worst[f"{name} on {domain}"] = reward
    assert not worst, worst
