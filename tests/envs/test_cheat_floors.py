"""Cheat floors of the cad, finance and reasoning families: every known cheat ≤ 0.1.

Each cheat is one of the family's `cheats()` (what `palaestra pack check` plays on every
pack, built-in and imported); here they are scored in-process by the family's own scoring
function, on every domain, so the floors hold across the pack and not on one sample.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from palaestra.envs.cad import cheats as cad_cheats
from palaestra.envs.cad.family import CadFamily, score_mesh
from palaestra.envs.cad.tasks import OUTPUT, PARAMS_FILE
from palaestra.envs.finance.family import FinanceFamily, variant_of
from palaestra.envs.finance.importer import import_file
from palaestra.envs.reasoning import guard, gym
from palaestra.envs.reasoning.family import ReasoningFamily, score_task
from palaestra.sdk.models import Action
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS
from palaestra.server.packs.loader import load_pack
from palaestra.verifiers import finance as vf

FLOOR = 0.1
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def first_per_domain(pack: str, per_domain: int = 1, split: str = "train") -> list[Task]:
    chosen: dict[str, list[Task]] = {}
    for task in sorted(load_pack(REPO_PACKS / pack).tasks.values(), key=lambda t: t.id):
        if task.split == split and len(chosen.setdefault(task.domain, [])) < per_domain:
            chosen[task.domain].append(task)
    return [t for ts in chosen.values() for t in ts]


# -- cad -------------------------------------------------------------------------------------------
CAD_CHEATS = {
    "needle-block",
    "convex-hull",
    "needle-hull",
    "voxel-blob",
    "scaled-1.05",
    "scaled-0.95",
    "stretched-x-1.05",
    "mirrored",
    "bounding-box",
    "without-feature",
    "scaled-copy",
}


def run_cad_script(actions: list[Action], params: dict[str, Any], work: Path) -> bytes | None:
    """The script of a cheat's actions, run in-process in `work` (as the sandbox would)."""
    script = ""
    for action in actions:
        if action.tool == "write_file":
            (work / action.arguments["path"]).write_text(action.arguments["content"])
            script = action.arguments["content"]
    (work / PARAMS_FILE).write_text(json.dumps(params))
    (work / OUTPUT).unlink(missing_ok=True)
    exec(compile(script, "part.py", "exec"), {"__name__": "__main__"})
    out = work / OUTPUT
    return out.read_bytes() if out.exists() else None


@pytest.fixture(scope="module")
def cad_tasks() -> list[Task]:
    return first_per_domain("cad")


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~130 meshes built and scored; a loaded 2-core machine is slow
def test_cad_cheats_at_most_the_floor(
    cad_tasks: list[Task], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Needle-hole blocks and hulls, convex hulls, voxel blobs of the right bounding box,
    scaled, stretched and mirrored parts: ≤ 0.1 in every domain; the oracle 1.0."""
    monkeypatch.chdir(tmp_path)
    family = CadFamily()
    seen: set[str] = set()
    worst: dict[str, float] = {}
    for task in cad_tasks:
        domain, params = task.private["domain"], task.private["params"]
        oracle = run_cad_script(family.oracle(task), params, tmp_path)
        assert oracle is not None and score_mesh(domain, params, oracle).reward == 1.0, task.id
        for name, actions in family.cheats(task):
            if name not in CAD_CHEATS:
                continue
            seen.add(name)
            data = run_cad_script(actions, params, tmp_path)
            assert data is not None, (task.id, name)
            report = score_mesh(domain, params, data)
            if report.reward > FLOOR:
                worst[f"{name} on {task.id}"] = report.reward
    assert not worst, worst
    assert seen == CAD_CHEATS  # mirrored: at least one domain's part is asymmetric


def test_fidelity_is_gated_not_only_the_probes(
    cad_tasks: list[Task], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A needle-hole block of a plate has the right topology and passes every probe (what
    scored 0.73 before): the fill gate, the share of the holes it fills, holds it at 0."""
    monkeypatch.chdir(tmp_path)
    task = next(t for t in cad_tasks if t.private["domain"] == "plate")
    actions = dict(CadFamily().cheats(task))["needle-block"]
    data = run_cad_script(actions, task.private["params"], tmp_path)
    assert data is not None
    report = score_mesh("plate", task.private["params"], data)
    assert report.components["topology"] == 1.0 and report.components["features"] == 1.0
    assert report.components["fill_gate"] == 0.0 and report.reward == 0.0
    assert "fills" in report.feedback


def test_mirror_cheat_only_where_the_mirror_is_another_part(cad_tasks: list[Task]) -> None:
    by_domain = {t.private["domain"]: t for t in cad_tasks}
    assert not cad_cheats.mirror_is_another_part(by_domain["hexnut"])  # symmetric
    assert cad_cheats.mirror_is_another_part(by_domain["bracket"])  # an L


# -- finance ---------------------------------------------------------------------------------------
PROGRAM_CHEATS = {"constants-only", "figure-plus-constants", "zeroed-operands"}


def grade_all(task: Task, family: FinanceFamily) -> list[tuple[str, vf.Grade]]:
    gold = vf.Gold.from_json(task.private["gold"])
    numbers = family._numbers(task)
    variant = variant_of(task, gold)
    question = str(task.public.get("question", ""))
    plays = [("oracle", family.oracle(task)), *family.cheats(task)]
    return [
        (name, vf.grade(vf.Answer(**a[0].arguments), gold, numbers, variant, question))
        for name, a in plays
    ]


def check_finance(tasks: list[Task]) -> set[str]:
    family = FinanceFamily()
    seen: set[str] = set()
    for task in tasks:
        for name, graded in grade_all(task, family):
            if name == "oracle":
                assert graded.reward == 1.0, (task.id, graded.feedback)
                continue
            seen.add(name)
            assert graded.reward <= vf.VALUE_ONLY_REWARD, (task.id, name, graded.feedback)
            if name in PROGRAM_CHEATS:
                assert graded.components == {"value": 1.0, "program": 0.0, "grounded": 0.0}
    return seen


def test_finance_program_cheats_on_every_domain_and_level() -> None:
    """A right value from constants, from an unrelated figure, or from the question's own
    cells times zero: the program part is 0, the reward VALUE_ONLY_REWARD."""
    tasks = [t for t in first_per_domain("finance", 3)]
    assert len({t.domain for t in tasks}) == 10
    assert check_finance(tasks) >= PROGRAM_CHEATS


@pytest.mark.parametrize("fixture", ["finqa/finqa.json", "tatqa-real/tatqa_dev_sample.json"])
def test_finance_program_cheats_on_imported_packs(tmp_path: Path, fixture: str) -> None:
    """Imported documents cannot be regenerated: the perturbed-document check decides."""
    import_file(FIXTURES / fixture, tmp_path / "pack", "acme/finqa", "train")
    tasks = sorted(load_pack(tmp_path / "pack").tasks.values(), key=lambda t: t.id)
    tasks = [t for t in tasks if t.private["gold"].get("kind") != "text"]  # no program
    assert PROGRAM_CHEATS & check_finance(tasks)


def _toy() -> tuple[vf.Gold, vf.Numbers]:
    gold = vf.Gold(kind="ratio", value=0.5, decimals=2, scale="units", program="divide(2500, 5000)")
    return gold, vf.Numbers(figures={"a": 2500.0, "b": 5000.0, "c": 7777.0})


def test_only_finqas_small_constants_and_the_stated_counts() -> None:
    gold, numbers = _toy()

    def program_ok(program: str, question: str = "") -> float:
        answer = vf.Answer(value=0.5, unit="ratio", program=program)
        return vf.grade(answer, gold, numbers, None, question).components["program"]

    assert program_ok("divide(2500, 5000)") == 1.0
    assert program_ok("divide(2500, 5000), multiply(#0, const_1)") == 1.0
    # const_7 is not in FinQA's small set, and the question does not state 7 ...
    assert program_ok("divide(2500, 5000), multiply(#0, const_7), divide(#1, const_7)") == 0.0
    # ... unless it does ("seven-year", "7 years").
    stated = "divide(2500, 5000), multiply(#0, const_7), divide(#1, const_7)"
    assert program_ok(stated, "over seven years") == 1.0
    assert program_ok(stated, "the 7-year average") == 1.0


def test_allowed_constants_alone_do_not_make_a_program() -> None:
    """Only allowed constants and a printed figure that cancels out: the value is right, the
    program is not (the perturbed document shows that it ignores the question's cells)."""
    gold, numbers = _toy()
    program = "subtract(7777, 7777), divide(const_1, const_2), add(#0, #1)"
    graded = vf.grade(vf.Answer(value=0.5, unit="ratio", program=program), gold, numbers)
    assert graded.components["program"] == 0.0
    assert graded.reward == vf.VALUE_ONLY_REWARD <= FLOOR
    # ... and the instruction of every generated task says what a value alone earns.
    task = first_per_domain("finance", 1)[0]
    assert f"{vf.VALUE_ONLY_REWARD} for the right value alone" in task.public["instruction"]
    # The right cells in another but equivalent form are a program.
    other = "divide(5000, 2500), divide(const_1, #0)"
    assert vf.grade(vf.Answer(value=0.5, unit="ratio", program=other), gold, numbers).reward == 1


# -- reasoning -------------------------------------------------------------------------------------
ECHO = {"echo-question", "echo-last-line", "echo-grid", "echo-list"}


@pytest.fixture(scope="module")
def reasoning_tasks() -> list[Task]:
    return first_per_domain("reasoning-gym", 2) + first_per_domain("reasoning-gym", 1, "heldout")


def test_degenerate_set_on_every_domain(reasoning_tasks: list[Task]) -> None:
    """Fixed labels, pieces of the expected answer, the input sent back, numbers near the
    answer: ≤ 0.1 on every domain, unless the dataset's scorer calls the answer fully right
    and it is another form of it ('0' for '0 days', a float within the stated tolerance),
    which is never an echo nor a number off by more than `guard.NUMBER_REL_TOL`."""
    domains = {t.domain for t in reasoning_tasks}
    assert len(domains) >= 100
    over: dict[str, float] = {}
    for task in reasoning_tasks:
        question, answer = task.public["question"], str(task.private["answer"])
        for name, text in guard.degenerate_answers(question, answer):
            reward = score_task(task, text)[0]
            if reward <= FLOOR:
                continue
            near = name.startswith("near-") and abs(float(text) - float(answer)) > (
                guard.NUMBER_REL_TOL * max(1.0, abs(float(answer)))
            )  # a number within the stated precision (3 significant figures) is the answer
            if reward < 1.0 or name in ECHO or near:
                over[f"{name} on {task.id}"] = reward
    assert not over, over


def test_family_cheats_at_most_the_floor(reasoning_tasks: list[Task]) -> None:
    family = ReasoningFamily()
    over = {}
    for task in reasoning_tasks:
        for name, actions in family.cheats(task):
            reward = score_task(task, actions[0].arguments.get("answer"))[0]
            if reward > FLOOR:
                over[f"{name} on {task.id}"] = reward
    assert not over, over


def sokoban_echo_task(like: Task) -> Task:
    """sokoban hard entry 0 of (seed 1000000, size 6), a task of pack 1.1.0: reasoning-gym's
    scorer solves it with its own question sent back (the draws since 1.2.0 hold no such task)."""
    rebuild = ("sokoban", "hard", 1_000_000, 6, 0)
    entry = gym.entry(*rebuild)
    private = {**like.private, "level": "hard", "seed": 1_000_000, "size": 6, "index": 0}
    private |= {"answer": entry["answer"], "metadata": {}}
    public = {**like.public, "question": entry["question"]}
    assert gym.score(*rebuild, entry["question"]) == 1.0
    return dataclasses.replace(like, id="sokoban.hard.echo", public=public, private=private)


@pytest.mark.parametrize(
    "dataset,answer,why",
    [
        ("game_of_life_halting", "no", "labels"),  # bool("no") == bool("False")
        ("coin_flip", "0", "not the answer"),  # a prefix of 0.375 scored 1.0
        ("rectangle_count", "+1", "not the answer"),  # one off scored 0.64
        ("spell_backward", "prefix", "spelled backward"),  # 0.667
        ("sokoban", "question", "characters"),  # the question sent back solves it
        ("basic_arithmetic", "question", "sent back"),  # len(answer)/len(text)
    ],
)
def test_guard_refuses_what_the_scorers_paid_for(
    reasoning_tasks: list[Task], dataset: str, answer: str, why: str
) -> None:
    task = next(
        t
        for t in reasoning_tasks
        if t.private["dataset"] == dataset
        and (dataset != "coin_flip" or "." in str(t.private["answer"]))
    )
    if dataset == "sokoban":
        task = sokoban_echo_task(task)
    expected = str(task.private["answer"])
    if answer == "question":
        answer = task.public["question"]
    elif answer == "prefix":
        answer = expected[:-1]
    elif answer == "+1":
        answer = str(int(expected) + 1)
    reward, feedback = score_task(task, answer)
    assert reward == 0.0 and why in feedback, (answer, feedback)
    assert score_task(task, expected)[0] == 1.0
