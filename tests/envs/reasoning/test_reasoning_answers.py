"""Numbers and labels judged one canonical way (issue 31, invariant 4) on the reasoning pack.

Non-finite numbers, wrong numbers in other digit forms, labels in markup or several at once
and puzzle grids filled by a rule score 0 with a failure that names them; the right answer
in every documented form (packs/reasoning-gym/README.md, "Answers") scores 1; a constant
label earns at most 1/k + 0.05 on every label domain. Scored through the family's own `score_answer`
(reasoning-gym's scorers behind the canonical form and the guards), and once through a real
episode.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from palaestra.envs.reasoning import canon, cheats, gym, skew
from palaestra.envs.reasoning.family import ReasoningFamily, score_answer
from palaestra.sdk.task import Task
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack

FLOOR = 0.1
PUZZLES = ("sudoku", "mini_sudoku", "futoshiki")


@pytest.fixture(scope="module")
def pack_tasks() -> list[Task]:
    pack = load_pack(Path(__file__).resolve().parents[3] / "packs" / "reasoning-gym")
    return sorted(pack.tasks.values(), key=lambda t: t.id)


@pytest.fixture(scope="module")
def sample(pack_tasks: list[Task]) -> list[Task]:
    """Two training tasks and one held-out task of every domain."""
    chosen: dict[tuple[str, str], list[Task]] = {}
    for task in pack_tasks:
        got = chosen.setdefault((task.domain, task.split), [])
        if len(got) < (2 if task.split == "train" else 1):
            got.append(task)
    return [t for ts in chosen.values() for t in ts]


def of(tasks: list[Task], dataset: str) -> list[Task]:
    return [t for t in tasks if t.private["dataset"] == dataset]


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-Infinity", "1e999", "**nan**", "ｉｎｆ"])
def test_nonfinite_numbers_score_zero_everywhere(sample: list[Task], text: str) -> None:
    """complex_arithmetic's scorer paid 1.0 for "nan" and "inf" (its distance is NaN)."""
    over = {}
    for task in sample:
        scored = score_answer(task, text)
        if scored.reward > 0.0 or scored.failure != "nonfinite_number":
            over[task.id] = (scored.reward, scored.failure)
    assert not over, over


def test_wrong_numbers_in_other_digit_forms_score_zero(sample: list[Task]) -> None:
    """A wrong number in full-width, Arabic-Indic, grouped or underscored digits is refused
    like the ASCII one (coin_flip paid 1.0 for one of them)."""
    over, played = {}, 0
    for task in sample:
        for name, text in cheats.digit_cheats(str(task.private["answer"])):
            played += 1
            reward = score_answer(task, text).reward
            if reward > 0.0:
                over[f"{name} on {task.id}"] = reward
    assert played >= 100 and not over, over


def test_right_numbers_in_documented_forms_score_one(sample: list[Task]) -> None:
    """The right number in full-width or Arabic-Indic digits, with thousands commas, in
    markup, or as another decimal of the same value scores what the number itself does."""
    checked = 0
    for task in sample:
        answer = str(task.private["answer"]).strip()
        if task.private["dataset"] in canon.LABEL_SETS:  # "0" is a label there, "0.0" is not
            continue
        if not canon.DECIMAL.match(answer) or score_answer(task, answer).reward < 1.0:
            continue
        forms = [
            answer.translate(cheats.FULLWIDTH),
            answer.translate(cheats.ARABIC_INDIC),
            f"**{answer}**",
            f"\\boxed{{{answer}}}",
            f"+{answer}" if not answer.startswith("-") else answer,
        ]
        if "." not in answer and "e" not in answer.lower():
            forms += [cheats._grouped(answer), f"{answer}.0"]
        for form in forms:
            scored = score_answer(task, form)
            assert scored.reward == 1.0, (task.id, form, scored.feedback)
        checked += 1
    assert checked >= 40


def test_labels_in_any_form_count_and_several_labels_are_wrong(sample: list[Task]) -> None:
    """On every label dataset: the right label in markup, quoted, with punctuation or in
    another case scores 1.0 (it was paid 0.4-0.8); every label at once scores 0 (it was paid
    0.3-0.6); a wrong label in markup scores 0."""
    for dataset, labels in canon.LABEL_SETS.items():
        tasks = of(sample, dataset)
        assert tasks, dataset
        for task in tasks:
            answer = str(task.private["answer"])
            for form in [f"**{answer}**", f"\\boxed{{{answer}}}", f"{answer}.", f"'{answer}'"]:
                assert score_answer(task, form).reward == 1.0, (task.id, form)
                assert score_answer(task, form.upper()).reward == 1.0, (task.id, form.upper())
            for sep in ("/", " and ", " or ", ", ", "\n"):
                scored = score_answer(task, sep.join(labels))
                assert scored.reward == 0.0 and scored.failure == "several_labels", (task.id, sep)
            for wrong in (lb for lb in labels if lb != answer):
                scored = score_answer(task, f"**{wrong}**")
                assert scored.reward == 0.0, (task.id, wrong)
            assert score_answer(task, f"the answer is {answer}").failure == "not_a_label"


def test_a_signed_number_is_not_a_digit_label() -> None:
    """The label fold drops punctuation, but not a number's sign: "-1" on a 0/1 dataset is
    not the label "1" (the generic library's constant "-1" scored 1.0 on circuit_logic)."""
    assert canon.label("circuit_logic", "-1").failure == "not_a_label"
    assert canon.label("circuit_logic", "\u22121").failure == "not_a_label"
    for form in ("1", "**1**", "(1)", "1.", "\\boxed{1}"):
        assert canon.label("circuit_logic", form).text == "1", form


@pytest.mark.parametrize("dataset", PUZZLES)
def test_grids_filled_by_a_rule_score_zero(sample: list[Task], dataset: str) -> None:
    """A grid whose blanks hold one digit, or a cyclic pattern, kept the givens and was paid
    0.3-0.8 of partial credit; it breaks the puzzle's rules and now scores 0."""
    for task in of(sample, dataset):
        question, answer = task.public["question"], str(task.private["answer"])
        fills = dict(cheats.grid_cheats(question, answer))
        assert set(fills) == {"grid-const", "grid-pattern"}, task.id
        for name, text in fills.items():
            scored = score_answer(task, text)
            assert scored.reward == 0.0 and scored.failure == "breaks_rules", (task.id, name)
        assert score_answer(task, answer).reward == 1.0


def test_game_of_life_pays_only_the_simulated_board(pack_tasks: list[Task]) -> None:
    """A dead board earned most cells of a sparse next board; any other board is wrong."""
    import json

    checked = 0
    for task in of(pack_tasks, "game_of_life"):
        board = json.loads(task.private["answer"])
        if not any(any(row) for row in board):
            continue
        dead = json.dumps([[0] * len(row) for row in board]).replace(" ", "")
        scored = score_answer(task, dead)
        assert scored.reward == 0.0 and scored.failure == "breaks_rules", task.id
        checked += 1
    assert checked


def test_a_constant_label_earns_at_most_its_share(pack_tasks: list[Task]) -> None:
    """Every label dataset, every label submitted on every task of the domain, each split
    and both together: mean ≤ 1/k + 0.05 (syllogism's "Yes" earned 0.89)."""
    over = {}
    for dataset, labels in canon.LABEL_SETS.items():
        tasks = of(pack_tasks, dataset)
        limit = 1 / len(labels) + 0.05
        for part in ("train", "heldout", "all"):
            chosen = [t for t in tasks if part in ("all", t.split)]
            assert chosen, (dataset, part)
            for label in labels:
                mean = statistics.fmean(score_answer(t, label).reward for t in chosen)
                if mean > limit + 1e-9:
                    over[f"{dataset}/{part}={label}"] = round(mean, 3)
    assert not over, over


def test_answer_form_cheats_are_family_cheats(sample: list[Task]) -> None:
    """`pack check` plays them: every kind is among the family's cheats and ≤ 0.1."""
    family = ReasoningFamily()
    kinds: set[str] = set()
    over = {}
    for task in sample:
        for name, actions in family.cheats(task):
            for kind in ("nonfinite", "label-markup", "label-combo", "digits", "grid-"):
                if name.startswith(kind):
                    kinds.add(kind)
            reward = score_answer(task, actions[0].arguments.get("answer")).reward
            if reward > FLOOR:
                over[f"{name} on {task.id}"] = reward
    assert kinds == {"nonfinite", "label-markup", "label-combo", "digits", "grid-"}
    assert not over, over


async def test_refused_answer_is_an_ok_zero_with_its_class(
    manager: EpisodeManager, pack_tasks: list[Task]
) -> None:
    task = next(t for t in pack_tasks if t.private["dataset"] == "course_schedule")
    client = AsyncInProcessClient(manager)
    for text, failure in [("True/False", "several_labels"), ("nan", "nonfinite_number")]:
        reset = await client.reset(task.ref)
        final = await client.step(
            reset.episode_id, {"tool": "submit", "arguments": {"answer": text}}
        )
        verdict = final.info["verdict"]
        assert verdict["status"] == "ok" and final.reward == 0.0, verdict
        assert verdict["failure"] == failure, verdict


# -- null-information play (issue 31, invariants 4 and 8) ---------------------------------
def by_domain(tasks: list[Task]) -> dict[str, list[Task]]:
    out: dict[str, list[Task]] = {}
    for task in tasks:
        out.setdefault(task.domain, []).append(task)
    return out


@pytest.mark.slow
def test_no_constant_earns_more_than_its_share_on_any_domain(pack_tasks: list[Task]) -> None:
    """Each domain's most common training answers (and labels), submitted on every task of
    the domain: mean ≤ 1/k + 0.05 for k distinct answers (game_of_life's dead board earned
    0.67, puzzle24's one expression 1.0, shortest_path's "infeasible" 0.5; pack 1.3.0:
    every domain, polynomial_equations' "0.0, x" 0.17 and calendar_arithmetic's weekday
    0.16 included)."""
    over = {}
    for domain, tasks in sorted(by_domain(pack_tasks).items()):
        play = skew.best_constant(tasks, lambda t, text: score_answer(t, text).reward)
        if play.over:
            over[domain] = (play.constant[:30], round(play.mean, 3), round(play.limit, 3))
    assert not over, over


def test_puzzle24_expression_must_use_the_puzzles_numbers(pack_tasks: list[Task]) -> None:
    """puzzle24's scorer paid 1.0 for any expression of four in-range numbers making 24."""
    tasks = of(pack_tasks, "puzzle24")
    other = next(
        t
        for t in tasks
        if sorted(t.private["metadata"]["numbers"])
        != sorted(tasks[0].private["metadata"]["numbers"])
    )
    scored = score_answer(other, str(tasks[0].private["answer"]))
    assert scored.reward == 0.0 and scored.failure == "breaks_rules", scored
    assert score_answer(other, str(other.private["answer"])).reward == 1.0


def test_time_intervals_pays_only_the_exact_duration(pack_tasks: list[Task]) -> None:
    """Closeness credit (1 - diff / a day) paid one constant duration 0.3 a task."""
    checked = 0
    for task in of(pack_tasks, "time_intervals"):
        answer = str(task.private["answer"])
        if not answer[-1:].isdigit() or ":" not in answer or "day" in answer:
            continue
        near = answer[:-1] + str((int(answer[-1]) + 1) % 10)  # a second or a minute off
        p = task.private
        if gym.score(p["dataset"], p["level"], p["seed"], p["size"], p["index"], near) <= 0:
            continue  # reasoning-gym's own scorer pays nothing for it either
        scored = score_answer(task, near)
        assert scored.reward == 0.0 and scored.failure == "breaks_rules", (task.id, near)
        assert score_answer(task, answer).reward == 1.0
        checked += 1
    assert checked


def test_common_answers_are_family_cheats(pack_tasks: list[Task], sample: list[Task]) -> None:
    """`pack check` plays null-information: each task carries its domain's most common
    training answers, and each one that is not the task's own answer is a family cheat
    that earns ≤ 0.1 there."""
    family = ReasoningFamily()
    assert all(t.private.get("common_answers") for t in pack_tasks)
    played, over = 0, {}
    for task in sample:
        for name, actions in family.cheats(task):
            if not name.startswith("common-answer-"):
                continue
            played += 1
            reward = score_answer(task, actions[0].arguments["answer"]).reward
            if reward > FLOOR:
                over[f"{name} on {task.id}"] = reward
    assert played >= 2 * len(by_domain(sample)) and not over, over


@pytest.mark.parametrize(
    "dataset,wrong",
    [
        ("calendar_arithmetic", "weekday"),  # 0.1 for any weekday, 0.05 in another case
        ("figlet_font", "letters"),  # 0.1 a letter in place
        ("color_cube_rotation", "colour"),  # 0.01 for any other answer
    ],
)
def test_format_credit_is_not_paid(pack_tasks: list[Task], dataset: str, wrong: str) -> None:
    """A wrong answer of the right kind earned format credit on every task; it scores 0
    (`breaks_rules`), and the answer in another case still scores 1."""
    checked = 0
    for task in of(pack_tasks, dataset):
        answer = str(task.private["answer"])
        if wrong == "weekday" and not answer.endswith("day"):
            continue
        near = {
            "weekday": "Monday" if answer != "Monday" else "Tuesday",
            "letters": answer[:-1] + ("A" if answer[-1] != "A" else "B"),
            "colour": "red" if answer != "red" else "blue",
        }[wrong]
        scored = score_answer(task, near)
        assert scored.reward == 0.0 and scored.failure == "breaks_rules", (task.id, near)
        for form in (answer, answer.lower(), answer.upper()):
            assert score_answer(task, form).reward == 1.0, (task.id, form)
        checked += 1
    assert checked


def test_polynomial_roots_pay_only_every_root(pack_tasks: list[Task]) -> None:
    """Partial credit per root paid "0.0, x" on every equation with the root 0: a root list
    pays only with as many roots as the equation has, each close to its own."""
    checked = 0
    for task in of(pack_tasks, "polynomial_equations"):
        roots = [float(r) for r in task.private["metadata"]["real_solutions"]]
        if not roots:
            continue
        if len(roots) > 1:  # (one number close to the answer is not the answer: guard.py)
            close = ", ".join(f"{r + 1e-4:.5f}" for r in roots)  # each root, one more digit
            assert score_answer(task, close).reward > 0.99, (task.id, close)
            scored = score_answer(task, str(roots[0]))
            assert scored.reward == 0.0 and scored.failure == "breaks_rules", task.id
        extra = ", ".join(str(r) for r in [*roots, 7.5])
        scored = score_answer(task, extra)
        assert scored.reward == 0.0 and scored.failure == "breaks_rules", (task.id, extra)
        shifted = ", ".join(str(r) for r in [*roots[:-1], roots[-1] + 0.5])
        scored = score_answer(task, shifted)
        assert scored.reward == 0.0 and scored.failure == "breaks_rules", (task.id, shifted)
        checked += 1
    assert checked
